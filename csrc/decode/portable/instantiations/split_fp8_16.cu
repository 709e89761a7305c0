// fp8 caches with 16 query rows per CTA (decode_split_fp8.cuh), the mma.sync kernel (sm80+):
// both formats, both q dtypes.
#include "decode/portable/decode_split_fp8.cuh"

namespace mla::decode::portable {

template void launch_decode_split_fp8<__nv_bfloat16, CacheFormat::kFp8, false>(const DecodeParams&);
template void launch_decode_split_fp8<__half, CacheFormat::kFp8, false>(const DecodeParams&);
template void launch_decode_split_fp8<__nv_bfloat16, CacheFormat::kFp8DsMla, false>(const DecodeParams&);
template void launch_decode_split_fp8<__half, CacheFormat::kFp8DsMla, false>(const DecodeParams&);

}  // namespace mla::decode::portable
