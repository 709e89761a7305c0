// v_up with e4m3 weights, the sm90a cp.async + wgmma kernel (sm90/v_up_wgmma.cuh), 4 stages with a
// staged epilogue or 6 with a direct one; other targets compile it to a trap and never launch it.
#include "absorb/sm90/v_up_wgmma.cuh"

namespace mla::absorb {
template void run_v_up_wgmma<true, false>(const AbsorbParams&);
template void run_v_up_wgmma<true, true>(const AbsorbParams&);
}  // namespace mla::absorb
