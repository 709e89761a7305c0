// v_up with bf16 weights, K split over a CTA's warps (v_up_ksplit.cuh): BM = 16 or 64 rows,
// BN = 16, 32, 64 or 128 columns per CTA.
#include "absorb/v_up_ksplit.cuh"

namespace mla::absorb {
template void run_v_up_ksplit<false, 16, 16, 1>(const AbsorbParams&);
template void run_v_up_ksplit<false, 16, 32, 1>(const AbsorbParams&);
template void run_v_up_ksplit<false, 16, 64, 1>(const AbsorbParams&);
template void run_v_up_ksplit<false, 16, 128, 1>(const AbsorbParams&);
template void run_v_up_ksplit<false, 64, 16, 1>(const AbsorbParams&);
template void run_v_up_ksplit<false, 64, 32, 1>(const AbsorbParams&);
template void run_v_up_ksplit<false, 64, 64, 1>(const AbsorbParams&);
template void run_v_up_ksplit<false, 64, 128, 1>(const AbsorbParams&);
}  // namespace mla::absorb
