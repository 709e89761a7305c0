// DeepSeek-V4 sparse decode, two paths (csrc/sparse/README.md, "DeepSeek-V4"):
// - fused (sm90, fp8_ds_mla pools, more than 32 heads): one kernel reads both pools' selected rows
//   once, dequantises them in shared memory and runs the attention on wgmma
//   (sm90/sparse_decode_sm90_v4.cu);
// - gather (every other case): the selected rows dequantised to bf16 and widened to the V3 latent
//   layout, then the V3 sparse decode. A V4 head is 512 wide and its value is the whole row: with
//   each gathered row written as [row | 64 zeros] and q as [q | 64 zeros], the V3 kernels' scores
//   (576 dims) are the V4 scores and their value (the first 512 dims) is the V4 value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/fast_divmod.h"
#include "sparse/sparse_decode.h"

namespace mla {

struct V4Pool {
  const void* __restrict__ cache;           // auto: bf16 [num_blocks, block_size, 512]; fp8_ds_mla: pages
  const int32_t* __restrict__ indices;      // [b, s_q, topk] int32 global slots, last dim contiguous
  const int32_t* __restrict__ lengths;      // [b] int32 (topk_length / extra_topk_length); may be nullptr
  int64_t stride_indices_b, stride_indices_s;
  int topk;                                 // 0: no such pool
  int64_t block_size;
  int64_t num_slots;                        // num_blocks * block_size
  int64_t stride_block_bytes;               // page stride
  int64_t stride_token_bytes;               // auto: row stride (fp8_ds_mla tokens are 576 bytes apart)
};

struct V4GatherParams {
  const void* __restrict__ q;               // [b, s_q, h_q, 512] bf16, strides below, last dim contiguous
  int64_t stride_q_b, stride_q_s, stride_q_h;
  V4Pool pool[2];                           // the main cache, then the extra (sliding-window) one
  bool ds_mla;                              // both pools fp8_ds_mla, else both bf16
  int b, s_q, h_q;
  void* __restrict__ q_wide;                // [b, s_q, h_q, 576] bf16, written: q then 64 zeros
  void* __restrict__ rows;                  // [b * s_q * K, 576] bf16, K = topk + extra topk: row r of
                                            // query token t = r / K, entry r % K (main, then extra)
  int32_t* __restrict__ row_index;          // [b, s_q, K]: r where the entry is valid, else -1
  cudaStream_t stream;
};

// One launch; rows of invalid entries are not written (never read: their index is -1).
void run_v4_gather(const V4GatherParams& params);

// The fused kernel's parameters: `sparse` holds what the V3 decode's plan and combine use (q is the
// 512-wide V4 q; out, lse, attn_sink, shapes, softmax scale, the split plan and its partials; topk =
// 64 x the tiles of both lists, main and extra each rounded up to 64-key tiles, which is what
// plan_sparse_decode splits), `pool` the two caches (fp8_ds_mla pages, 16-byte aligned bases).
struct V4FusedParams {
  SparseDecodeParams sparse;
  V4Pool pool[2];
  FastDivmod block_div[2];  // the pools' block_size (set by run_sparse_decode_v4_fused)
};

// Whether this device runs the fused kernel for h_q heads of fp8_ds_mla pools (sm90a, not forced
// portable, more than 32 heads: smaller head counts keep their own tiles on the gather path).
bool v4_fused_supported(int device, int h_q);
// Launches the fused kernel and, for a split plan (plan_sparse_decode ran on p.sparse), the combine.
void run_sparse_decode_v4_fused(const V4FusedParams& params, int device);

}  // namespace mla
