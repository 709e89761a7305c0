// v_up with e4m3 weights, split-K over a cluster of 8 CTAs (v_up_splitk.cuh), BM = 16, 32, 64.
#include "absorb/v_up_splitk.cuh"

namespace mla::absorb {
template void run_v_up_splitk<true, 16>(const AbsorbParams&);
template void run_v_up_splitk<true, 32>(const AbsorbParams&);
template void run_v_up_splitk<true, 64>(const AbsorbParams&);
}  // namespace mla::absorb
