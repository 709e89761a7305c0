// v_up at medium T on sm90a (H >= 96, 64 < T <= 256; sm90/v_up_tma.cuh beyond): wgmma m64n128k16
// with both operands in shared memory, the head's whole weight resident, rows of x streaming
// through a cp.async pipeline. README.md (one level up) has the picture.
//
// Grid = (m_splits, H), m_splits = max(1, num_SMs / H): one wave, each CTA owns one head and the
// 128-row M tiles z, z + m_splits, ... of it. 256 threads = 2 warpgroups; warpgroup g computes
// rows [64 g, 64 g + 64) of a tile over all N = 128 output columns.
//   1. The head's W_UV[h]^T ([128 n, 512 k], 128 KiB) is loaded once into 8 K-major tiles
//      [128 n, 64 k] in the 128-byte swizzle: bf16 by cp.async, chunk kc riding with the first
//      tile's piece kc; e4m3 by 16-byte loads dequantised to bf16(w * scale) (never to global).
//   2. Pieces [128 rows, 64 k] of x stream through kStages stages (cp.async, zero-filled beyond
//      T); per piece each warpgroup issues 4 wgmma (k = 16 each) and waits for them before the
//      next barrier, so a stage is free when it is refilled. The loads run kStages - 1 pieces
//      ahead, which is what keeps HBM busy: the tensor work per piece is about half the time
//      its bytes take to arrive.
//   3. After the 8th piece of a tile: bf16 tile -> swizzled shared memory -> 16-byte stores.
// Why not mma.sync: at one 8-warp CTA per SM (the 128 KiB slice) mma.sync plus ldmatrix of both
// operands is latency bound at ~55% of copy bandwidth (Nsight Compute, README.md); wgmma issues
// a 64x128x16 product per instruction and reads shared memory itself.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "absorb/absorb.h"
#include "absorb/absorb_common.cuh"
#include "absorb/absorb_gemm.h"
#include "common/sm90/wgmma.cuh"
#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/sm80.cuh"

