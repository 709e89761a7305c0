// v_up for few heads (H < 96) at small T: one CTA per (BN output columns, K slice, head, BM-row
// tile), everything it needs loaded in one round, K split over its 8 warps and, with kSplits > 1,
// over a thread-block cluster of kSplits CTAs; partial sums reduced through shared memory and
// distributed shared memory in a fixed order (deterministic, no atomics). mma.sync m16n8k16,
// sm80+ for kSplits = 1, sm90+ (clusters) otherwise, so sm90 and sm100 run it. README.md has the
// picture.
//
// Grid = (128 / BN * kSplits, H, ceil(T / BM)), clusters of (kSplits, 1, 1); BN, BM and kSplits
// are picked so that the grid is about one CTA per SM (absorb.cu). CTA (nb * kSplits + ks, h, m)
// with KC = 512 / kSplits:
//   1. cp.async: the weight block W_UV[h]^T[nb BN : nb BN + BN, ks KC : ks KC + KC] ([BN, KC])
//      and the tile's rows of x[:, h, ks KC : ks KC + KC] ([BM, KC], zero-filled beyond T), all in
//      one group (no pipeline: the whole working set, <= 192 KiB, is in flight at once); e4m3
//      weights by 16-byte loads, dequantised to bf16(w * scale);
//   2. warp (wn, wk) computes columns [16 wn, 16 wn + 16) of the tile over k in
//      [wk KW, wk KW + KW) of the slice, KW = KC / kWarpsK;
//   3. with kWarpsK > 1 the fp32 partials go through shared memory (over the dead inputs) and
//      are summed over wk = 0, 1, ... in order; kSplits = 1 stores them as bf16. With kSplits > 1
//      the CTA's sum stays in its shared memory, a cluster barrier, then rank ks sums rows
//      [ks BM / kSplits, (ks + 1) BM / kSplits) over the ranks 0, 1, ... (DSMEM loads) and stores
//      them; a second cluster barrier keeps every partial alive until all ranks have read it.
// Why: a latency-bound size. Each CTA waits for one round of loads, and the time grows with the
// bytes one SM must receive: splitting K over a cluster cuts the rows of x and of the weight
// each CTA loads (H = 16, T = 128: 48-64 KiB instead of 96 KiB) for a small DSMEM reduction.
// The first cluster split-K (8 CTAs of a 64-column slice each, BN = 128; a2a0c3e) received more
// through DSMEM (a [BM, 128] fp32 partial from each of 7 peers) than it saved and was slower
// at every size measured (9.1-14.8 us vs 6.9-9.7 us at H = 16, T = 64-256; README.md).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "absorb/absorb.h"
#include "absorb/absorb_common.cuh"
#include "absorb/absorb_gemm.h"
#include "common/cuda_check.h"
#include "common/sm80.cuh"

