// Portable sparse decode, 16-head tiles, fp8_ds_mla cache, MMA fragments converted from the e4m3
// staging rows in registers (no K tile): 4 staging buffers (sm90/sm100); rows gathered by 4 copy
// warps with 16 threads per row, or (where shared memory has no room for the copy warps' barriers)
// by the compute warps.
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla::sparse {
template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 16>(const SparseDecodeParams&);
template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 16, false, 4>(const SparseDecodeParams&);
}  // namespace mla::sparse
