// Portable sparse decode, 16-head tiles, fp8_ds_mla cache, MMA fragments converted from the e4m3
// staging rows in registers (no K tile): 4 staging buffers (sm90/sm100); rows gathered by 8 threads
// each (4: MLA_EXT_SPARSE_ROW_THREADS=4, for comparisons).
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla::sparse {
template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 4>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 8>(const SparseDecodeParams&);
}  // namespace mla::sparse
