// Host dispatch of the absorbed projections: pick the kernel and tile tier by T, H, the GPU and
// the weight dtype.
#include "absorb/absorb.h"

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

// v_up's three kernels. MLA_EXT_VUP_KERNEL=splitk|wgmma|tiles forces one (tests run every path
// at every size with it; benchmarks measure the boundaries), otherwise:
//   - split-K over a cluster (sm90+) while one 128-row tile per head leaves SMs idle: T <= 32,
//     or T <= 512 with fewer than num_SMs such tiles in all (H = 16 up to T = 512);
//   - the wgmma kernel beyond, on sm90 unless MLA_EXT_FORCE_PORTABLE is set;
//   - the portable mma.sync tiles (tier 2 up to T = 512, tier 3 beyond) otherwise (sm100).
enum class VUpKernel { kSplitK, kWgmma, kTiles };

VUpKernel pick_v_up_kernel(const AbsorbParams& p) {
  const DeviceInfo& info = device_info(p.device);
  const bool clusters = info.sm_version >= 90;
  const bool wgmma = info.sm_version == 90 && !force_portable_from_env();
  const char* forced = std::getenv("MLA_EXT_VUP_KERNEL");
  if (forced != nullptr && forced[0] != '\0') {
    const std::string name(forced);
    if (name == "splitk") {
      MLA_HOST_CHECK(clusters, "MLA_EXT_VUP_KERNEL=splitk needs sm90+ (thread block clusters)");
      return VUpKernel::kSplitK;
    }
    if (name == "wgmma") {
      MLA_HOST_CHECK(info.sm_version == 90, "MLA_EXT_VUP_KERNEL=wgmma needs sm90");
      return VUpKernel::kWgmma;
    }
    MLA_HOST_CHECK(name == "tiles", "MLA_EXT_VUP_KERNEL must be splitk, wgmma or tiles, got " + name);
    return VUpKernel::kTiles;
  }
  const int64_t tiles128 = p.num_heads * ((p.num_tokens + 127) / 128);
  if (clusters && (p.num_tokens <= 32 || (p.num_tokens <= 512 && tiles128 < info.num_sms))) return VUpKernel::kSplitK;
  return wgmma ? VUpKernel::kWgmma : VUpKernel::kTiles;
}

template <bool kFp8>
void run_v_up(const AbsorbParams& p) {
  using namespace absorb;
  switch (pick_v_up_kernel(p)) {
    case VUpKernel::kSplitK:
      if (p.num_tokens <= 16) return run_v_up_splitk<kFp8, 16>(p);
      if (p.num_tokens <= 32) return run_v_up_splitk<kFp8, 32>(p);
      return run_v_up_splitk<kFp8, 64>(p);
    case VUpKernel::kWgmma:
      return run_v_up_wgmma<kFp8>(p);
    case VUpKernel::kTiles:
      return p.num_tokens <= 512 ? launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, kFp8, 2>>(p)
                                 : launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, kFp8, 3>>(p);
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
