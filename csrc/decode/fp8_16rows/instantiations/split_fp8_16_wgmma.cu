// The fp8 16-row kernel's sm90a variant, QK^T on fp8 wgmma: both formats, bf16 q (the dispatcher
// sends fp16 q to the mma.sync variant); tiles by TMA (whole pages, or pages of 8-32 rows) or
// cp.async rows. (Compiled for every target; off sm_90a its body traps, and decode/dispatch.cu
// launches it only on sm90.)
#include "decode/fp8_16rows/decode_split_fp8.cuh"

namespace mla::decode::fp8_16rows {

#define MLA_FP8_16_WGMMA(F)                                                                                          \
  template void launch_decode_split_fp8<__nv_bfloat16, F, 8, true, kTmaWholePage, false>(const DecodeParams&);      \
  template void launch_decode_split_fp8<__nv_bfloat16, F, 8, true, kTmaPages, false>(const DecodeParams&);          \
  template void launch_decode_split_fp8<__nv_bfloat16, F, kRowThreads<F>, true, kTmaNone, false>(const DecodeParams&);
MLA_FP8_16_WGMMA(CacheFormat::kFp8)
MLA_FP8_16_WGMMA(CacheFormat::kFp8DsMla)
#undef MLA_FP8_16_WGMMA

}  // namespace mla::decode::fp8_16rows
