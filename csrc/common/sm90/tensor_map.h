// Tensor maps (TMA descriptors) for the sm90 kernels, encoded on the host (tensor_map.cpp).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mla::sm90 {

// Maps use 128-byte L2 promotion: each box row is one 128-byte request. 256-byte promotion (which also brings the next 128 bytes of a row, the
// next k piece, into L2) raised the L2 traffic of v_up at H = 128, T = 256 from 97 to 114 MB
// for the same 50.4 MB read from DRAM (Nsight Compute, H200) and was 0.4-1.5 us slower at
// H = 128, T = 64-1024 (csrc/absorb/README.md).
//
// A rank-`rank` tensor of `dtype`: dims and boxes innermost first (in elements), byte strides of
// dims 1.. (multiples of 16), no out-of-bounds NaN fill (zeros). Returns false where the driver
// refuses it (the caller then takes another kernel). A map is a function of these arguments
// alone, so maps of long-lived tensors are cached by them (`cached`): an op called once per layer
// finds its cache's and weights' maps already encoded. Activations, whose addresses change from
// call to call, are encoded each time (cached, they would only push the others out).
bool make_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, CUtensorMapSwizzle swizzle, const void* base, int rank,
                     const uint64_t* dims, const uint64_t* byte_strides, const uint32_t* box, bool cached);

// bf16 in the 128-byte swizzle (boxes of 64 elements innermost: the layout kmajor_sw128_desc describes).
inline bool make_bf16_tensor_map(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                                 const uint64_t* byte_strides, const uint32_t* box, bool cached) {
  return make_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_SWIZZLE_128B, base, rank, dims, byte_strides,
                         box, cached);
}

}  // namespace mla::sm90
