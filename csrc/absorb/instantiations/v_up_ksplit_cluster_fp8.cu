// v_up with e4m3 weights, K split over a cluster of 2 or 4 CTAs and their warps (v_up_ksplit.cuh):
// (BM, BN, kSplits) as absorb.cu may pick them.
#include "absorb/v_up_ksplit.cuh"

namespace mla::absorb {
template void run_v_up_ksplit<true, 64, 32, 2>(const AbsorbParams&);
template void run_v_up_ksplit<true, 64, 64, 2>(const AbsorbParams&);
template void run_v_up_ksplit<true, 64, 128, 2>(const AbsorbParams&);
template void run_v_up_ksplit<true, 128, 64, 2>(const AbsorbParams&);
template void run_v_up_ksplit<true, 64, 64, 4>(const AbsorbParams&);
template void run_v_up_ksplit<true, 64, 128, 4>(const AbsorbParams&);
template void run_v_up_ksplit<true, 128, 64, 4>(const AbsorbParams&);
template void run_v_up_ksplit<true, 128, 128, 4>(const AbsorbParams&);
}  // namespace mla::absorb
