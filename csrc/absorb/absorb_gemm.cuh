// The absorbed-projection GEMM kernel: c[t, h, :] = a[t, h, :] x B_h, mma.sync m16n8k16 bf16
// with fp32 accumulation (sm80+, so it is also the code sm100 runs). README.md has the picture.
//
// Grid = (N / BN, H, m_splits). CTA (nb, h, z):
//   1. loads head h's weight slice for output columns [nb*BN, nb*BN + BN) into shared memory
//      once: bf16 by cp.async, one k chunk with each pipeline piece of the first M tile (the
//      first mma waits for one chunk, not the whole slice); or e4m3 by 16-byte loads dequantised
//      to bf16(w * scale), the rounding of the bf16 weights prepare_absorb_weights makes;
//   2. loops over M tiles z, z + m_splits, ...: the [BM, K] rows of `a` stream through a
//      kStages-deep cp.async pipeline in [BM, 64] pieces; each warp computes a WM x WN tile
//      (ldmatrix for A, ldmatrix / ldmatrix.trans for the resident weight);
//   3. stores the bf16 tile into c (row stride honoured; staged through shared memory for
//      16-byte stores where the budget allows) and, for q_absorb, copies its
//      share of q_pe (BN-block nb takes chunks nb * 8 / num_n_blocks ...) into columns 512..575.
// Shared memory rows of 16-byte chunks are XOR-swizzled (chunk ^ (row % 8)), so the 8 rows that
// one ldmatrix phase reads fall into 8 different bank groups.
#pragma once

#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>

#include "absorb/absorb_common.cuh"
#include "absorb/absorb_gemm.h"
#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/sm80.cuh"