namespace mla::absorb {

template <bool kFp8_>
struct WgmmaVUpConfig {
  static constexpr bool kFp8 = kFp8_;
  static constexpr int BM = 128, N = kVHeadDim, K = kKvLoraRank, BK = 64;
  static constexpr int kChunks = K / BK;  // 8 pieces per tile
  // 4 stages and a staged epilogue fill the 227 KiB. 6 stages with the epilogue stored straight
  // from the accumulators (4-byte stores, no staging buffer) measured slower: 491 vs 413 us at
  // H = 128, T = 8192, 24.4 vs 19.6 us at T = 256.
  static constexpr int kStages = 4;
  static constexpr int kThreads = 256;    // 2 warpgroups x 64 rows
  static constexpr int kWChunkBytes = N * BK * 2;  // one [128 n, 64 k] tile: 16 KiB
  static constexpr int kWBytes = kChunks * kWChunkBytes;
  static constexpr int kABytes = BM * BK * 2;      // one stage: 16 KiB
  static constexpr int kCBytes = BM * N * 2;       // output staging: [128, 128] bf16
  static constexpr int kAOffset = kWBytes;
  static constexpr int kCOffset = kAOffset + kStages * kABytes;
  // + 1 KiB so that the base can be rounded up to the 1024 bytes the swizzle atoms need
  static constexpr int kSmemBytes = kCOffset + kCBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) v_up_wgmma_kernel(const __grid_constant__ AbsorbParams p) {
#if MLA_SM90A
  using namespace sm80;
  using namespace sm90;
  constexpr int BM = Cfg::BM, BK = Cfg::BK, kChunks = Cfg::kChunks, kStages = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_to_swizzle_atom(smem_raw);
  const uint32_t smem_w = smem_addr(smem);                // 8 x [128 n][8 chunks], swizzled
  const uint32_t smem_a = smem_w + Cfg::kAOffset;         // kStages x [128 rows][8 chunks]
  uint8_t* smem_c = smem + Cfg::kCOffset;                 // [128 rows][16 chunks]

  const int tid = threadIdx.x, wg = tid / 128, tid_wg = tid % 128, lane = tid % 32;
  const int64_t h = blockIdx.y;
  const int64_t num_tokens = p.num_tokens;
  const int num_tiles = static_cast<int>((num_tokens + BM - 1) / BM);
  const int my_tiles = static_cast<int>(blockIdx.x) < num_tiles ? (num_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int total_steps = my_tiles * kChunks;
  const auto* a_head = static_cast<const __nv_bfloat16*>(p.a) + h * p.stride_a_head;

  // Piece `step`: k chunk step % 8 of tile blockIdx.x + (step / 8) * gridDim.x into stage
  // step % kStages (plus, for bf16 weights, weight chunk `step` during the first tile). Always
  // commits a group, maybe empty, so that wait_group counts stay aligned.
  auto load_piece = [&](int step) {
    if (step < total_steps) {
      const int64_t tile = blockIdx.x + static_cast<int64_t>(step / kChunks) * gridDim.x;
      const int kc = step % kChunks;
      const uint32_t stage = smem_a + (step % kStages) * Cfg::kABytes;
#pragma unroll
      for (int i = tid; i < BM * 8; i += Cfg::kThreads) {
        const int r = i / 8, c = i % 8;
        const int64_t t = tile * BM + r;
        const bool valid = t < num_tokens;
        cp_async16(stage + swizzle(r, c, 8), a_head + (valid ? t : 0) * p.stride_a_token + kc * BK + c * 8, valid);
      }
      if (!Cfg::kFp8 && step < kChunks) {
        const auto* w = static_cast<const __nv_bfloat16*>(p.w) + h * (Cfg::N * Cfg::K) + kc * BK;
#pragma unroll
        for (int i = tid; i < Cfg::N * 8; i += Cfg::kThreads) {
          const int n = i / 8, c = i % 8;
          cp_async16(smem_w + kc * Cfg::kWChunkBytes + swizzle(n, c, 8), w + n * Cfg::K + c * 8, true);
        }
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_piece(s);

  if constexpr (Cfg::kFp8)
    dequant_w_uv_sw128<Cfg::kThreads>(smem, static_cast<const uint8_t*>(p.w) + h * (Cfg::N * Cfg::K),
                                      p.w_scale + h * kNumLatentBlocks, tid);

  float acc[64];
  for (int step = 0; step < total_steps; ++step) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async_smem();  // this thread's cp.async / st.shared data -> visible to wgmma
    __syncthreads();           // piece `step` complete for all threads; stage (step - 1) free
    load_piece(step + kStages - 1);

    const int kc = step % kChunks;
    const uint32_t stage = smem_a + (step % kStages) * Cfg::kABytes + wg * (64 * 128);
    const uint32_t w_tile = smem_w + kc * Cfg::kWChunkBytes;
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
      wgmma_m64n128k16_bf16(acc, kmajor_sw128_desc(stage + kk * 32), kmajor_sw128_desc(w_tile + kk * 32), kc > 0 || kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(acc);

    if (kc == kChunks - 1) {
      // ---- 3. epilogue: each warpgroup stages and stores its own 64 rows
      const int64_t tile = blockIdx.x + static_cast<int64_t>(step / kChunks) * gridDim.x;
      const int r0 = wg * 64 + (tid_wg / 32) * 16 + lane / 4;
#pragma unroll
      for (int i = 0; i < Cfg::N / 8; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          *reinterpret_cast<__nv_bfloat162*>(smem_c + swizzle(r0 + 8 * half, i, 16) + 4 * (lane % 4)) =
              __floats2bfloat162_rn(acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
      named_barrier(1 + wg, 128);
      auto* c_head = static_cast<__nv_bfloat16*>(p.c) + h * p.stride_c_head;
#pragma unroll
      for (int i = tid_wg; i < 64 * 16; i += 128) {
        const int r = wg * 64 + i / 16, c = i % 16;
        const int64_t t = tile * BM + r;
        if (t < num_tokens)
          *reinterpret_cast<uint4*>(c_head + t * p.stride_c_token + c * 8) =
              *reinterpret_cast<const uint4*>(smem_c + swizzle(r, c, 16));
      }
      // This warpgroup rewrites its rows of smem_c only after at least one more __syncthreads.
    }
  }
  cp_async_wait<0>();  // only empty groups can be pending here; leave nothing in flight
#elif defined(__CUDA_ARCH__)
  __trap();  // wgmma exists on sm_90a only; the host dispatch never launches this elsewhere
#endif
}

template <class Cfg>
void launch_v_up_wgmma(const AbsorbParams& p) {
  auto kernel = v_up_wgmma_kernel<Cfg>;
  opt_in_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, p.device);
  const int64_t num_tiles = (p.num_tokens + Cfg::BM - 1) / Cfg::BM;
  // One wave: as many M splits as leave no SM idle, each CTA loading its head's weights once.
  int64_t m_splits = device_info(p.device).num_sms / p.num_heads;
  m_splits = m_splits < 1 ? 1 : (m_splits > num_tiles ? num_tiles : m_splits);
  MLA_HOST_CHECK(p.num_heads <= 65535, "num_heads must be <= 65535 (grid.y)");
  const dim3 grid(static_cast<unsigned>(m_splits), static_cast<unsigned>(p.num_heads));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

template <bool kFp8>
void run_v_up_wgmma(const AbsorbParams& p) {
  launch_v_up_wgmma<WgmmaVUpConfig<kFp8>>(p);
}

}  // namespace mla::absorb
