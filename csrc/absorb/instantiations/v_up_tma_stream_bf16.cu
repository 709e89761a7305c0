// v_up with bf16 weights, the sm90a TMA + wgmma kernel with the weights streamed next to x
// (sm90/v_up_tma.cuh): the 64 x BN tiles absorb.cu picks; other targets compile it to a trap and
// never launch it.
#include "absorb/sm90/v_up_tma.cuh"

namespace mla::absorb {
template bool run_v_up_tma_stream<64, 32>(const AbsorbParams&);
template bool run_v_up_tma_stream<64, 64>(const AbsorbParams&);
template bool run_v_up_tma_stream<64, 128>(const AbsorbParams&);
}  // namespace mla::absorb
