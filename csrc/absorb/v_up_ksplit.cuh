// v_up for few heads (H < 96) up to T = 128 (sm90; T = 512 elsewhere): one CTA per (BN output columns, head, BM-row tile),
// everything it needs loaded in one round, K split over its 8 warps and reduced through shared
// memory in a fixed order (deterministic). mma.sync m16n8k16, sm80+, so sm90 and sm100 run it.
// README.md has the picture.
//
// Grid = (128 / BN, H, ceil(T / BM)); BN is picked so that the grid is about one CTA per SM
// (absorb.cu), spreading each head's weights over 128 / BN CTAs. CTA (nb, h, m):
//   1. cp.async: the weight rows W_UV[h]^T[nb BN : nb BN + BN, :] ([BN, 512]) and the tile's
//      rows of x[:, h, :] ([BM, 512], zero-filled beyond T), all in one group (no pipeline: the
//      whole working set, <= 192 KiB, is in flight at once); e4m3 weights by 16-byte loads,
//      dequantised to bf16(w * scale);
//   2. warp (wn, wk) computes columns [16 wn, 16 wn + 16) of the tile over k in
//      [wk KW, wk KW + KW), KW = 512 / kWarpsK;
//   3. with kWarpsK > 1 the fp32 partials go through shared memory (over the dead inputs) and
//      every thread sums 4 outputs over wk = 0, 1, ... in order, then stores bf16.
// Why: a latency-bound size. Each CTA waits for one round of loads (the old 1-warp narrow tiles
// walked K in 8 dependent steps). K split over a cluster of 8 CTAs with a DSMEM reduction instead
// of over warps was slower at every size measured (9.1-14.8 us vs 6.9-9.7 us at H = 16,
// T = 64-256; README.md), and was removed.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "absorb/absorb.h"
#include "absorb/absorb_common.cuh"
#include "absorb/absorb_gemm.h"
#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/sm80.cuh"

namespace mla::absorb {

template <bool kFp8_, int kBM, int kBN>
struct KSplitConfig {
  static constexpr bool kFp8 = kFp8_;
  static constexpr int BM = kBM, BN = kBN, K = kKvLoraRank;
  static constexpr int kThreads = 256, kWarps = 8;
  static constexpr int kWarpsN = BN / 16;          // each warp owns 16 output columns
  static constexpr int kWarpsK = kWarps / kWarpsN; // ... and K / kWarpsK of the k
  static constexpr int KW = K / kWarpsK;
  static constexpr int MT = BM / 16;
  static constexpr int kRowChunks = K / 8;         // rows of 512 bf16 = 64 chunks, swizzled
  static constexpr int kWBytes = BN * K * 2;
  static constexpr int kXBytes = BM * K * 2;
  static constexpr int kPartialStride = BN + 8;    // floats; spreads a fragment's 8 rows over banks
  static constexpr int kPartialBytes = kWarpsK > 1 ? kWarpsK * BM * kPartialStride * 4 : 0;
  static constexpr int kSmemBytes = kWBytes + kXBytes > kPartialBytes ? kWBytes + kXBytes : kPartialBytes;
  static_assert(BN % 16 == 0 && kWarps % kWarpsN == 0 && BM % 16 == 0 && KW % 16 == 0);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90/sm100");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) v_up_ksplit_kernel(const __grid_constant__ AbsorbParams p) {
  using namespace sm80;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, K = Cfg::K, MT = Cfg::MT, kRowChunks = Cfg::kRowChunks;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_w = smem_addr(smem);             // [BN rows n][64 chunks]
  const uint32_t smem_x = smem_w + Cfg::kWBytes;       // [BM rows][64 chunks]
  float* partial = reinterpret_cast<float*>(smem);     // [kWarpsK][BM][kPartialStride], after the mma

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wn = warp % Cfg::kWarpsN, wk = warp / Cfg::kWarpsN;
  const int n0 = blockIdx.x * BN;
  const int64_t h = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * BM;

