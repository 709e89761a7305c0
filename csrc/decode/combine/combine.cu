// Split combine (dense and sparse decode): merge the partial (o, lse) of split rows by their lse.
//
// Grid (s_q * h_q * kChunks, items): CTA x = (query row, chunk of 512 / kChunks output dims);
// y = the request to merge (dense: entry y of the planner's list of split requests, which ends at
// the first -1; sparse: every request), striding by gridDim.y past 65535 requests. Inside a CTA,
// kLanes threads cover the chunk's dims with one float4 each and the kGroups = 256 / kLanes thread
// groups take splits g, g + kGroups, ...; each thread issues the loads of kUnroll splits before
// using any (one long request cut over every SM: 128 splits of a row are all in flight at once with
// kChunks = 8), keeps a running max / sum / weighted sum, and the groups meet in shared memory.
//
// kChunks is picked so that rows x chunks x requests covers the SMs about twice: one long
// request (16 rows, 128 splits) runs 128 CTAs of 64 dims, a large batch runs one CTA per row.
// Bytes: num_splits * (512 + 1) * 4 read (from L2: the split kernel just wrote them) and
// 512 * 2 + 4 written per row.
#include "decode/combine/combine.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "common/attn_sink.cuh"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/pdl.cuh"
#include "common/vec.cuh"

namespace mla::combine {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;  // splits per thread with loads in flight together
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLog2e = 1.442695040888963407f;

__device__ __forceinline__ void fma4(float4& acc, float w, const float4& v) {
  acc.x = fmaf(w, v.x, acc.x);
  acc.y = fmaf(w, v.y, acc.y);
  acc.z = fmaf(w, v.z, acc.z);
  acc.w = fmaf(w, v.w, acc.w);
}

// max that keeps NaN (fmaxf drops it): a NaN partial lse (a NaN row among the attended) must reach
// the merged lse and output, also when every other piece is empty.
__device__ __forceinline__ float max_keep_nan(float a, float b) { return a != a ? a : (b != b ? b : fmaxf(a, b)); }

template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const T lo = from_float<T>(a), hi = from_float<T>(b);
  return uint32_t(*reinterpret_cast<const uint16_t*>(&lo)) | (uint32_t(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
}

template <typename T, int kChunks>
__global__ void __launch_bounds__(kThreads) split_combine_kernel(const __grid_constant__ CombineParams p) {
  constexpr int kLanes = kKvLoraRank / 4 / kChunks;  // float4 columns per CTA
  constexpr int kGroups = kThreads / kLanes;         // splits merged side by side
  __shared__ float4 acc_smem[kGroups][kLanes];
  __shared__ float max_smem[kGroups], sum_smem[kGroups];

  // Launched early (programmatic dependent launch; the split kernels let it be scheduled from their
  // start): the plan (split list, split info: an earlier kernel's output) is read before waiting for
  // the partials. Every CTA waits before it exits, also one with nothing to merge, so that this grid
  // completes only after the split kernel has: the next kernel in the stream reads `out`.
  bool waited = false;
  auto wait_partials = [&] {
    if (!waited) pdl_wait_prerequisites();
    waited = true;
  };
  const int row = blockIdx.x / kChunks, chunk = blockIdx.x % kChunks;
  const int g = threadIdx.x / kLanes, c = threadIdx.x % kLanes;
  const int col4 = chunk * kLanes + c;  // this thread's float4 of the 512 output dims
  const int s = row / p.h_q, h = row % p.h_q;

  for (int y = blockIdx.y;; y += gridDim.y) {
    // Which request, how many splits, first slot. Values from a plan are bounds-checked so a
    // hand-made schedule can give a wrong answer but never a read outside the workspace.
    int req, n;
    int64_t first;
    if (p.split_list != nullptr) {
      if (y >= p.list_len) break;
      req = p.split_list[int64_t(y) * p.stride_split_list];
      if (req < 0) break;  // end of the list
      if (req >= p.b) continue;
      n = p.split_info[req * 2 + 0];
      first = p.split_info[req * 2 + 1];
    } else {
      if (y >= p.b) break;
      req = y;
      n = p.num_splits;
      first = 0;
    }
    if (first < 0 || first >= p.num_slots || n < 1) continue;
    wait_partials();
    n = static_cast<int>(std::min<int64_t>(n, p.num_slots - first));
    const int64_t base = first * p.stride_partial_slot + int64_t(req) * p.stride_partial_req + row;

    // Running max (log2), sum of weights and weighted sum of this thread's splits.
    float m = -INFINITY, sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k0 = g; k0 < n; k0 += kGroups * kUnroll) {
      float l[kUnroll];
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int k = k0 + u * kGroups;
        if (k < n) {
          const int64_t r = base + int64_t(k) * p.stride_partial_slot;
          l[u] = p.partial_lse[r];
          v[u] = reinterpret_cast<const float4*>(p.partial_o + r * kKvLoraRank)[col4];
        } else {
          l[u] = -INFINITY;
          v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
      float m_new = m;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (p.lse_is_natural) l[u] *= kLog2e;
        m_new = max_keep_nan(m_new, l[u]);
      }
      if (m_new == -INFINITY) continue;  // only empty pieces so far
      const float alpha = exp2f(m - m_new);  // 0 while m is -inf
      sum *= alpha;
      acc.x *= alpha, acc.y *= alpha, acc.z *= alpha, acc.w *= alpha;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float w = exp2f(l[u] - m_new);  // 0 for an empty piece (lse -inf); NaN propagates
        sum += w;
        if (w != 0.f) fma4(acc, w, v[u]);
      }
      m = m_new;
    }

    acc_smem[g][c] = acc;
    if (c == 0) max_smem[g] = m, sum_smem[g] = sum;
    __syncthreads();
    if (threadIdx.x < kLanes) {
      float mx = -INFINITY;
#pragma unroll
      for (int gg = 0; gg < kGroups; ++gg) mx = max_keep_nan(mx, max_smem[gg]);
      float total = 0.f;
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
      if (mx != -INFINITY) {
#pragma unroll
        for (int gg = 0; gg < kGroups; ++gg) {
          const float w = exp2f(max_smem[gg] - mx);  // 0 for groups that saw nothing
          total += w * sum_smem[gg];
          if (w != 0.f) fma4(o, w, acc_smem[gg][threadIdx.x]);
        }
      }
      // total == 0: nothing attended (out 0, lse -inf); NaN propagates.
      const float lse = total == 0.f ? -INFINITY : (mx + log2f(total)) * kLn2;
      float f = total == 0.f ? 0.f : 1.f / total;
      if (p.attn_sink != nullptr) f *= attn_sink_factor(lse, p.attn_sink[h]);
      T* out = static_cast<T*>(p.out) + req * p.stride_out_b + s * p.stride_out_s + h * p.stride_out_h + 4 * col4;
      // Two 4-byte stores: rows are only guaranteed 4-byte aligned (even strides).
      reinterpret_cast<uint32_t*>(out)[0] = pack2<T>(o.x * f, o.y * f);
      reinterpret_cast<uint32_t*>(out)[1] = pack2<T>(o.z * f, o.w * f);
      if (chunk == 0 && threadIdx.x == 0) p.lse[req * p.stride_lse_b + h * p.stride_lse_h + s * p.stride_lse_s] = lse;
    }
    __syncthreads();  // shared memory is reused by the next request
  }
  wait_partials();
}