namespace mla::absorb {

template <bool kFp8_, int kBM, int kBN, int kSplits_>
struct KSplitConfig {
  static constexpr bool kFp8 = kFp8_;
  static constexpr int BM = kBM, BN = kBN, K = kKvLoraRank;
  static constexpr int kSplits = kSplits_;         // CTAs of a cluster, one K slice each
  static constexpr int KC = K / kSplits;           // this CTA's k
  static constexpr int kThreads = 256, kWarps = 8;
  static constexpr int kWarpsN = BN / 16;          // each warp owns 16 output columns
  static constexpr int kWarpsK = kWarps / kWarpsN; // ... and KC / kWarpsK of the k
  static constexpr int KW = KC / kWarpsK;
  static constexpr int MT = BM / 16;
  static constexpr int kRowChunks = KC / 8;        // rows of KC bf16 in 16-byte chunks, swizzled
  static constexpr int kWBytes = BN * KC * 2;
  static constexpr int kXBytes = BM * KC * 2;
  static constexpr int kPartialStride = BN + 8;    // floats; spreads a fragment's 8 rows over banks
  static constexpr int kPartialBytes = kWarpsK > 1 || kSplits > 1 ? kWarpsK * BM * kPartialStride * 4 : 0;
  static constexpr int kSmemBytes = kWBytes + kXBytes > kPartialBytes ? kWBytes + kXBytes : kPartialBytes;
  static constexpr int kRowsPerRank = BM / kSplits;  // output rows each rank reduces and stores
  static_assert(BN % 16 == 0 && kWarps % kWarpsN == 0 && BM % 16 == 0 && KW % 16 == 0);
  static_assert(kRowChunks % 8 == 0, "the XOR swizzle needs rows of at least 128 bytes");
  static_assert(kSplits == 1 || kSplits == 2 || kSplits == 4 || kSplits == 8);
  static_assert(BM % kSplits == 0, "each rank reduces and stores BM / kSplits rows");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90/sm100");
};

// Sums rows [r_begin, r_begin + rows) of the [BM, BN] fp32 partials at `partial` (stride
// kPartialStride) over `count` layers spaced layer_stride floats apart, read through `at(layer,
// ptr)` (local or another rank's shared memory), in layer order, 8 columns per thread, and
// stores them as bf16 with one 16-byte store.
template <class Cfg, class At>
__device__ __forceinline__ void sum_partials_store(const float* partial, int count, int layer_stride, int r_begin, int rows,
                                                   At at, __nv_bfloat16* out_head, int64_t row0, int64_t num_tokens,
                                                   int64_t stride_c_token, int tid) {
  constexpr int BN = Cfg::BN;
  for (int i = tid; i < rows * (BN / 8); i += Cfg::kThreads) {
    const int r = r_begin + i / (BN / 8), c = (i % (BN / 8)) * 8;
    if (row0 + r >= num_tokens) continue;
    float sum[8] = {};
    for (int q = 0; q < count; ++q) {
      const float* src = at(q, partial + q * layer_stride + r * Cfg::kPartialStride + c);
      const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
      sum[0] += lo.x, sum[1] += lo.y, sum[2] += lo.z, sum[3] += lo.w;
      sum[4] += hi.x, sum[5] += hi.y, sum[6] += hi.z, sum[7] += hi.w;
    }
    uint4 packed;
    packed.x = sm80::pack2<__nv_bfloat16>(sum[0], sum[1]), packed.y = sm80::pack2<__nv_bfloat16>(sum[2], sum[3]);
    packed.z = sm80::pack2<__nv_bfloat16>(sum[4], sum[5]), packed.w = sm80::pack2<__nv_bfloat16>(sum[6], sum[7]);
    *reinterpret_cast<uint4*>(out_head + (row0 + r) * stride_c_token + c) = packed;
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) v_up_ksplit_kernel(const __grid_constant__ AbsorbParams p) {
  using namespace sm80;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, KC = Cfg::KC, MT = Cfg::MT, kRowChunks = Cfg::kRowChunks;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_w = smem_addr(smem);             // [BN rows n][KC / 8 chunks]
  const uint32_t smem_x = smem_w + Cfg::kWBytes;       // [BM rows][KC / 8 chunks]
  float* partial = reinterpret_cast<float*>(smem);     // [kWarpsK][BM][kPartialStride], after the mma

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wn = warp % Cfg::kWarpsN, wk = warp / Cfg::kWarpsN;
  const int ks = blockIdx.x % Cfg::kSplits;            // == the rank in the cluster
  const int n0 = (blockIdx.x / Cfg::kSplits) * BN, k0 = ks * KC;
  const int64_t h = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * BM;

  // ---- 1. one round of loads
  const auto* x_head = static_cast<const __nv_bfloat16*>(p.a) + h * p.stride_a_head + k0;
#pragma unroll 4
  for (int i = tid; i < BM * kRowChunks; i += Cfg::kThreads) {
    const int r = i / kRowChunks, c = i % kRowChunks;
    const bool valid = row0 + r < p.num_tokens;
    cp_async16(smem_x + swizzle(r, c, kRowChunks), x_head + (valid ? row0 + r : 0) * p.stride_a_token + c * 8, valid);
  }
  if constexpr (!Cfg::kFp8) {
    const auto* w = static_cast<const __nv_bfloat16*>(p.w) + h * (kVHeadDim * Cfg::K) + n0 * Cfg::K + k0;
#pragma unroll 4
    for (int i = tid; i < BN * kRowChunks; i += Cfg::kThreads) {
      const int n = i / kRowChunks, c = i % kRowChunks;
      cp_async16(smem_w + swizzle(n, c, kRowChunks), w + n * Cfg::K + c * 8, true);
    }
    cp_async_commit();
  } else {
    cp_async_commit();
    // 16 e4m3 per load = two bf16 chunks; batches of 8 loads in flight per thread.
    const auto* w = static_cast<const uint8_t*>(p.w) + h * (kVHeadDim * Cfg::K) + n0 * Cfg::K + k0;
    const float* scale = p.w_scale + h * kNumLatentBlocks;
    constexpr int kLoads = BN * KC / 16, kPerRow = KC / 16, kBatch = 8;
    static_assert(kLoads % (Cfg::kThreads * kBatch) == 0 || kLoads <= Cfg::kThreads * kBatch);
    for (int base = tid; base < kLoads; base += Cfg::kThreads * kBatch) {
      uint4 raw[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = base + j * Cfg::kThreads;
        if (i < kLoads) raw[j] = __ldg(reinterpret_cast<const uint4*>(w + (i / kPerRow) * Cfg::K + (i % kPerRow) * 16));
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = base + j * Cfg::kThreads;
        if (i < kLoads) {
          const int n = i / kPerRow, col = (i % kPerRow) * 16;
          uint4 out[2];
          dequant16_e4m3(raw[j], __ldg(scale + (k0 + col) / kWeightBlock), out);
          *reinterpret_cast<uint4*>(smem + swizzle(n, col / 8, kRowChunks)) = out[0];
          *reinterpret_cast<uint4*>(smem + swizzle(n, col / 8 + 1, kRowChunks)) = out[1];
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- 2. [BM, KW] x [KW, 16] per warp
  float acc[MT][2][4] = {};
  const int quad = lane / 8;  // which 8x8 matrix this lane addresses
#pragma unroll 4
  for (int kk = 0; kk < Cfg::KW / 16; ++kk) {
    const int kc = (wk * Cfg::KW + kk * 16) / 8;  // first 16-byte chunk of this k16 step
    uint32_t b[4];  // (n-tile 0: k lo, k hi), (n-tile 1: k lo, k hi)
    ldmatrix_x4(b, smem_w + swizzle(wn * 16 + (quad / 2) * 8 + lane % 8, kc + quad % 2, kRowChunks));
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      uint32_t af[4];
      ldmatrix_x4(af, smem_x + swizzle(mi * 16 + lane % 16, kc + lane / 16, kRowChunks));
      mma_16816<__nv_bfloat16>(acc[mi][0], af, b[0], b[1]);
      mma_16816<__nv_bfloat16>(acc[mi][1], af, b[2], b[3]);
    }
  }

  // ---- 3. reduce over the K warps and the cluster's K slices (fixed order) and store
  auto* out_head = static_cast<__nv_bfloat16*>(p.c) + h * p.stride_c_head + n0;
  if constexpr (Cfg::kWarpsK == 1 && Cfg::kSplits == 1) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t t = row0 + mi * 16 + lane / 4 + 8 * half;
        if (t >= p.num_tokens) continue;
#pragma unroll
        for (int nj = 0; nj < 2; ++nj)
          *reinterpret_cast<__nv_bfloat162*>(out_head + t * p.stride_c_token + wn * 16 + nj * 8 + 2 * (lane % 4)) =
              __floats2bfloat162_rn(acc[mi][nj][2 * half], acc[mi][nj][2 * half + 1]);
      }
  } else {
    __syncthreads();  // every warp is done with the inputs: the partials overwrite them
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mi * 16 + lane / 4 + 8 * half;
#pragma unroll
        for (int nj = 0; nj < 2; ++nj)
          *reinterpret_cast<float2*>(partial + (wk * BM + r) * Cfg::kPartialStride + wn * 16 + nj * 8 + 2 * (lane % 4)) =
              make_float2(acc[mi][nj][2 * half], acc[mi][nj][2 * half + 1]);
      }
    __syncthreads();
    constexpr int kLayer = BM * Cfg::kPartialStride;  // floats between the warps' partials
    const auto local = [](int, const float* ptr) { return ptr; };
    if constexpr (Cfg::kSplits == 1) {
      sum_partials_store<Cfg>(partial, Cfg::kWarpsK, kLayer, 0, BM, local, out_head, row0, p.num_tokens,
                              p.stride_c_token, tid);
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      namespace cg = cooperative_groups;
      // this CTA's sum over its warps into layer 0 (each thread owns its 4 columns in place)
      if constexpr (Cfg::kWarpsK > 1) {
        for (int i = tid; i < BM * BN / 4; i += Cfg::kThreads) {
          float* dst = partial + (i / (BN / 4)) * Cfg::kPartialStride + (i % (BN / 4)) * 4;
          float4 sum = *reinterpret_cast<const float4*>(dst);
#pragma unroll
          for (int q = 1; q < Cfg::kWarpsK; ++q) {
            const float4 v = *reinterpret_cast<const float4*>(dst + q * kLayer);
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
          }
          *reinterpret_cast<float4*>(dst) = sum;
        }
      }
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();  // release/acquire: every rank's sum is visible to the whole cluster
      const auto remote = [&cluster](int rank, const float* ptr) {
        return static_cast<const float*>(cluster.map_shared_rank(const_cast<float*>(ptr), rank));
      };
      sum_partials_store<Cfg>(partial, Cfg::kSplits, 0, ks * Cfg::kRowsPerRank, Cfg::kRowsPerRank, remote, out_head,
                              row0, p.num_tokens, p.stride_c_token, tid);
      cluster.sync();  // no CTA leaves (freeing its shared memory) while another still reads it
#elif defined(__CUDA_ARCH__)
      __trap();  // clusters need sm90+; the host never launches kSplits > 1 below sm90
#endif
    }
  }
}

template <class Cfg>
void launch_v_up_ksplit(const AbsorbParams& p) {
  auto kernel = v_up_ksplit_kernel<Cfg>;
  opt_in_smem_once<Cfg>(reinterpret_cast<const void*>(kernel), p.device);
  const int64_t num_tiles = (p.num_tokens + Cfg::BM - 1) / Cfg::BM;
  MLA_HOST_CHECK(p.num_heads <= 65535 && num_tiles <= 65535, "v_up: grid too large (H or T)");
  const dim3 grid(kVHeadDim / Cfg::BN * Cfg::kSplits, static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_tiles));
  if constexpr (Cfg::kSplits == 1) {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, p.stream>>>(p);
  } else {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = p.stream;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = Cfg::kSplits;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    MLA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
  }
  MLA_CHECK_LAUNCH();
}

template <bool kFp8, int kBM, int kBN, int kSplits>
void run_v_up_ksplit(const AbsorbParams& p) {
  launch_v_up_ksplit<KSplitConfig<kFp8, kBM, kBN, kSplits>>(p);
}

}  // namespace mla::absorb
