// v_up at small T and few heads: K (the 512 latent columns) split over a cluster of 8 CTAs, each
// streaming one 64-column slice of the head's weight, partial sums reduced through distributed
// shared memory in a fixed order (deterministic: no atomics). mma.sync m16n8k16, sm90+ (thread
// block clusters), so the same code runs on sm90 and sm100. README.md has the picture.
//
// Grid = (8, H, ceil(T / BM)), cluster = the 8 CTAs of one (head, M tile). CTA (kz, h, m):
//   1. cp.async: W_UV[h]^T[:, 64 kz : 64 kz + 64] ([128 n, 64 k], 16 KiB) and the tile's rows of
//      x[:, h, 64 kz : 64 kz + 64] ([BM, 64]); e4m3 weights are loaded with 16-byte loads and
//      dequantised to bf16(w * scale) (one scale per CTA: a slice lies in one 128-column block);
//   2. [BM, 64] x [64, 128] with mma.sync (4 k16 steps), fp32 partial into shared memory (over
//      the now-dead weight slice);
//   3. cluster barrier; rank kz sums rows [kz BM / 8, (kz + 1) BM / 8) of the 8 partials, rank 0
//      first, and stores them as bf16; a second cluster barrier keeps every partial alive until
//      all ranks have read it.
// Why: at T <= 32, or few heads, one CTA per head (or per 16 output columns) leaves most SMs idle
// and walks K = 512 in a dependent chain; here 8 CTAs per (head, tile) each wait for one load.
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

template <bool kFp8_, int kBM>
struct SplitKConfig {
  static constexpr bool kFp8 = kFp8_;
  static constexpr int BM = kBM;
  static constexpr int kSplits = 8;                   // cluster size (the portable maximum)
  static constexpr int KS = kKvLoraRank / kSplits;    // 64 k per CTA: one 128-byte row per n
  static constexpr int N = kVHeadDim;
  static constexpr int kWarpsM = BM == 16 ? 1 : 2, kWarpsN = 4 / kWarpsM;
  static constexpr int kThreads = 128;
  static constexpr int WM = BM / kWarpsM, WN = N / kWarpsN;
  static constexpr int MT = WM / 16, NT = WN / 8;
  static constexpr int kWBytes = N * KS * 2;          // [128 n, 64 k] bf16
  static constexpr int kXBytes = BM * KS * 2;         // [BM, 64] bf16
  // fp32 partial [BM, 128]; rows padded by 8 floats so that the 8 rows one fragment store
  // touches spread over the banks (2-way instead of 8-way conflicts).
  static constexpr int kPartialStride = N + 8;
  static constexpr int kPartialBytes = BM * kPartialStride * 4;
  static constexpr int kSmemBytes = kWBytes + kXBytes > kPartialBytes ? kWBytes + kXBytes : kPartialBytes;
  static constexpr int kRowsPerRank = BM / kSplits;

  static_assert(BM % 16 == 0 && BM % kSplits == 0 && WN % 16 == 0);
  static_assert(KS <= kWeightBlock && kWeightBlock % KS == 0, "one fp8 scale per CTA");
  static_assert(kSmemBytes <= 48 * 1024, "no opt-in needed: several CTAs per SM");
};

