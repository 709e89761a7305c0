// v_up with bf16 weights, the sm90a TMA + wgmma kernel with the weights streamed next to x
// (sm90/v_up_tma.cuh): the BM x BN tiles absorb.cu may pick, one tile per CTA or looped; other
// targets compile it to a trap and never launch it.
#include "absorb/sm90/v_up_tma.cuh"

namespace mla::absorb {
template bool run_v_up_tma_stream<64, 32, false>(const AbsorbParams&);
template bool run_v_up_tma_stream<64, 64, false>(const AbsorbParams&);
template bool run_v_up_tma_stream<64, 128, false>(const AbsorbParams&);
template bool run_v_up_tma_stream<128, 64, false>(const AbsorbParams&);
template bool run_v_up_tma_stream<128, 128, false>(const AbsorbParams&);
template bool run_v_up_tma_stream<64, 128, true>(const AbsorbParams&);
template bool run_v_up_tma_stream<128, 128, true>(const AbsorbParams&);
bool run_v_up_tma_mcast(const AbsorbParams& p) { return run_v_up_tma_mcast_impl(p); }
}  // namespace mla::absorb
