// Combine: merge the partial (o, lse) of split requests by their lse.
//
// Grid (4 * s_q * h_q, num_parts): blockIdx.y picks the split request listed by part y of the
// schedule (kSplitReq; parts without one exit at once), so the grid is fixed for a batch shape
// (graph-safe) and never visits unsplit requests. One CTA = one query row x 128 of its 512 dims:
// warp q merges splits q, q + 8, ... with one float4 per lane and four splits in flight, then
// the 8 partial sums meet in shared memory. A long request cut over every SM (128 splits) is
// read with 4 x 8 x 4 = 128 loads of 512 B in flight per row instead of a serial chain.
// Bytes: num_splits * (512 + 4 * 1) * 4 read and 512 * 2 + 4 written per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/vec.cuh"
#include "decode/decode.h"

namespace mla::decode {
namespace {

constexpr int kCombineWarps = 8;
constexpr int kDimsPerCta = 128;  // one float4 per lane
constexpr int kDimChunks = kKvLoraRank / kDimsPerCta;
constexpr int kUnroll = 4;        // splits in flight per warp
constexpr float kLn2 = 0.693147180559945309f;

template <typename T>
__global__ void __launch_bounds__(kCombineWarps * 32) decode_combine_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ float warp_max[kCombineWarps];
  __shared__ float warp_sum[kCombineWarps];
  __shared__ float4 acc_smem[kCombineWarps][32];
  const int req = p.schedule[blockIdx.y * kScheduleFields + kSplitReq];
  if (req < 0) return;
  const int row = blockIdx.x / kDimChunks, d0 = (blockIdx.x % kDimChunks) * kDimsPerCta;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_splits = p.split_info[req * kSplitInfoFields + 0];
  const int64_t first = int64_t(p.split_info[req * kSplitInfoFields + 1]) * p.num_rows + row;  // slot * rows + row
  const float* lse = p.partial_lse + first;

  // Max lse over all splits (every thread in parallel).
  float mx = -INFINITY;
  for (int k = threadIdx.x; k < num_splits; k += kCombineWarps * 32) mx = fmaxf(mx, lse[int64_t(k) * p.num_rows]);
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  if (lane == 0) warp_max[warp] = mx;
  __syncthreads();
  float max_lse = warp_max[0];
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w) max_lse = fmaxf(max_lse, warp_max[w]);

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    for (int k0 = warp; k0 < num_splits; k0 += kUnroll * kCombineWarps) {
      float4 v[kUnroll];
      float w[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // all loads first
        const int k = k0 + u * kCombineWarps;
        w[u] = 0.f;
        v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (k < num_splits) {
          const int64_t idx = first + int64_t(k) * p.num_rows;
          w[u] = lse[int64_t(k) * p.num_rows];
          v[u] = reinterpret_cast<const float4*>(p.partial_o + idx * kKvLoraRank + d0)[lane];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (k0 + u * kCombineWarps >= num_splits) break;
        const float wt = exp2f(w[u] - max_lse);  // 0 for an empty piece (lse -inf)
        sum += wt;
        acc.x += wt * v[u].x;
        acc.y += wt * v[u].y;
        acc.z += wt * v[u].z;
        acc.w += wt * v[u].w;
      }
    }
  }
  acc_smem[warp][lane] = acc;
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x >= kDimsPerCta / 2) return;

  // Thread t < 64 finishes dims d0 + 2t, d0 + 2t + 1.
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) total += warp_sum[w];
  const float inv = total == 0.f ? 0.f : 1.f / total;
  const float* flat = reinterpret_cast<const float*>(acc_smem);
  float x = 0.f, y = 0.f;
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) {
    x += flat[w * kDimsPerCta + 2 * threadIdx.x];
    y += flat[w * kDimsPerCta + 2 * threadIdx.x + 1];
  }
  const int s = row / p.h_q, h = row % p.h_q;
  T* out = static_cast<T*>(p.out) + req * p.stride_out_b + s * p.stride_out_s + h * p.stride_out_h + d0 + 2 * threadIdx.x;
  out[0] = from_float<T>(x * inv);
  out[1] = from_float<T>(y * inv);
  if (threadIdx.x == 0 && d0 == 0) {
    p.lse[req * p.stride_lse_b + h * p.stride_lse_h + s * p.stride_lse_s] =
        total == 0.f ? -INFINITY : (max_lse + log2f(total)) * kLn2;
  }
}

}  // namespace

void run_decode_combine(const DecodeParams& p) {
  const dim3 grid(p.num_rows * kDimChunks, p.num_parts);
  MLA_DISPATCH_HALF_TYPES(p.q_dtype, "q", [&] {
    decode_combine_kernel<scalar_t><<<grid, kCombineWarps * 32, 0, p.stream>>>(p);
    MLA_CHECK_LAUNCH();
  });
}

}  // namespace mla::decode
