// Portable sparse decode, 64-head tiles, fp8_ds_mla cache.
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla::sparse {
template void launch_sparse_decode_portable<64, CacheFormat::kFp8DsMla, 1, false, 4>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<64, CacheFormat::kFp8DsMla, 1, false, 8>(const SparseDecodeParams&);
// V from the staging rows, the next tile dequantised during PV (PortableConfig::kPvRaw); rows gathered by
// 16 threads each (the default) or 8
template void launch_sparse_decode_portable<64, CacheFormat::kFp8DsMla, 2, false, 16, false, 0, true>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<64, CacheFormat::kFp8DsMla, 2, false, 8, false, 0, true>(const SparseDecodeParams&);
}  // namespace mla::sparse