template <typename T, int kChunks>
void launch(const CombineParams& p, dim3 grid) {
  launch_dependent(&split_combine_kernel<T, kChunks>, grid, dim3(kThreads), 0, p.stream, p);
}

}  // namespace

void run_split_combine(const CombineParams& p) {
  MLA_HOST_CHECK(p.b >= 1 && p.s_q >= 1 && p.h_q >= 1, "combine needs b, s_q, h_q >= 1");
  MLA_HOST_CHECK(p.split_list == nullptr ? p.num_splits >= 1 : (p.split_info != nullptr && p.list_len >= 1),
                 "combine needs a split list with split_info, or num_splits");
  const int64_t num_rows = int64_t(p.s_q) * p.h_q;
  // Requests that can need merging: at most one per list entry (dense), else all of them.
  const int64_t items = p.split_list != nullptr ? std::min<int64_t>(p.b, p.list_len) : p.b;
  int chunks = 1;
  while (chunks < 8 && num_rows * chunks * items < 2 * int64_t(p.num_sms)) chunks *= 2;
  MLA_HOST_CHECK(num_rows * chunks < (int64_t(1) << 31), "combine: too many query rows");
  // One CTA per (row chunk, request), so that every merge's loads are in flight at once (a CTA that
  // walks several requests waits one memory latency per request). gridDim.y stops at 65535.
  const int64_t per_item = num_rows * chunks;
  const int64_t ys = std::clamp<int64_t>(items, 1, 65535);
  const dim3 grid(static_cast<unsigned>(per_item), static_cast<unsigned>(ys));
  MLA_DISPATCH_HALF_TYPES(p.out_dtype, "out", [&] {
    switch (chunks) {
      case 1: launch<scalar_t, 1>(p, grid); break;
      case 2: launch<scalar_t, 2>(p, grid); break;
      case 4: launch<scalar_t, 4>(p, grid); break;
      default: launch<scalar_t, 8>(p, grid); break;
    }
  });
}

}  // namespace mla::combine
