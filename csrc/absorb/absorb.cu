// Host dispatch of the absorbed projections: pick the tile tier by T and the weight dtype.
#include "absorb/absorb.h"

#include "absorb/absorb_gemm.h"
#include "common/cuda_check.h"
#include "common/dispatch.h"

#include <cstdlib>

namespace mla {
namespace {

// Up to 512 tokens the smallest BM that covers T (16, 32, 64; BN = 64 so that many CTAs stream
// the weights); beyond, the large-T GEMM tiles (128 x 128, 8 warps).
int tier_for(int64_t num_tokens) {
  if (num_tokens <= 16) return 0;
  if (num_tokens <= 32) return 1;
  if (num_tokens <= 512) return 2;
  return 3;
}

// Large-T v_up: tier 3 (1 CTA of 8 warps per SM, whole weight slice resident) unless
// MLA_EXT_ABSORB_VUP_TIER4 is set (two CTAs per SM, half the weight slice each).
bool v_up_tier4_from_env() {
  const char* v = std::getenv("MLA_EXT_ABSORB_VUP_TIER4");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

template <AbsorbOp kOp, bool kFp8>
void run_tiers(const AbsorbParams& p) {
  using namespace absorb;
  switch (tier_for(p.num_tokens)) {
    case 0: return launch_absorb_gemm<TierConfig<kOp, kFp8, 0>>(p);
    case 1: return launch_absorb_gemm<TierConfig<kOp, kFp8, 1>>(p);
    case 2: return launch_absorb_gemm<TierConfig<kOp, kFp8, 2>>(p);
    default:
      if constexpr (kOp == AbsorbOp::kVUp) {
        if (v_up_tier4_from_env()) return launch_absorb_gemm<TierConfig<kOp, kFp8, 4>>(p);
      }
      return launch_absorb_gemm<TierConfig<kOp, kFp8, 3>>(p);
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
