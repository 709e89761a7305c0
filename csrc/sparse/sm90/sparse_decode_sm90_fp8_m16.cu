// sm90a: fp8_ds_mla 16-head tiles, the e4m3-fragment kernel of the portable path
// (portable/sparse_decode_portable.cuh) with its rows gathered by one cp.async.bulk each
// (PortableConfig::kBulkRows) instead of 16-byte cp.async, issued by 4 copy warps. The kernel body
// exists in sm_90a code only; sparse_decode.cu launches it on sm90 devices.
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla::sparse {
template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 8, true, 4>(const SparseDecodeParams&);
}  // namespace mla::sparse
