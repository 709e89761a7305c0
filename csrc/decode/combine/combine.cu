// Combine: merge the partial (o, lse) of split requests by their lse.
//
// Grid (ceil(num_rows / 8), b), 8 warps per CTA, one warp per query row; each lane owns 16 of the
// 512 output dims (four float4 per split). Requests with one split were written directly by the
// split kernel and exit at once, so the grid is the same for every seq_lens (graph-safe).
// Bytes: num_splits * (512 + 1) * 4 read and 512 * 2 + 4 written per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/vec.cuh"
#include "decode/decode.h"

namespace mla::decode {
namespace {

constexpr int kCombineWarps = 8;
constexpr float kLn2 = 0.693147180559945309f;

template <typename T>
__global__ void __launch_bounds__(kCombineWarps * 32) decode_combine_kernel(const __grid_constant__ DecodeParams p) {
  const int req = blockIdx.y;
  const int num_splits = p.split_info[req * kSplitInfoFields + 0];
  if (num_splits <= 1) return;
  const int row = blockIdx.x * kCombineWarps + threadIdx.x / 32;
  if (row >= p.num_rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t first = int64_t(p.split_info[req * kSplitInfoFields + 1]) * p.num_rows + row;  // slot * rows + row

  float max_lse = -INFINITY;
  for (int k = 0; k < num_splits; ++k) max_lse = fmaxf(max_lse, p.partial_lse[first + int64_t(k) * p.num_rows]);

  float acc[16] = {};
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    for (int k = 0; k < num_splits; ++k) {
      const int64_t idx = first + int64_t(k) * p.num_rows;
      const float w = exp2f(p.partial_lse[idx] - max_lse);  // 0 for an empty piece (lse -inf)
      sum += w;
      const float4* src = reinterpret_cast<const float4*>(p.partial_o + idx * kKvLoraRank) + lane;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = src[32 * j];
        acc[4 * j + 0] += w * v.x;
        acc[4 * j + 1] += w * v.y;
        acc[4 * j + 2] += w * v.z;
        acc[4 * j + 3] += w * v.w;
      }
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  const int s = row / p.h_q, h = row % p.h_q;
  T* out = static_cast<T*>(p.out) + req * p.stride_out_b + s * p.stride_out_s + h * p.stride_out_h;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // dims 4 * (lane + 32 j) .. +3, matching the float4 reads above
    T* dst = out + 4 * (lane + 32 * j);
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[e] = from_float<T>(acc[4 * j + e] * inv);
  }
  if (lane == 0) {
    p.lse[req * p.stride_lse_b + h * p.stride_lse_h + s * p.stride_lse_s] =
        sum > 0.f ? (max_lse + log2f(sum)) * kLn2 : -INFINITY;
  }
}

}  // namespace

void run_decode_combine(const DecodeParams& p) {
  const dim3 grid((p.num_rows + kCombineWarps - 1) / kCombineWarps, p.b);
  MLA_DISPATCH_HALF_TYPES(p.q_dtype, "q", [&] {
    decode_combine_kernel<scalar_t><<<grid, kCombineWarps * 32, 0, p.stream>>>(p);
    MLA_CHECK_LAUNCH();
  });
}

}  // namespace mla::decode
