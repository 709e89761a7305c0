// Pieces shared by the portable split kernels: the cache row lookup and the launch.
#pragma once

#include <string>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "decode/decode.h"

namespace mla::decode::portable {

// Page id of position `key` of a request whose block-table row is `bt`, or -1 at or past kv_len.
// (Split from the address so that a kernel can read the block table a tile ahead.)
__device__ __forceinline__ int cache_page(const DecodeParams& p, const int32_t* bt, int key, int kv_len) {
  return key < kv_len ? bt[p.block_div.div(key)] : -1;
}
// Cache row of position `key` on page `page`, or nullptr when the page id is out of range
// (negative: past the sequence). Such rows are zero-filled, never read.
__device__ __forceinline__ const uint8_t* cache_row_on(const DecodeParams& p, int page, int key) {
  if (page < 0 || page >= p.num_blocks) return nullptr;
  return static_cast<const uint8_t*>(p.kv_cache) + page * p.stride_cache_block_bytes +
         p.block_div.mod(key, p.block_div.div(key)) * p.stride_cache_token_bytes;
}
__device__ __forceinline__ const uint8_t* cache_row(const DecodeParams& p, const int32_t* bt, int key, int kv_len) {
  return cache_row_on(p, cache_page(p, bt, key, kv_len), key);
}

// Tiles are sized for the 227 KB of sm90/sm100; sm80/sm86 would need smaller configurations.
inline void launch_split_kernel(void (*kernel)(DecodeParams), int threads, int smem_bytes, const char* what,
                                const DecodeParams& p) {
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  MLA_HOST_CHECK(device_info(device).max_smem_per_block >= smem_bytes,
                 std::string("the ") + what + " needs " + std::to_string(smem_bytes) +
                     " bytes of shared memory per block, more than this GPU offers");
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  const dim3 grid(p.num_parts, num_m_blocks(p.num_rows, p.format));
  kernel<<<grid, threads, smem_bytes, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

}  // namespace mla::decode::portable
