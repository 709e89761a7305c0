// Combine: merge the partial (o, lse) of split requests by their lse.
//
// Grid (s_q * h_q, num_parts): blockIdx.y picks the split request listed by part y of the
// schedule (kSplitReq; parts without one exit at once), so the grid is fixed for a batch shape
// (graph-safe) and never scans unsplit requests. One CTA = one query row: warp q merges splits
// q, q + 8, ... (each lane owns 16 of the 512 dims, four float4 per split, two splits in flight),
// then the 8 partial sums meet in shared memory. Many splits (one long request cut over every
// SM) are thus read with 8 warps x 2 splits of loads in flight instead of one serial chain.
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

template <typename T>
__global__ void __launch_bounds__(kCombineWarps * 32) decode_combine_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ float warp_max[kCombineWarps];
  __shared__ float warp_sum[kCombineWarps];
  __shared__ float4 acc_smem[kCombineWarps][kKvLoraRank / 4];
  const int req = p.schedule[blockIdx.y * kScheduleFields + kSplitReq];
  if (req < 0) return;
  const int row = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_splits = p.split_info[req * kSplitInfoFields + 0];
  const int64_t first = int64_t(p.split_info[req * kSplitInfoFields + 1]) * p.num_rows + row;  // slot * rows + row
  const float* lse = p.partial_lse + first;

  // Max lse over all splits (lanes of all warps in parallel).
  float mx = -INFINITY;
  for (int k = threadIdx.x; k < num_splits; k += kCombineWarps * 32) mx = fmaxf(mx, lse[int64_t(k) * p.num_rows]);
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  if (lane == 0) warp_max[warp] = mx;
  __syncthreads();
  float max_lse = warp_max[0];
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w) max_lse = fmaxf(max_lse, warp_max[w]);

  float4 acc[4] = {};
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    for (int k0 = warp; k0 < num_splits; k0 += 2 * kCombineWarps) {
      // Two splits per iteration: both sets of loads are issued before either is used.
      float4 v[2][4];
      float w[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int k = k0 + u * kCombineWarps;
        w[u] = 0.f;
        if (k < num_splits) {
          const int64_t idx = first + int64_t(k) * p.num_rows;
          w[u] = exp2f(lse[int64_t(k) * p.num_rows] - max_lse);  // 0 for an empty piece (lse -inf)
          const float4* src = reinterpret_cast<const float4*>(p.partial_o + idx * kKvLoraRank) + lane;
#pragma unroll
          for (int j = 0; j < 4; ++j) v[u][j] = src[32 * j];
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) v[u][j] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        sum += w[u];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[j].x += w[u] * v[u][j].x;
          acc[j].y += w[u] * v[u][j].y;
          acc[j].z += w[u] * v[u][j].z;
          acc[j].w += w[u] * v[u][j].w;
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) acc_smem[warp][lane + 32 * j] = acc[j];
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();

  // Thread t finishes dims 2t, 2t + 1.
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) total += warp_sum[w];
  const float inv = total == 0.f ? 0.f : 1.f / total;
  const float* flat = reinterpret_cast<const float*>(acc_smem);
  float x = 0.f, y = 0.f;
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) {
    x += flat[w * kKvLoraRank + 2 * threadIdx.x];
    y += flat[w * kKvLoraRank + 2 * threadIdx.x + 1];
  }
  const int s = row / p.h_q, h = row % p.h_q;
  T* out = static_cast<T*>(p.out) + req * p.stride_out_b + s * p.stride_out_s + h * p.stride_out_h + 2 * threadIdx.x;
  out[0] = from_float<T>(x * inv);
  out[1] = from_float<T>(y * inv);
  if (threadIdx.x == 0) {
    p.lse[req * p.stride_lse_b + h * p.stride_lse_h + s * p.stride_lse_s] =
        total == 0.f ? -INFINITY : (max_lse + log2f(total)) * kLn2;
  }
}

}  // namespace

void run_decode_combine(const DecodeParams& p) {
  static_assert(kCombineWarps * 32 * 2 == kKvLoraRank, "one thread per two output dims");
  const dim3 grid(p.num_rows, p.num_parts);
  MLA_DISPATCH_HALF_TYPES(p.q_dtype, "q", [&] {
    decode_combine_kernel<scalar_t><<<grid, kCombineWarps * 32, 0, p.stream>>>(p);
    MLA_CHECK_LAUNCH();
  });
}

}  // namespace mla::decode