template <class Cfg>
__global__ void __cluster_dims__(Cfg::kSplits, 1, 1) __launch_bounds__(Cfg::kThreads)
    v_up_splitk_kernel(const __grid_constant__ AbsorbParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace sm80;
  namespace cg = cooperative_groups;
  constexpr int BM = Cfg::BM, KS = Cfg::KS, MT = Cfg::MT, NT = Cfg::NT;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_w = smem_addr(smem);                // [128 n][8 chunks], swizzled
  const uint32_t smem_x = smem_w + Cfg::kWBytes;          // [BM][8 chunks], swizzled
  float* partial = reinterpret_cast<float*>(smem);        // [BM][kPartialStride], after the mma

  cg::cluster_group cluster = cg::this_cluster();
  const int kz = static_cast<int>(cluster.block_rank());  // == blockIdx.x
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  const int64_t h = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * BM;
  const int k0 = kz * KS;

  // ---- 1. loads
  const auto* x_head = static_cast<const __nv_bfloat16*>(p.a) + h * p.stride_a_head + k0;
#pragma unroll
  for (int i = tid; i < BM * 8; i += Cfg::kThreads) {
    const int r = i / 8, c = i % 8;
    const bool valid = row0 + r < p.num_tokens;
    cp_async16(smem_x + swizzle(r, c, 8), x_head + (valid ? row0 + r : 0) * p.stride_a_token + c * 8, valid);
  }
  if constexpr (!Cfg::kFp8) {
    const auto* w = static_cast<const __nv_bfloat16*>(p.w) + h * (kVHeadDim * kKvLoraRank) + k0;
#pragma unroll
    for (int i = tid; i < Cfg::N * 8; i += Cfg::kThreads) {
      const int n = i / 8, c = i % 8;
      cp_async16(smem_w + swizzle(n, c, 8), w + n * kKvLoraRank + c * 8, true);
    }
    cp_async_commit();
  } else {
    cp_async_commit();
    // 64 e4m3 per row = 4 loads of 16; all issued before the first conversion.
    const auto* w = static_cast<const uint8_t*>(p.w) + h * (kVHeadDim * kKvLoraRank) + k0;
    const float scale = __ldg(p.w_scale + h * kNumLatentBlocks + k0 / kWeightBlock);
    constexpr int kLoads = Cfg::N * KS / 16 / Cfg::kThreads;
    uint4 raw[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int i = tid + j * Cfg::kThreads;
      raw[j] = __ldg(reinterpret_cast<const uint4*>(w + (i / 4) * kKvLoraRank + (i % 4) * 16));
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int i = tid + j * Cfg::kThreads, n = i / 4, c = 2 * (i % 4);
      uint4 out[2];
      dequant16_e4m3(raw[j], scale, out);
      *reinterpret_cast<uint4*>(smem + swizzle(n, c, 8)) = out[0];
      *reinterpret_cast<uint4*>(smem + swizzle(n, c + 1, 8)) = out[1];
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- 2. [BM, 64] x [64, 128] into fp32 fragments
  float acc[MT][NT][4] = {};
#pragma unroll
  for (int kk = 0; kk < KS / 16; ++kk) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      const int row = warp_m * Cfg::WM + mi * 16 + lane % 16;
      ldmatrix_x4(af[mi], smem_x + swizzle(row, kk * 2 + lane / 16, 8));
    }
    const int quad = lane / 8;  // which 8x8 matrix this lane addresses
#pragma unroll
    for (int nj = 0; nj < NT; nj += 2) {
      uint32_t b[4];  // (n-tile nj: k lo, k hi), (n-tile nj + 1: k lo, k hi)
      const int n = warp_n * Cfg::WN + nj * 8 + (quad / 2) * 8 + lane % 8;
      ldmatrix_x4(b, smem_w + swizzle(n, kk * 2 + quad % 2, 8));
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        mma_16816<__nv_bfloat16>(acc[mi][nj], af[mi], b[0], b[1]);
        mma_16816<__nv_bfloat16>(acc[mi][nj + 1], af[mi], b[2], b[3]);
      }
    }
  }
  __syncthreads();  // every warp is done with the weight slice: the partial overwrites it
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = warp_m * Cfg::WM + mi * 16 + lane / 4 + 8 * half;
#pragma unroll
      for (int nj = 0; nj < NT; ++nj) {
        const int n = warp_n * Cfg::WN + nj * 8 + 2 * (lane % 4);
        *reinterpret_cast<float2*>(partial + r * Cfg::kPartialStride + n) =
            make_float2(acc[mi][nj][2 * half], acc[mi][nj][2 * half + 1]);
      }
    }

  // ---- 3. reduction over the cluster, in rank order
  cluster.sync();  // release/acquire: every CTA's partial is visible to the whole cluster
  auto* out_head = static_cast<__nv_bfloat16*>(p.c) + h * p.stride_c_head;
  for (int i = tid; i < Cfg::kRowsPerRank * (Cfg::N / 4); i += Cfg::kThreads) {
    const int r = kz * Cfg::kRowsPerRank + i / (Cfg::N / 4), c = (i % (Cfg::N / 4)) * 4;
    if (row0 + r >= p.num_tokens) continue;
    float* mine = partial + r * Cfg::kPartialStride + c;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int q = 0; q < Cfg::kSplits; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(mine, q));
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x, sum.y), hi = __floats2bfloat162_rn(sum.z, sum.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(out_head + (row0 + r) * p.stride_c_token + c) = packed;
  }
  cluster.sync();  // no CTA leaves (freeing its shared memory) while another still reads it
#elif defined(__CUDA_ARCH__)
  __trap();  // thread block clusters need sm90+; the host dispatch never launches this below
#endif
}

template <class Cfg>
void launch_v_up_splitk(const AbsorbParams& p) {
  const int64_t num_tiles = (p.num_tokens + Cfg::BM - 1) / Cfg::BM;
  MLA_HOST_CHECK(p.num_heads <= 65535 && num_tiles <= 65535, "v_up split-K: grid too large (H or T)");
  const dim3 grid(Cfg::kSplits, static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_tiles));
  v_up_splitk_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

template <bool kFp8, int kBM>
void run_v_up_splitk(const AbsorbParams& p) {
  launch_v_up_splitk<SplitKConfig<kFp8, kBM>>(p);
}

}  // namespace mla::absorb
