// TMA for the sm90 kernels: bulk tensor loads (cp.async.bulk.tensor, completing on the mbarriers
// of common/mbarrier.cuh) and, on the host, tensor maps. Device functions are compiled only into
// sm_90a code (callers guard with MLA_SM90A).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "common/mbarrier.cuh"

namespace mla::sm90 {

// Fetches a tensor map (in kernel parameter space) ahead of its first use, so the first load
// does not wait for the descriptor.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- bulk tensor loads global -> shared, completing `bytes` on mbarrier `bar`. Coordinates are
// in elements, innermost first; rows outside the tensor arrive as zeros (and still count).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// ---- host: tensor maps, with 128-byte L2 promotion: each box row
// is one 128-byte request. 256-byte promotion (which also brings the next 128 bytes of a row, the
// next k piece, into L2) raised the L2 traffic of v_up at H = 128, T = 256 from 97 to 114 MB
// for the same 50.4 MB read from DRAM (Nsight Compute, H200) and was 0.4-1.5 us slower at
// H = 128, T = 64-1024 (csrc/absorb/README.md). The driver entry point is looked up once through the
// runtime, so the library needs no -lcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f)
                                                                      : nullptr;
  }();
  return fn;
}

// A rank-`rank` tensor of `dtype`: dims and boxes innermost first (in elements), byte strides of
// dims 1.. (multiples of 16), 128-byte L2 promotion (above), no out-of-bounds NaN fill (zeros).
// Returns false where the driver refuses it (the caller then takes another kernel).
inline bool make_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, CUtensorMapSwizzle swizzle, const void* base,
                            int rank, const uint64_t* dims, const uint64_t* byte_strides, const uint32_t* box) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  return encode(map, dtype, static_cast<cuuint32_t>(rank), const_cast<void*>(base), reinterpret_cast<const cuuint64_t*>(dims),
                reinterpret_cast<const cuuint64_t*>(byte_strides), reinterpret_cast<const cuuint32_t*>(box), elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// bf16 in the 128-byte swizzle (boxes of 64 elements innermost: the layout kmajor_sw128_desc describes).
inline bool make_bf16_tensor_map(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                                 const uint64_t* byte_strides, const uint32_t* box) {
  return make_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_SWIZZLE_128B, base, rank, dims, byte_strides, box);
}

}  // namespace mla::sm90
