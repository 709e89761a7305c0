// Pieces shared by the portable split kernels: the cache row lookup and the launch.
#pragma once

#include <string>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "decode/decode.h"

namespace mla::decode::portable {

// Cache row of position `key` of a request whose block-table row is `bt`, or nullptr when the key
// is at or past kv_len or its page id is out of range (such rows are zero-filled, never read).
__device__ __forceinline__ const uint8_t* cache_row(const DecodeParams& p, const int32_t* bt, int key, int kv_len) {
  if (key >= kv_len) return nullptr;
  const int page = bt[key / p.block_size];
  if (page < 0 || page >= p.num_blocks) return nullptr;
  return static_cast<const uint8_t*>(p.kv_cache) + page * p.stride_cache_block_bytes +
         (key % p.block_size) * p.stride_cache_token_bytes;
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