  // ---- 1. one round of loads
  const auto* x_head = static_cast<const __nv_bfloat16*>(p.a) + h * p.stride_a_head;
#pragma unroll 4
  for (int i = tid; i < BM * kRowChunks; i += Cfg::kThreads) {
    const int r = i / kRowChunks, c = i % kRowChunks;
    const bool valid = row0 + r < p.num_tokens;
    cp_async16(smem_x + swizzle(r, c, kRowChunks), x_head + (valid ? row0 + r : 0) * p.stride_a_token + c * 8, valid);
  }
  if constexpr (!Cfg::kFp8) {
    const auto* w = static_cast<const __nv_bfloat16*>(p.w) + h * (kVHeadDim * K) + n0 * K;
#pragma unroll 4
    for (int i = tid; i < BN * kRowChunks; i += Cfg::kThreads) {
      const int n = i / kRowChunks, c = i % kRowChunks;
      cp_async16(smem_w + swizzle(n, c, kRowChunks), w + n * K + c * 8, true);
    }
    cp_async_commit();
  } else {
    cp_async_commit();
    // 16 e4m3 per load = two bf16 chunks; batches of 8 loads in flight per thread.
    const auto* w = static_cast<const uint8_t*>(p.w) + h * (kVHeadDim * K) + n0 * K;
    const float* scale = p.w_scale + h * kNumLatentBlocks;
    constexpr int kLoads = BN * K / 16, kPerRow = K / 16, kBatch = 8;
    static_assert(kLoads % (Cfg::kThreads * kBatch) == 0 || kLoads <= Cfg::kThreads * kBatch);
    for (int base = tid; base < kLoads; base += Cfg::kThreads * kBatch) {
      uint4 raw[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = base + j * Cfg::kThreads;
        if (i < kLoads) raw[j] = __ldg(reinterpret_cast<const uint4*>(w + (i / kPerRow) * K + (i % kPerRow) * 16));
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = base + j * Cfg::kThreads;
        if (i < kLoads) {
          const int n = i / kPerRow, col = (i % kPerRow) * 16;
          uint4 out[2];
          dequant16_e4m3(raw[j], __ldg(scale + col / kWeightBlock), out);
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

  // ---- 3. reduce over the K warps (fixed order) and store
  auto* out_head = static_cast<__nv_bfloat16*>(p.c) + h * p.stride_c_head + n0;
  if constexpr (Cfg::kWarpsK == 1) {
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
    for (int i = tid; i < BM * BN / 4; i += Cfg::kThreads) {
      const int r = i / (BN / 4), c = (i % (BN / 4)) * 4;
      if (row0 + r >= p.num_tokens) continue;
      float4 sum = *reinterpret_cast<const float4*>(partial + r * Cfg::kPartialStride + c);
#pragma unroll
      for (int q = 1; q < Cfg::kWarpsK; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(partial + (q * BM + r) * Cfg::kPartialStride + c);
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
      const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x, sum.y), hi = __floats2bfloat162_rn(sum.z, sum.w);
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(out_head + (row0 + r) * p.stride_c_token + c) = packed;
    }
  }
}

template <class Cfg>
void launch_v_up_ksplit(const AbsorbParams& p) {
  auto kernel = v_up_ksplit_kernel<Cfg>;
  opt_in_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, p.device);
  const int64_t num_tiles = (p.num_tokens + Cfg::BM - 1) / Cfg::BM;
  MLA_HOST_CHECK(p.num_heads <= 65535 && num_tiles <= 65535, "v_up: grid too large (H or T)");
  const dim3 grid(kVHeadDim / Cfg::BN, static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_tiles));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

template <bool kFp8, int kBM, int kBN>
void run_v_up_ksplit(const AbsorbParams& p) {
  launch_v_up_ksplit<KSplitConfig<kFp8, kBM, kBN>>(p);
}

}  // namespace mla::absorb
