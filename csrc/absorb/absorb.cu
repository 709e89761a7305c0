// Host dispatch of the absorbed projections: pick the kernel and tile tier by T, H, the GPU and
// the weight dtype.
#include "absorb/absorb.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absorb/absorb_gemm.h"
#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/dispatch.h"

namespace mla {
namespace {

// Up to 512 tokens the smallest BM that covers T (16, 32, 64), where streaming the weights
// dominates; beyond, the large-T GEMM tiles (BM = 128). absorb_gemm.h lists the tiers.
int tier_for(int64_t num_tokens) {
  if (num_tokens <= 16) return 0;
  if (num_tokens <= 32) return 1;
  if (num_tokens <= 512) return 2;
  return 3;
}

template <AbsorbOp kOp, bool kFp8>
void run_tiers(const AbsorbParams& p) {
  using namespace absorb;
  switch (tier_for(p.num_tokens)) {
    case 0: return launch_absorb_gemm<TierConfig<kOp, kFp8, 0>>(p);
    case 1: return launch_absorb_gemm<TierConfig<kOp, kFp8, 1>>(p);
    case 2: return launch_absorb_gemm<TierConfig<kOp, kFp8, 2>>(p);
    default: return launch_absorb_gemm<TierConfig<kOp, kFp8, 3>>(p);
  }
}

// v_up's kernels. MLA_EXT_VUP_KERNEL forces one (tests run every kernel at every size with it;
// the benchmark's --sweep-v-up measures each at every size):
//   ksplit             K split over a CTA's warps, (BM, BN, kSplits) picked by T and H below
//   ksplit:BMxBNxKS    ... with that tile and cluster split (the instantiated ones: kKSplitTiles)
//   wgmma, tma128, tma64, tiles   the other kernels (tiles: the tier by T)
//   tiles64, tiles64w2 64-row tiles with all of K in flight, 1 x 8 or 2 x 4 warps
//   tmas, tmas64 .. tmas256   TMA kernel with streamed weights, BM by T or forced (bf16 weights;
//                      e4m3 weights take the resident-weight TMA kernel of the same BM <= 128)
// otherwise the fastest measured on the H200 at the benchmarked T (README.md has the numbers):
//   H < 96:  T <= 128 ksplit (K split over a CTA's warps, BN for ~one CTA per SM); on sm90
//            T <= 512 TMA 64 x 128 tiles, beyond TMA 128 x 128 tiles; elsewhere ksplit up to
//            T = 512, then the tiles.
//   H >= 96: T <= 32 the tiles (one CTA per head, all of K in flight); on sm90 T <= 64 TMA
//            64 x 128 tiles, T <= 256 the cp.async wgmma kernel, beyond TMA 128 x 128 tiles;
//            elsewhere (sm100, MLA_EXT_FORCE_PORTABLE=1) the tiles.
enum class VUpKernel { kKSplit, kWgmma, kTma128, kTma64, kTiles, kTiles64, kTiles64W2, kTmaStream };

struct VUpChoice {
  VUpKernel kernel;
  int bm = 0, bn = 0, splits = 0;  // ksplit: 0 = by T and H; tmas: bm 0 = by T
};

// (BM, BN, kSplits) of the instantiated ksplit kernels (instantiations/v_up_ksplit*.cu).
struct KSplitTile {
  int bm, bn, splits;
};
constexpr KSplitTile kKSplitTiles[] = {
    {16, 16, 1}, {16, 32, 1}, {16, 64, 1}, {16, 128, 1}, {64, 16, 1},  {64, 32, 1},  {64, 64, 1},  {64, 128, 1},
    {64, 32, 2}, {64, 64, 2}, {64, 128, 2}, {128, 64, 2}, {64, 64, 4}, {64, 128, 4}, {128, 64, 4}, {128, 128, 4}};

VUpChoice forced_v_up_kernel(const std::string& name, const DeviceInfo& info) {
  const bool sm90_only = name == "wgmma" || name == "tma128" || name == "tma64" || name.rfind("tmas", 0) == 0;
  MLA_HOST_CHECK(!sm90_only || info.sm_version == 90, "MLA_EXT_VUP_KERNEL=" + name + " needs sm90");
  if (name == "ksplit") return {VUpKernel::kKSplit};
  if (name.rfind("ksplit:", 0) == 0) {
    int bm = 0, bn = 0, splits = 0;
    char tail = 0;
    const int got = std::sscanf(name.c_str() + 7, "%dx%dx%d%c", &bm, &bn, &splits, &tail);
    bool known = false;
    for (const KSplitTile& t : kKSplitTiles) known |= got == 3 && t.bm == bm && t.bn == bn && t.splits == splits;
    MLA_HOST_CHECK(known, "MLA_EXT_VUP_KERNEL=" + name + ": no such ksplit tile (BMxBNxKS, see absorb.cu)");
    MLA_HOST_CHECK(splits == 1 || info.sm_version >= 90, "MLA_EXT_VUP_KERNEL=" + name + " needs clusters (sm90+)");
    return {VUpKernel::kKSplit, bm, bn, splits};
  }
  if (name == "wgmma") return {VUpKernel::kWgmma};
  if (name == "tma128") return {VUpKernel::kTma128};
  if (name == "tma64") return {VUpKernel::kTma64};
  if (name == "tiles64") return {VUpKernel::kTiles64};
  if (name == "tiles64w2") return {VUpKernel::kTiles64W2};
  if (name == "tmas") return {VUpKernel::kTmaStream};
  for (int bm : {64, 128, 192, 256})
    if (name == "tmas" + std::to_string(bm)) return {VUpKernel::kTmaStream, bm};
  MLA_HOST_CHECK(name == "tiles", "MLA_EXT_VUP_KERNEL must be ksplit, ksplit:BMxBNxKS, wgmma, tma128, tma64, tiles, "
                                  "tiles64, tiles64w2, tmas or tmas64..tmas256, got " + name);
  return {VUpKernel::kTiles};
}

VUpChoice pick_v_up_kernel(const AbsorbParams& p) {
  const DeviceInfo& info = device_info(p.device);
  const bool sm90 = info.sm_version == 90 && !force_portable_from_env();
  const char* forced = std::getenv("MLA_EXT_VUP_KERNEL");
  if (forced != nullptr && forced[0] != '\0') return forced_v_up_kernel(forced, info);
  const int64_t t = p.num_tokens;
  if (p.num_heads < 96) {
    if (t <= 128 || (!sm90 && t <= 512)) return {VUpKernel::kKSplit};
    if (!sm90) return {VUpKernel::kTiles};
    return {t <= 512 ? VUpKernel::kTma64 : VUpKernel::kTma128};
  }
  if (t <= 32 || !sm90) return {VUpKernel::kTiles};
  if (t <= 64) return {VUpKernel::kTma64};
  return {t <= 256 ? VUpKernel::kWgmma : VUpKernel::kTma128};
}

// ksplit without a forced tile: BM = 16 up to 16 tokens, else 64; 128 / BN CTAs per (head, tile),
// the largest power of two <= 8 that keeps the grid within one CTA per SM (more CTAs per head
// re-read x from L2).
KSplitTile auto_ksplit_tile(const AbsorbParams& p) {
  const int bm = p.num_tokens <= 16 ? 16 : 64;
  const int64_t ctas = p.num_heads * ((p.num_tokens + bm - 1) / bm);
  const int64_t room = device_info(p.device).num_sms / ctas;
  return {bm, room >= 8 ? 16 : room >= 4 ? 32 : room >= 2 ? 64 : 128, 1};
}

template <bool kFp8, int kBM, int kBN, int kSplits>
bool try_ksplit(const KSplitTile& tile, const AbsorbParams& p) {
  if (tile.bm != kBM || tile.bn != kBN || tile.splits != kSplits) return false;
  absorb::run_v_up_ksplit<kFp8, kBM, kBN, kSplits>(p);
  return true;
}

template <bool kFp8>
void run_v_up_ksplit_tile(const KSplitTile& tile, const AbsorbParams& p) {
  // one entry per kKSplitTiles row
  const bool ran = try_ksplit<kFp8, 16, 16, 1>(tile, p) || try_ksplit<kFp8, 16, 32, 1>(tile, p) ||
                   try_ksplit<kFp8, 16, 64, 1>(tile, p) || try_ksplit<kFp8, 16, 128, 1>(tile, p) ||
                   try_ksplit<kFp8, 64, 16, 1>(tile, p) || try_ksplit<kFp8, 64, 32, 1>(tile, p) ||
                   try_ksplit<kFp8, 64, 64, 1>(tile, p) || try_ksplit<kFp8, 64, 128, 1>(tile, p) ||
                   try_ksplit<kFp8, 64, 32, 2>(tile, p) || try_ksplit<kFp8, 64, 64, 2>(tile, p) ||
                   try_ksplit<kFp8, 64, 128, 2>(tile, p) || try_ksplit<kFp8, 128, 64, 2>(tile, p) ||
                   try_ksplit<kFp8, 64, 64, 4>(tile, p) || try_ksplit<kFp8, 64, 128, 4>(tile, p) ||
                   try_ksplit<kFp8, 128, 64, 4>(tile, p) || try_ksplit<kFp8, 128, 128, 4>(tile, p);
  MLA_HOST_CHECK(ran, "v_up: no ksplit kernel for this tile");
}

// Where the driver refuses the tensor maps (strides TMA cannot express) the cp.async wgmma kernel
// runs instead, unless a TMA kernel was forced (tests must know which kernel they checked).
void tma_refused(const AbsorbParams& p) {
  const char* forced = std::getenv("MLA_EXT_VUP_KERNEL");
  MLA_HOST_CHECK(forced == nullptr || forced[0] == '\0', "v_up: the driver refused the TMA kernel's tensor maps");
}

template <bool kFp8, int kBM>
void run_tma_or_fallback(const AbsorbParams& p) {
  if (absorb::run_v_up_tma<kFp8, kBM>(p)) return;
  tma_refused(p);
  absorb::run_v_up_wgmma<kFp8>(p);
}

// Streamed weights need bf16 weights (TMA); e4m3 weights take the resident-weight TMA kernel.
template <bool kFp8>
void run_tma_stream_or_fallback(int bm, const AbsorbParams& p) {
  if (bm == 0) bm = p.num_tokens <= 64 ? 64 : p.num_tokens <= 128 ? 128 : p.num_tokens <= 192 ? 192 : 256;
  if constexpr (kFp8) {
    return bm <= 64 ? run_tma_or_fallback<kFp8, 64>(p) : run_tma_or_fallback<kFp8, 128>(p);
  } else {
    const bool ran = bm == 64    ? absorb::run_v_up_tma_stream<64>(p)
                     : bm == 128 ? absorb::run_v_up_tma_stream<128>(p)
                     : bm == 192 ? absorb::run_v_up_tma_stream<192>(p)
                                 : absorb::run_v_up_tma_stream<256>(p);
    if (ran) return;
    tma_refused(p);
    absorb::run_v_up_wgmma<kFp8>(p);
  }
}

template <bool kFp8>
void run_v_up(const AbsorbParams& p) {
  using namespace absorb;
  const VUpChoice choice = pick_v_up_kernel(p);
  switch (choice.kernel) {
    case VUpKernel::kKSplit:
      return run_v_up_ksplit_tile<kFp8>(choice.bm != 0 ? KSplitTile{choice.bm, choice.bn, choice.splits} : auto_ksplit_tile(p), p);
    case VUpKernel::kWgmma:
      return run_v_up_wgmma<kFp8>(p);
    case VUpKernel::kTma128:
      return run_tma_or_fallback<kFp8, 128>(p);
    case VUpKernel::kTma64:
      return run_tma_or_fallback<kFp8, 64>(p);
    case VUpKernel::kTiles:
      return run_tiers<AbsorbOp::kVUp, kFp8>(p);
    case VUpKernel::kTiles64:
      return launch_absorb_gemm<VUpTiles64Config<kFp8, 1>>(p);
    case VUpKernel::kTiles64W2:
      return launch_absorb_gemm<VUpTiles64Config<kFp8, 2>>(p);
    case VUpKernel::kTmaStream:
      return run_tma_stream_or_fallback<kFp8>(choice.bm, p);
  }
}

}  // namespace

void run_absorb(const AbsorbParams& p) {
  if (p.num_tokens == 0 || p.num_heads == 0) return;
  MLA_HOST_CHECK(p.weight_dtype != DType::kFP8E4M3 || p.w_scale != nullptr, "fp8 weights need block scales");
  MLA_HOST_CHECK(p.op != AbsorbOp::kQAbsorb || p.q_pe != nullptr, "q_absorb needs q_pe");
  const bool fp8 = p.weight_dtype == DType::kFP8E4M3;
  MLA_HOST_CHECK(fp8 || p.weight_dtype == DType::kBF16, "weights must be bfloat16 or float8_e4m3fn");
  MLA_BOOL_SWITCH(fp8, kFp8, [&] {
    if (p.op == AbsorbOp::kQAbsorb) {
      run_tiers<AbsorbOp::kQAbsorb, kFp8>(p);
    } else {
      run_v_up<kFp8>(p);
    }
  });
}

}  // namespace mla
