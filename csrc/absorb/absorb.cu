// Host dispatch of the absorbed projections: pick the kernel and tile tier by T, H, the GPU and
// the weight dtype.
#include "absorb/absorb.h"

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

// v_up's kernels, the fastest measured on the H200 at each benchmarked T (README.md has the numbers):
//   sm90, bf16 weights, T > 16 (H < 96) or T > 32 (H >= 96), H * ceil(T / 64) <= the SM count:
//            the streamed-weight TMA kernel, 64-row tiles, BN = 32, 64 or 128 for about one CTA
//            per SM (H = 16: T <= 128 BN = 32, T <= 256 BN = 64; H = 128, T <= 64: BN = 128);
//   else H < 96:  T <= 128 ksplit (K split over a CTA's warps, BN for ~one CTA per SM); on sm90
//            T <= 512 TMA 64 x 128 tiles, beyond TMA 128 x 128 tiles; elsewhere ksplit up to
//            T = 512, then the tiles.
//   H >= 96: T <= 32 the tiles (one CTA per head, all of K in flight); on sm90 T <= 64 TMA
//            64 x 128 tiles, T <= 128 the cp.async wgmma kernel, T <= 256 TMA 64 x 128 tiles
//            with the paced schedule (bf16 weights; e4m3 weights TMA 128 x 128 tiles), beyond
//            TMA 128 x 128 tiles; elsewhere (sm100, forced portable) the tiles.
enum class VUpKernel { kKSplit, kWgmma, kTma128, kTma64, kTiles, kTmaStream };

struct VUpChoice {
  VUpKernel kernel;
  absorb::TmaVUpSchedule schedule = absorb::TmaVUpSchedule::kDefault;  // kTma128, kTma64
};

VUpChoice pick_v_up_kernel(const AbsorbParams& p) {
  const DeviceInfo& info = device_info(p.device);
  const bool sm90 = info.sm_version == 90 && !force_portable();
  const int64_t t = p.num_tokens;
  // bf16 weights, past the smallest T, while 64-row tiles of all heads fit in one wave: the
  // streamed-weight TMA kernel with BN for about one CTA per SM.
  const bool bf16 = p.weight_dtype == DType::kBF16;
  if (sm90 && bf16 && t > (p.num_heads < 96 ? 16 : 32) && p.num_heads * ((t + 63) / 64) <= info.num_sms)
    return {VUpKernel::kTmaStream};
  if (p.num_heads < 96) {
    if (t <= 128 || (!sm90 && t <= 512)) return {VUpKernel::kKSplit};
    if (!sm90) return {VUpKernel::kTiles};
    return {t <= 512 ? VUpKernel::kTma64 : VUpKernel::kTma128};
  }
  if (t <= 32 || !sm90) return {VUpKernel::kTiles};
  if (t <= 64) return {VUpKernel::kTma64};
  if (t <= 128) return {VUpKernel::kWgmma};
  if (t <= 256 && bf16) return {VUpKernel::kTma64, absorb::TmaVUpSchedule::kPaced};
  return {VUpKernel::kTma128};
}

// The streamed-weight kernel's BN: 64-row tiles, BN for about one CTA per SM.
int auto_stream_bn(const AbsorbParams& p) {
  const int64_t ctas = p.num_heads * ((p.num_tokens + 63) / 64);
  const int64_t room = device_info(p.device).num_sms / ctas;
  return room >= 4 ? 32 : room >= 2 ? 64 : 128;
}

// ksplit: BM = 16 up to 16 tokens, else 64; 128 / BN CTAs per (head, tile), the largest power of
// two <= 8 that keeps the grid within one CTA per SM (more CTAs per head re-read x from L2).
template <bool kFp8, int kBM>
void run_v_up_ksplit_bm(const AbsorbParams& p) {
  using absorb::run_v_up_ksplit;
  const int64_t ctas = p.num_heads * ((p.num_tokens + kBM - 1) / kBM);
  const int64_t room = device_info(p.device).num_sms / ctas;
  if (room >= 8) return run_v_up_ksplit<kFp8, kBM, 16>(p);
  if (room >= 4) return run_v_up_ksplit<kFp8, kBM, 32>(p);
  if (room >= 2) return run_v_up_ksplit<kFp8, kBM, 64>(p);
  return run_v_up_ksplit<kFp8, kBM, 128>(p);
}

// Where the driver refuses the tensor maps (strides TMA cannot express) the cp.async wgmma kernel
// runs instead.
template <bool kFp8>
void tma_refused(const AbsorbParams& p) {
  absorb::run_v_up_wgmma<kFp8>(p);
}

template <bool kFp8, int kBM>
void run_tma_or_fallback(const AbsorbParams& p, absorb::TmaVUpSchedule schedule = absorb::TmaVUpSchedule::kDefault) {
  if (!absorb::run_v_up_tma<kFp8, kBM>(p, schedule)) tma_refused<kFp8>(p);
}

// Streamed weights need bf16 weights (TMA); e4m3 weights take the resident-weight TMA kernel.
template <bool kFp8>
void run_tma_stream_or_fallback(const AbsorbParams& p) {
  if constexpr (kFp8) {
    run_tma_or_fallback<kFp8, 64>(p);
  } else {
    const int bn = auto_stream_bn(p);
    const bool ran = bn == 32   ? absorb::run_v_up_tma_stream<64, 32>(p)
                     : bn == 64 ? absorb::run_v_up_tma_stream<64, 64>(p)
                                : absorb::run_v_up_tma_stream<64, 128>(p);
    if (!ran) tma_refused<kFp8>(p);
  }
}

template <bool kFp8>
void run_v_up(const AbsorbParams& p) {
  using namespace absorb;
  const VUpChoice choice = pick_v_up_kernel(p);
  switch (choice.kernel) {
    case VUpKernel::kKSplit:
      return p.num_tokens <= 16 ? run_v_up_ksplit_bm<kFp8, 16>(p) : run_v_up_ksplit_bm<kFp8, 64>(p);
    case VUpKernel::kWgmma:
      return run_v_up_wgmma<kFp8>(p);
    case VUpKernel::kTma128:
      return run_tma_or_fallback<kFp8, 128>(p, choice.schedule);
    case VUpKernel::kTma64:
      return run_tma_or_fallback<kFp8, 64>(p, choice.schedule);
    case VUpKernel::kTiles:
      return run_tiers<AbsorbOp::kVUp, kFp8>(p);
    case VUpKernel::kTmaStream:
      return run_tma_stream_or_fallback<kFp8>(p);
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
