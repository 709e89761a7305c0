// v_up with e4m3 weights, the portable tiles, all four tiers (one file per op and dtype so that
// the build parallelises).
#include "absorb/absorb_gemm.cuh"

namespace mla::absorb {
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, true, 0>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, true, 1>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, true, 2>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, true, 3>>(const AbsorbParams&);
}  // namespace mla::absorb
