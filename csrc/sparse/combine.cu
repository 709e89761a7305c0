// Split-over-topk combine: out = sum_i e^(lse_i - lse) out_i with lse = log sum_i e^lse_i.
// Grid: one warp per (b, s, h) row, 8 rows per CTA; lane handles columns 4 lane + 128 j.
// Partials: partial_out fp32 [splits, b * s_q, h_q, 512] (each already normalised by its own
// row sum), partial_lse fp32 [splits, b * s_q, h_q]; a split with no valid key has lse -inf.
// This is the same layout idea as the dense decode's combine and should be folded into it.
#include <cuda_bf16.h>

#include <cmath>

#include "common/cuda_check.h"
#include "sparse/sparse_decode.h"

namespace mla {
namespace {

constexpr int kRowsPerBlock = 8;

__global__ void __launch_bounds__(32 * kRowsPerBlock) sparse_combine_kernel(const __grid_constant__ SparseDecodeParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t(p.batch) * p.s_q * p.h_q;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int h = static_cast<int>(row % p.h_q);
  const int64_t bs = row / p.h_q;
  const int b = static_cast<int>(bs / p.s_q), s = static_cast<int>(bs % p.s_q);

  float lse_max = -INFINITY;
  for (int i = lane; i < p.num_splits; i += 32) lse_max = fmaxf(lse_max, p.partial_lse[int64_t(i) * rows + row]);
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, mask));
  float sum = 0.f;
  if (lse_max != -INFINITY) {
    for (int i = lane; i < p.num_splits; i += 32) sum += expf(p.partial_lse[int64_t(i) * rows + row] - lse_max);
  }
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
  const float lse = sum > 0.f ? lse_max + logf(sum) : -INFINITY;

  float acc[4][4] = {};
  if (lse != -INFINITY) {
    for (int i = 0; i < p.num_splits; ++i) {
      const float w = expf(p.partial_lse[int64_t(i) * rows + row] - lse);  // 0 for an empty split
      if (w == 0.f) continue;
      const float4* src = reinterpret_cast<const float4*>(p.partial_out + (int64_t(i) * rows + row) * kKvLoraRank);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = src[lane + 32 * j];
        acc[j][0] += w * v.x;
        acc[j][1] += w * v.y;
        acc[j][2] += w * v.z;
        acc[j][3] += w * v.w;
      }
    }
  }
  float f = 1.f;
  if (p.attn_sink != nullptr) f = lse == -INFINITY ? 0.f : 1.f / (1.f + expf(p.attn_sink[h] - lse));
  auto* out = static_cast<__nv_bfloat16*>(p.out) + row * kKvLoraRank;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(acc[j][0] * f, acc[j][1] * f);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(acc[j][2] * f, acc[j][3] * f);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(out + 4 * (lane + 32 * j)) = packed;
  }
  if (lane == 0) p.lse[(int64_t(b) * p.h_q + h) * p.s_q + s] = lse;
}

}  // namespace

void run_sparse_combine(const SparseDecodeParams& p) {
  const int64_t rows = int64_t(p.batch) * p.s_q * p.h_q;
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock));
  sparse_combine_kernel<<<grid, 32 * kRowsPerBlock, 0, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

}  // namespace mla
