// fp8 caches with 16 query rows per CTA (decode_split_fp8.cuh), the sm90a kernel whose QK^T runs
// on wgmma: both formats, bf16 q (the dispatcher sends fp16 q to the mma.sync kernel). (Compiled
// for every target; off sm_90a its body traps, and decode.cu launches it only on sm90.)
#include "decode/portable/decode_split_fp8.cuh"

namespace mla::decode::portable {

template void launch_decode_split_fp8<__nv_bfloat16, CacheFormat::kFp8, true>(const DecodeParams&);
template void launch_decode_split_fp8<__nv_bfloat16, CacheFormat::kFp8DsMla, true>(const DecodeParams&);

}  // namespace mla::decode::portable
