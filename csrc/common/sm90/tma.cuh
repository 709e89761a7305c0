// TMA for the sm90 kernels: bulk tensor loads (cp.async.bulk.tensor, completing on the mbarriers
// of common/mbarrier.cuh); on the host, tensor maps (common/sm90/tensor_map.h). Device functions
// are compiled only into sm_90a code (callers guard with MLA_SM90A).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/mbarrier.cuh"
#include "common/sm90/tensor_map.h"

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

}  // namespace mla::sm90
