// Portable sparse decode, 16-head tiles, fp8_ds_mla cache: 2 staging buffers (sm90/sm100) and 1
// (GPUs with less shared memory).
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla::sparse {
template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 2>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 1>(const SparseDecodeParams&);
}  // namespace mla::sparse
