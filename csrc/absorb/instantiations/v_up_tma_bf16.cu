// v_up with bf16 weights, the sm90a TMA + wgmma kernel (sm90/v_up_tma.cuh), its [BM, BN] tile
// shapes and weight loaders (TMA or cp.async); other targets compile it to a trap and never launch it.
#include "absorb/sm90/v_up_tma.cuh"

namespace mla::absorb {
template bool run_v_up_tma<false, 128, 128, false>(const AbsorbParams&);
template bool run_v_up_tma<false, 64, 128, false>(const AbsorbParams&);
template bool run_v_up_tma<false, 128, 64, false>(const AbsorbParams&);
template bool run_v_up_tma<false, 64, 64, false>(const AbsorbParams&);
template bool run_v_up_tma<false, 128, 128, true>(const AbsorbParams&);
template bool run_v_up_tma<false, 64, 128, true>(const AbsorbParams&);
template bool run_v_up_tma<false, 64, 64, true>(const AbsorbParams&);
}  // namespace mla::absorb