namespace mla::absorb {

using sm80::cp_async16;
using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::ldmatrix_x4;
using sm80::ldmatrix_x4_trans;
using sm80::smem_addr;
using sm80::mma_16816;

// ---- The kernel -----------------------------------------------------------------------------

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) absorb_gemm_kernel(const __grid_constant__ AbsorbParams p) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, MT = Cfg::MT, NT = Cfg::NT;
  constexpr int kStages = Cfg::kStages, kChunksPerTile = Cfg::kChunksPerTile;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_b = smem_addr(smem);                 // resident weight slice (bf16)
  const uint32_t smem_a = smem_b + Cfg::kBBytes;           // kStages x [BM, 64] bf16

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  const int nb = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t num_tokens = p.num_tokens;
  const int num_tiles = static_cast<int>((num_tokens + BM - 1) / BM);
  const int my_tiles = static_cast<int>(blockIdx.z) < num_tiles ? (num_tiles - 1 - blockIdx.z) / gridDim.z + 1 : 0;
  const int total_steps = my_tiles * kChunksPerTile;

  const auto* a_head = static_cast<const __nv_bfloat16*>(p.a) + h * p.stride_a_head;

  // ---- 1. the weight slice: stored rows [row0, row0 + kBRows), columns [col0, col0 + 8*kBRowChunks)
  const int row0 = Cfg::kWeightRowsAreK ? 0 : nb * BN;
  const int col0 = Cfg::kWeightRowsAreK ? nb * BN : 0;

  // Piece `step` = A rows of tile (blockIdx.z + (step / kChunksPerTile) * gridDim.z), k chunk
  // step % kChunksPerTile, into stage step % kStages; for bf16 weights the first tile's pieces
  // also carry the weight slice's k chunk, so that the first mma waits for one chunk of the
  // weights, not all of them. Always commits a group (maybe empty): wait_group counts match.
  auto load_piece = [&](int step) {
    if (step < total_steps) {
      const int64_t tile = blockIdx.z + static_cast<int64_t>(step / kChunksPerTile) * gridDim.z;
      const int k0 = (step % kChunksPerTile) * BK;
      const uint32_t stage = smem_a + (step % kStages) * Cfg::kABytes;
#pragma unroll
      for (int i = tid; i < BM * 8; i += Cfg::kThreads) {
        const int r = i / 8, c = i % 8;
        const int64_t t = tile * BM + r;
        const bool valid = t < num_tokens;
        cp_async16(stage + swizzle(r, c, 8), a_head + (valid ? t : 0) * p.stride_a_token + k0 + c * 8, valid);
      }
      if (!Cfg::kFp8 && step < kChunksPerTile) {
        const auto* w = static_cast<const __nv_bfloat16*>(p.w) + h * (kQkNopeHeadDim * kKvLoraRank);
        // k chunk `step` of the slice: 64 stored rows (q_absorb) or 8 chunks of every row (v_up)
        constexpr int kRows = Cfg::kWeightRowsAreK ? BK : Cfg::kBRows;
        constexpr int kCols = Cfg::kWeightRowsAreK ? Cfg::kBRowChunks : BK / 8;
        const int r_first = Cfg::kWeightRowsAreK ? k0 : 0, c_first = Cfg::kWeightRowsAreK ? 0 : k0 / 8;
#pragma unroll 4
        for (int i = tid; i < kRows * kCols; i += Cfg::kThreads) {
          const int r = r_first + i / kCols, c = c_first + i % kCols;
          cp_async16(smem_b + swizzle(r, c, Cfg::kBRowChunks), w + (row0 + r) * kKvLoraRank + col0 + c * 8, true);
        }
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_piece(s);
  constexpr int kBChunks = Cfg::kBRows * Cfg::kBRowChunks;
  if constexpr (Cfg::kFp8) {
    // Each 16-byte load is 16 e4m3 = two bf16 chunks; loads are issued in batches before the
    // first conversion so that several are in flight per thread.
    const auto* w = static_cast<const uint8_t*>(p.w) + h * (kQkNopeHeadDim * kKvLoraRank);
    const float* scale = p.w_scale + h * kNumLatentBlocks;
    constexpr int kLoads = kBChunks / 2, kPairsPerRow = Cfg::kBRowChunks / 2, kBatch = 8;
    for (int base = tid; base < kLoads; base += Cfg::kThreads * kBatch) {
      uint4 raw[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = base + j * Cfg::kThreads;
        if (i < kLoads) {
          const int r = i / kPairsPerRow, col = col0 + (i % kPairsPerRow) * 16;
          raw[j] = __ldg(reinterpret_cast<const uint4*>(w + (row0 + r) * kKvLoraRank + col));
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = base + j * Cfg::kThreads;
        if (i < kLoads) {
          const int r = i / kPairsPerRow, pc = i % kPairsPerRow;
          uint4 out[2];
          dequant16_e4m3(raw[j], __ldg(scale + (col0 + pc * 16) / kWeightBlock), out);
          uint8_t* dst = smem + swizzle(r, 2 * pc, Cfg::kBRowChunks);
          *reinterpret_cast<uint4*>(dst) = out[0];
          dst = smem + swizzle(r, 2 * pc + 1, Cfg::kBRowChunks);
          *reinterpret_cast<uint4*>(dst) = out[1];
        }
      }
    }
  }

  // ---- 2. main loop over (tile, k chunk) pieces
  float acc[MT][NT][4];
  for (int step = 0; step < total_steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // piece `step` (A and weight chunk) visible; stage (step - 1) free
    load_piece(step + kStages - 1);

    const int kc = step % kChunksPerTile;
    if (kc == 0) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int nj = 0; nj < NT; ++nj)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mi][nj][e] = 0.f;
    }
    const uint32_t stage = smem_a + (step % kStages) * Cfg::kABytes;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const int row = warp_m * Cfg::WM + mi * 16 + lane % 16;
        ldmatrix_x4(af[mi], stage + swizzle(row, kk * 2 + lane / 16, 8));
      }
      const int k = kc * BK + kk * 16;  // k of this step within the resident slice
      const int quad = lane / 8;        // which 8x8 matrix this lane addresses
#pragma unroll
      for (int nj = 0; nj < NT; nj += 2) {
        const int n0 = warp_n * Cfg::WN + nj * 8;
        uint32_t b[4];  // (n-tile nj: k lo, k hi), (n-tile nj + 1: k lo, k hi)
        if constexpr (Cfg::kWeightRowsAreK) {
          const int r = k + (quad % 2) * 8 + lane % 8;
          ldmatrix_x4_trans(b, smem_b + swizzle(r, n0 / 8 + quad / 2, Cfg::kBRowChunks));
        } else {
          const int r = n0 + (quad / 2) * 8 + lane % 8;
          ldmatrix_x4(b, smem_b + swizzle(r, k / 8 + quad % 2, Cfg::kBRowChunks));
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_16816<__nv_bfloat16>(acc[mi][nj], af[mi], b[0], b[1]);
          mma_16816<__nv_bfloat16>(acc[mi][nj + 1], af[mi], b[2], b[3]);
        }
      }
    }

    // ---- 3. epilogue of a finished tile
    if (kc == kChunksPerTile - 1) {
      const int64_t tile = blockIdx.z + static_cast<int64_t>(step / kChunksPerTile) * gridDim.z;
      auto* c_head = static_cast<__nv_bfloat16*>(p.c) + h * p.stride_c_head;
      if constexpr (Cfg::kStageC) {
        // Through shared memory, so that global stores are 16 bytes per thread and whole rows
        // per warp (fragment stores would touch 8 rows with 16 bytes each per instruction).
        constexpr int kCRowChunks = BN / 8;
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = warp_m * Cfg::WM + mi * 16 + lane / 4 + 8 * half;
#pragma unroll
            for (int nj = 0; nj < NT; ++nj) {
              const int n = warp_n * Cfg::WN + nj * 8 + 2 * (lane % 4);
              *reinterpret_cast<__nv_bfloat162*>(smem + Cfg::kCOffset + swizzle(r, n / 8, kCRowChunks) + (n % 8) * 2) =
                  __floats2bfloat162_rn(acc[mi][nj][2 * half], acc[mi][nj][2 * half + 1]);
            }
          }
        }
        __syncthreads();
        for (int i = tid; i < BM * kCRowChunks; i += Cfg::kThreads) {
          const int r = i / kCRowChunks, c = i % kCRowChunks;
          const int64_t t = tile * BM + r;
          if (t < num_tokens)
            *reinterpret_cast<uint4*>(c_head + t * p.stride_c_token + nb * BN + c * 8) =
                *reinterpret_cast<const uint4*>(smem + Cfg::kCOffset + swizzle(r, c, kCRowChunks));
        }
        // The next tile's epilogue rewrites this buffer only after the next step's barrier.
      } else {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          const int64_t t = tile * BM + warp_m * Cfg::WM + mi * 16 + lane / 4;
#pragma unroll
          for (int nj = 0; nj < NT; ++nj) {
            const int n = nb * BN + warp_n * Cfg::WN + nj * 8 + 2 * (lane % 4);
            if (t < num_tokens)
              *reinterpret_cast<__nv_bfloat162*>(c_head + t * p.stride_c_token + n) =
                  __floats2bfloat162_rn(acc[mi][nj][0], acc[mi][nj][1]);
            if (t + 8 < num_tokens)
              *reinterpret_cast<__nv_bfloat162*>(c_head + (t + 8) * p.stride_c_token + n) =
                  __floats2bfloat162_rn(acc[mi][nj][2], acc[mi][nj][3]);
          }
        }
      }
      if constexpr (Cfg::kOp == AbsorbOp::kQAbsorb) {
        const auto* pe_head = static_cast<const __nv_bfloat16*>(p.q_pe) + h * p.stride_q_pe_head;
        constexpr int kPer = Cfg::kQPeChunksPerCta;
        for (int i = tid; i < BM * kPer; i += Cfg::kThreads) {
          const int64_t t = tile * BM + i / kPer;
          const int c = nb * kPer + i % kPer;
          if (t < num_tokens)
            *reinterpret_cast<uint4*>(c_head + t * p.stride_c_token + kKvLoraRank + c * 8) =
                *reinterpret_cast<const uint4*>(pe_head + t * p.stride_q_pe_token + c * 8);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be pending here; leave nothing in flight
}

// ---- Launcher ---------------------------------------------------------------------------------

template <class Cfg>
void launch_absorb_gemm(const AbsorbParams& p) {
  auto kernel = absorb_gemm_kernel<Cfg>;
  // Opt in to > 48 KiB of shared memory, and ask how many CTAs fit on an SM, once per device
  // (racing first calls ask twice and store the same answer).
  constexpr int kMaxDevices = 64;
  static std::atomic<int> ctas_per_sm_of[kMaxDevices] = {};
  MLA_HOST_CHECK(p.device >= 0 && p.device < kMaxDevices, "device index out of range");
  opt_in_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, p.device);
  int ctas_per_sm = ctas_per_sm_of[p.device].load(std::memory_order_relaxed);
  if (ctas_per_sm == 0) {
    MLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, Cfg::kThreads, Cfg::kSmemBytes));
    MLA_HOST_CHECK(ctas_per_sm >= 1, "absorb kernel does not fit on an SM");
    ctas_per_sm_of[p.device].store(ctas_per_sm, std::memory_order_relaxed);
  }
  const int64_t num_tiles = (p.num_tokens + Cfg::BM - 1) / Cfg::BM;
  const int64_t ctas = int64_t(Cfg::kNumNBlocks) * p.num_heads;
  // Split the M tiles over more CTAs while the GPU has room: up to one wave at small T (each
  // extra split re-reads the weight slice, and a second wave would wait for the first), about
  // four waves at large T (load balance; the slices then come from L2).
  const int64_t slots = int64_t(device_info(p.device).num_sms) * ctas_per_sm;
  int64_t m_splits = Cfg::BM >= 128 ? (4 * slots + ctas - 1) / ctas : slots / ctas;
  m_splits = m_splits < 1 ? 1 : (m_splits > num_tiles ? num_tiles : m_splits);
  MLA_HOST_CHECK(p.num_heads <= 65535, "num_heads must be <= 65535 (grid.y)");
  const dim3 grid(Cfg::kNumNBlocks, static_cast<unsigned>(p.num_heads), static_cast<unsigned>(m_splits));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

}  // namespace mla::absorb
