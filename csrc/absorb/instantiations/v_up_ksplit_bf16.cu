// v_up with bf16 weights, K split over a CTA's warps (v_up_ksplit.cuh): BM = 16 or 64 rows,
// BN = 16, 32, 64 or 128 columns per CTA.
#include "absorb/v_up_ksplit.cuh"

namespace mla::absorb {
template void run_v_up_ksplit<false, 16, 16>(const AbsorbParams&);
template void run_v_up_ksplit<false, 16, 32>(const AbsorbParams&);
template void run_v_up_ksplit<false, 16, 64>(const AbsorbParams&);
template void run_v_up_ksplit<false, 16, 128>(const AbsorbParams&);
template void run_v_up_ksplit<false, 64, 16>(const AbsorbParams&);
template void run_v_up_ksplit<false, 64, 32>(const AbsorbParams&);
template void run_v_up_ksplit<false, 64, 64>(const AbsorbParams&);
template void run_v_up_ksplit<false, 64, 128>(const AbsorbParams&);
}  // namespace mla::absorb
