// sm90a: portable sparse kernels (portable/sparse_decode_portable.cuh) with their rows gathered by
// one cp.async.bulk each (PortableConfig::kBulkRows) instead of 16-byte cp.async: fp8_ds_mla
// 16-head tiles (the e4m3-fragment kernel) and bf16 16- and 64-head tiles (rows padded to 1168
// bytes in the K tile). The kernel bodies exist in sm_90a code only; sparse_decode.cu launches
// them on sm90 devices.
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla::sparse {
template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 8, true>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<16, CacheFormat::kAuto, 2, false, 8, true>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<64, CacheFormat::kAuto, 2, false, 8, true>(const SparseDecodeParams&);
}  // namespace mla::sparse
