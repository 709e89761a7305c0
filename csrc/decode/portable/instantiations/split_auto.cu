// Portable split kernel for the 'auto' cache: both q dtypes, all three row-block sizes.
#include "decode/portable/decode_split.cuh"

namespace mla::decode::portable {

template void launch_decode_split<__nv_bfloat16, CacheFormat::kAuto, 16>(const DecodeParams&);
template void launch_decode_split<__nv_bfloat16, CacheFormat::kAuto, 32>(const DecodeParams&);
template void launch_decode_split<__nv_bfloat16, CacheFormat::kAuto, 64>(const DecodeParams&);
template void launch_decode_split<__half, CacheFormat::kAuto, 16>(const DecodeParams&);
template void launch_decode_split<__half, CacheFormat::kAuto, 32>(const DecodeParams&);
template void launch_decode_split<__half, CacheFormat::kAuto, 64>(const DecodeParams&);

}  // namespace mla::decode::portable
