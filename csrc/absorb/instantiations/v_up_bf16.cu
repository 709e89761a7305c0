// v_up with bf16 weights, the portable tiles, all four tiers (one file per op and dtype so that
// the build parallelises).
#include "absorb/absorb_gemm.cuh"

namespace mla::absorb {
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 0>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 1>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 2>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 3>>(const AbsorbParams&);
}  // namespace mla::absorb
