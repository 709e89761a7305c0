// v_up with e4m3 weights, the sm90a wgmma kernel (sm90/v_up_wgmma.cuh; other targets compile
// it to a trap and never launch it).
#include "absorb/sm90/v_up_wgmma.cuh"

namespace mla::absorb {
template void run_v_up_wgmma<true>(const AbsorbParams&);
}  // namespace mla::absorb
