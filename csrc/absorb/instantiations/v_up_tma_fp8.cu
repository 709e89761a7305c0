// v_up with e4m3 weights, the sm90a TMA + wgmma kernel (sm90/v_up_tma.cuh) with 64- and 128-row
// tiles; other targets compile it to a trap and never launch it.
#include "absorb/sm90/v_up_tma.cuh"

namespace mla::absorb {
template bool run_v_up_tma<true, 64>(const AbsorbParams&, TmaVUpSchedule);
template bool run_v_up_tma<true, 128>(const AbsorbParams&, TmaVUpSchedule);
}  // namespace mla::absorb
