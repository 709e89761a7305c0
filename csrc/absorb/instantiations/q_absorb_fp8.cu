// q_absorb with fp8 weights, all four tiers (one file per op and dtype so the build parallelises).
#include "absorb/absorb_gemm.cuh"

namespace mla::absorb {
template void launch_absorb_gemm<TierConfig<AbsorbOp::kQAbsorb, true, 0>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kQAbsorb, true, 1>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kQAbsorb, true, 2>>(const AbsorbParams&);
template void launch_absorb_gemm<TierConfig<AbsorbOp::kQAbsorb, true, 3>>(const AbsorbParams&);
}  // namespace mla::absorb
