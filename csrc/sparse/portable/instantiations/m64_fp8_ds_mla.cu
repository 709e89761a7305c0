// Portable sparse decode, 64-head tiles, fp8_ds_mla cache: V read from the staging rows, the next
// tile dequantised during PV (PortableConfig::kPvRaw; sm90/sm100), and the kernel that dequantises
// each tile between two barriers (GPUs with less shared memory).
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla::sparse {
template void launch_sparse_decode_portable<64, CacheFormat::kFp8DsMla, 2, false, 16, false, 0, true>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<64, CacheFormat::kFp8DsMla, 1>(const SparseDecodeParams&);
}  // namespace mla::sparse
