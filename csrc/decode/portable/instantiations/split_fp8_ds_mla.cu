// Portable split kernel for the 'fp8_ds_mla' cache: both q dtypes, 64-row blocks (up to 32
// rows: fp8_16rows/).
#include "decode/portable/decode_split.cuh"

namespace mla::decode::portable {

template void launch_decode_split<__nv_bfloat16, CacheFormat::kFp8DsMla, 64>(const DecodeParams&);
template void launch_decode_split<__half, CacheFormat::kFp8DsMla, 64>(const DecodeParams&);

}  // namespace mla::decode::portable
