// v_up with bf16 weights, the sm90a TMA + wgmma kernel with the weights streamed next to x
// (sm90/v_up_tma.cuh), one tile of 64, 128, 192 or 256 rows per CTA; other targets compile it to a
// trap and never launch it.
#include "absorb/sm90/v_up_tma.cuh"

namespace mla::absorb {
template bool run_v_up_tma_stream<64>(const AbsorbParams&);
template bool run_v_up_tma_stream<128>(const AbsorbParams&);
template bool run_v_up_tma_stream<192>(const AbsorbParams&);
template bool run_v_up_tma_stream<256>(const AbsorbParams&);
}  // namespace mla::absorb
