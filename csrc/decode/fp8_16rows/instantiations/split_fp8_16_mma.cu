// The fp8 16-row kernel with every MMA on mma.sync (every target: the portable path, and fp16 q
// on sm90): both formats, both q dtypes; row copies, or raw rows by bulk copies.
#include "decode/fp8_16rows/decode_split_fp8.cuh"

namespace mla::decode::fp8_16rows {

#define MLA_FP8_16_MMA(T, F)                                                            \
  template void launch_decode_split_fp8<T, F, kRowThreads<F>, false, kTmaNone, false>( \
      const DecodeParams&);                                                            \
  template void launch_decode_split_fp8<T, F, 8, false, kTmaNone, true>(const DecodeParams&);
MLA_FP8_16_MMA(__nv_bfloat16, CacheFormat::kFp8)
MLA_FP8_16_MMA(__half, CacheFormat::kFp8)
MLA_FP8_16_MMA(__nv_bfloat16, CacheFormat::kFp8DsMla)
MLA_FP8_16_MMA(__half, CacheFormat::kFp8DsMla)
#undef MLA_FP8_16_MMA

}  // namespace mla::decode::fp8_16rows
