// Tile configurations of the absorbed-projection GEMM (host-visible, no device code).
#pragma once

#include "absorb/absorb.h"

namespace mla::absorb {

// One CTA owns one head h and one block of BN output columns; it keeps that head's weight
// slice (all K rows x BN columns, as bf16) resident in shared memory and streams BM-row tiles
// of `a` through a cp.async pipeline of kStages stages of [BM, 64] bf16. Every weight byte is
// read from HBM once at small T; at large T each CTA amortises its slice over many M tiles.
template <AbsorbOp kOp_, bool kFp8_, int kBM, int kBN, int kWarpsM_, int kWarpsN_, int kStages_>
struct Config {
  static constexpr AbsorbOp kOp = kOp_;
  static constexpr bool kFp8 = kFp8_;  // weights e4m3 + [H, 4] scales, dequantised into smem
  static constexpr int BM = kBM, BN = kBN;
  static constexpr int K = kOp == AbsorbOp::kQAbsorb ? kQkNopeHeadDim : kKvLoraRank;
  static constexpr int N = kOp == AbsorbOp::kQAbsorb ? kKvLoraRank : kVHeadDim;
  // The stored weight's rows are k for q_absorb (W_UK_T[h]) and n for v_up (W_UV[h]^T).
  static constexpr bool kWeightRowsAreK = kOp == AbsorbOp::kQAbsorb;
  static constexpr int BK = 64;  // one pipeline stage: [BM, 64] bf16, rows of 128 bytes
  static constexpr int kChunksPerTile = K / BK;
  static constexpr int kStages = kStages_;
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int WM = BM / kWarpsM, WN = BN / kWarpsN;  // warp tile
  static constexpr int MT = WM / 16, NT = WN / 8;             // m16n8k16 tiles per warp
  // Resident weight slice as rows of 16-byte chunks: [K rows][BN / 8] or [BN rows][K / 8].
  static constexpr int kBRows = kWeightRowsAreK ? K : BN;
  static constexpr int kBRowChunks = (kWeightRowsAreK ? BN : K) / 8;
  static constexpr int kBBytes = kBRows * kBRowChunks * 16;
  static constexpr int kABytes = BM * BK * 2;  // one stage
  // Output tile staged in shared memory for 16-byte stores (rows of >= 128 bytes, which the
  // swizzle needs); narrow tiles store their fragments directly.
  static constexpr bool kStageC = BN >= 64;
  static constexpr int kCOffset = kBBytes + kStages * kABytes;
  static constexpr int kSmemBytes = kCOffset + (kStageC ? BM * BN * 2 : 0);
  static constexpr int kNumNBlocks = N / BN;
  static constexpr int kQPeChunksPerCta = 8 / kNumNBlocks;  // q_pe row = 8 chunks, split over N blocks

  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of m16 x n16");
  static_assert(BM == WM * kWarpsM && BN == WN * kWarpsN);
  static_assert(N % BN == 0 && K % BK == 0 && kStages >= 2);
  static_assert(kBRowChunks % 8 == 0, "the XOR swizzle needs rows of at least 128 bytes");
  static_assert(kWeightBlock % BN == 0 || !kWeightRowsAreK, "one fp8 scale per CTA for q_absorb");
  static_assert(8 % kNumNBlocks == 0 || kOp != AbsorbOp::kQAbsorb);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90/sm100");
};

// Tiers (absorb.cu picks one by T): BM = 16, 32, 64 at small T, where reading the weights (or
// the small output) dominates, and a 128-row GEMM tile at large T.
//   q_absorb (K = 128): tiers 0-2: BN = 64, 4 warps side by side on N (8 CTAs per head stream
//                       the weights); tier 3: 128 x 128, 2 x 4 warps. 3 stages cover a tile.
//   v_up (K = 512):     BN = 128 (all of N, so x is read once). Tiers 0-1: 8 warps on N, 9
//                       stages (all of K in flight); tier 2: 2 x 8 warps, 5 stages; tier 3:
//                       128 x 128, 4 x 4 warps, 4 stages, one CTA per SM (the slice is 128 KiB).
//                       absorb.cu uses them for H >= 96 at T <= 32, and on the portable path
//                       (sm100) at T > 32 (few heads: T > 512); the other cases take
//                       v_up_ksplit.cuh (few heads), sm90/v_up_tma.cuh or sm90/v_up_wgmma.cuh.
// Measured on the H200 (csrc/absorb/README.md has the numbers): large v_up as 128 x 64 tiles with
// two CTAs per SM was 20-25% slower than tier 3, and the 16-warp tier-2 tiles 5-7% slower than the
// 8-warp ones they replaced.
inline constexpr int kNumTiers = 4;
inline constexpr int kTierBM[kNumTiers] = {16, 32, 64, 128};

template <AbsorbOp kOp, bool kFp8, int kTier>
struct TierConfigOf;
template <bool kFp8, int kTier>
struct TierConfigOf<AbsorbOp::kQAbsorb, kFp8, kTier> {
  using type = Config<AbsorbOp::kQAbsorb, kFp8, kTierBM[kTier], kTier == 3 ? 128 : 64, kTier == 3 ? 2 : 1, 4, 3>;
};
template <bool kFp8, int kTier>
struct TierConfigOf<AbsorbOp::kVUp, kFp8, kTier> {
  static constexpr int kBM = kTierBM[kTier];
  using type = Config<AbsorbOp::kVUp, kFp8, kBM, 128, kTier == 3 ? 4 : (kBM == 64 ? 2 : 1), kTier == 3 ? 4 : 8,
                      kBM <= 32 ? 9 : (kTier == 3 ? 4 : 5)>;
};
template <AbsorbOp kOp, bool kFp8, int kTier>
using TierConfig = typename TierConfigOf<kOp, kFp8, kTier>::type;

// Defined in absorb_gemm.cuh, instantiated in instantiations/*.cu.
template <class Cfg>
void launch_absorb_gemm(const AbsorbParams& params);

// v_up's other kernels, instantiated in instantiations/v_up_{ksplit,wgmma}_*.cu: K split over a
// CTA's warps (v_up_ksplit.cuh; BM = 16 or 64, BN = 16, 32, 64, 128); wgmma for large T on sm90a
// (sm90/v_up_wgmma.cuh).
template <bool kFp8, int kBM, int kBN>
void run_v_up_ksplit(const AbsorbParams& params);
template <bool kFp8>
void run_v_up_wgmma(const AbsorbParams& params);
// TMA producer warp + wgmma consumer warpgroups on sm90a, kBM (64 or 128) x 128 tiles
// (sm90/v_up_tma.cuh). Returns false, launching nothing, where the driver refuses the tensor maps.
// The producer's schedule:
//   kDefault: all 8 bf16 weight tiles requested with the first round of x pieces (kStages of
//             them, before the first wait), x pieces kStages ahead.
//   kPaced:   weight tile kc requested with the first tile's piece kc, at most 4 pieces of the
//             first tile ahead; later tiles as kDefault. Measured (H200, H = 128, T = 256, 64-row
//             tiles, same run, 5 x median of 50): 18.82-19.14 us against kDefault's 19.14-19.28
//             (torch.bmm 18.29-18.59); e4m3 weights (dequantised, no weight loads) are unaffected.
enum class TmaVUpSchedule { kDefault, kPaced };
template <bool kFp8, int kBM>
bool run_v_up_tma(const AbsorbParams& params, TmaVUpSchedule schedule = TmaVUpSchedule::kDefault);
// The same with the weights streamed through the stages next to x instead of resident, kBM = 64
// (one consumer warpgroup; 128 has two) x kBN (32, 64, 128) tiles, one per CTA; bf16 weights
// only. Returns false as above.
template <int kBM, int kBN>
bool run_v_up_tma_stream(const AbsorbParams& params);

}  // namespace mla::absorb
