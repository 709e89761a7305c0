// v_up with bf16 weights, all seven tiers (one file per op and dtype
// so that the build parallelises).
#include "absorb/absorb_gemm.cuh"

namespace mla::absorb {
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 0>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 1>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 2>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 3>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 4>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 5>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kVUp, false, 6>>(const AbsorbParams&);
}  // namespace mla::absorb
