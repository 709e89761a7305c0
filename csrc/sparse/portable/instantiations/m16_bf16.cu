// Portable sparse decode, 16-head tiles, bf16 (auto) cache: 2-stage (sm90/sm100) and 1-stage
// (GPUs with less shared memory) pipelines.
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla::sparse {
template void launch_sparse_decode_portable<16, CacheFormat::kAuto, 2>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<16, CacheFormat::kAuto, 1>(const SparseDecodeParams&);
}  // namespace mla::sparse
