// Host dispatch of the absorbed projections: pick the tile tier by T and the weight dtype.
#include "absorb/absorb.h"

#include "absorb/absorb_gemm.h"
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

// Narrow tiers exist for v_up only.
template <AbsorbOp kOp, bool kFp8, int kTier>
void launch_narrow(const AbsorbParams& p) {
  if constexpr (kOp == AbsorbOp::kVUp) {
    absorb::launch_absorb_gemm<absorb::TierConfig<kOp, kFp8, kTier>>(p);
  } else {
    MLA_HOST_CHECK(false, "narrow tiles are for v_up only");
  }
}

template <AbsorbOp kOp, bool kFp8>
void run_tiers(const AbsorbParams& p) {
  using namespace absorb;
  // v_up has N = 128 only: below ~one head per SM, narrow tiles (BN = 16) spread each head's
  // weights over 8 CTAs instead of one.
  const bool narrow = kOp == AbsorbOp::kVUp && p.num_heads < 96;
  switch (tier_for(p.num_tokens)) {
    case 0: return narrow ? launch_narrow<kOp, kFp8, 4>(p) : launch_absorb_gemm<TierConfig<kOp, kFp8, 0>>(p);
    case 1: return narrow ? launch_narrow<kOp, kFp8, 5>(p) : launch_absorb_gemm<TierConfig<kOp, kFp8, 1>>(p);
    case 2: return narrow ? launch_narrow<kOp, kFp8, 6>(p) : launch_absorb_gemm<TierConfig<kOp, kFp8, 2>>(p);
    default: return launch_absorb_gemm<TierConfig<kOp, kFp8, 3>>(p);
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
      run_tiers<AbsorbOp::kVUp, kFp8>(p);
    }
  });
}

}  // namespace mla
