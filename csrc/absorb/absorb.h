// Absorbed projections: q_absorb and v_up, batched-per-head GEMMs (see README.md here).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/types.h"

namespace mla {

inline constexpr int kQkNopeHeadDim = 128;  // P
inline constexpr int kVHeadDim = 128;       // V
inline constexpr int kWeightBlock = 128;    // fp8 block scales cover 128 x 128
inline constexpr int kNumLatentBlocks = kKvLoraRank / kWeightBlock;  // 4 scales per head

// Both ops are, per head h and token t:  c[t, h, n] = sum_k a[t, h, k] * B_h[k, n].
// The weight of every head is stored as one row-major [128, 512] matrix, the layout of its rows
// of kv_b_proj.weight (no transpose at preparation):
//   q_absorb: w = W_UK_T[h]  ([P=128 rows = k, L=512 cols = n]),   K = 128, N = 512
//   v_up:     w = W_UV[h]^T  ([V=128 rows = n, L=512 cols = k]),   K = 512, N = 128
// fp8 weights carry one scale per 128 of the 512 columns (the 128 rows are one block).
enum class AbsorbOp : int { kQAbsorb, kVUp };

struct AbsorbParams {
  const void* __restrict__ a;          // [T, H, K] bf16: q_nope (K=128) or the latent x (K=512)
  const void* __restrict__ w;          // [H, 128, 512] bf16 or e4m3, contiguous (see above)
  const float* __restrict__ w_scale;   // [H, 4] fp32 block scales (e4m3 w), else nullptr
  const void* __restrict__ q_pe;       // [T, H, 64] bf16 (q_absorb only), else nullptr
  void* __restrict__ c;                // [T, H, >= N] bf16: q_absorb out [.., 576], v_up out [.., 128]
  int64_t num_tokens;                  // T (>= 0)
  int64_t num_heads;                   // H (>= 1)
  int64_t stride_a_token, stride_a_head;        // elements; multiples of 8 (16-byte rows)
  int64_t stride_q_pe_token, stride_q_pe_head;  // elements; multiples of 8
  int64_t stride_c_token, stride_c_head;        // elements; multiples of 8
  AbsorbOp op;
  DType weight_dtype;                  // kBF16 or kFP8E4M3
  int device;
  cudaStream_t stream;
};

// One launch for any T (0 launches nothing); no host sync, no allocation (CUDA-graph safe).
// The caller (binding) checked shapes, dtypes and 16-byte alignment of every base and stride.
void run_absorb(const AbsorbParams& params);

}  // namespace mla
