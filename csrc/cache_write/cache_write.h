// concat_and_cache_mla: write [kv_c | k_pe] of T tokens into their slots of a paged MLA cache;
// concat_and_cache_mla_v4: the same for DeepSeek-V4's 512-wide rows (mla_ext/formats.py).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/types.h"

namespace mla {

struct CacheWriteParams {
  const void* __restrict__ kv_c;            // [num_tokens, 512] bf16/fp16, row stride below
  const void* __restrict__ k_pe;            // [num_tokens, 64], same dtype as kv_c
  void* __restrict__ kv_cache;              // [num_blocks, block_size, row] (row: 576 elems or 656 B)
  const int64_t* __restrict__ slot_mapping; // [num_tokens]; < 0 = padding, skipped
  const float* __restrict__ scale;          // [1] fp32 per-tensor scale (kFp8 only), else nullptr
  int64_t num_tokens;                       // = slot_mapping.size(0), may be < kv_c.size(0)
  int64_t stride_kv_c_token;                // elements
  int64_t stride_k_pe_token;                // elements
  int64_t stride_cache_block_bytes;         // bytes (pages may be padded)
  int64_t stride_cache_token_bytes;         // bytes
  int64_t block_size;
  int64_t num_slots;                        // num_blocks * block_size; slots >= this are skipped
  DType input_dtype;                        // kBF16 or kFP16
  CacheFormat format;
  cudaStream_t stream;
};

// One launch for any num_tokens (0 launches nothing); CUDA-graph safe (no host sync, no
// allocation). Out-of-range slots never write outside the cache.
void run_concat_and_cache_mla(const CacheWriteParams& params);

// DeepSeek-V4 (csrc/cache_write/cache_write_v4.cu). 'auto': the 512-element row copied into
// [num_blocks, block_size, 512] rows of kv's dtype. 'fp8_ds_mla': per page of block_size tokens,
// token t's 576-byte data part (448 e4m3 NoPE bytes, 64 bf16 RoPE dims) at 576 t and its 8-byte
// scale part (7 UE8M0 bytes, a zero pad byte) at 576 block_size + 8 t (constants: common/types.h).
struct CacheWriteV4Params {
  const void* __restrict__ kv;               // [num_tokens, 512] bf16/fp16, row stride below
  void* __restrict__ kv_cache;               // auto: [num_blocks, block_size, 512]; fp8_ds_mla: pages
  const int64_t* __restrict__ slot_mapping;  // [num_tokens]; < 0 = padding, skipped
  int64_t num_tokens;                        // = slot_mapping.size(0), may be < kv.size(0)
  int64_t stride_kv_token;                   // elements
  int64_t stride_cache_block_bytes;          // bytes
  int64_t stride_cache_token_bytes;          // bytes ('auto' rows; fp8_ds_mla tokens are 576 apart)
  int64_t block_size;
  int64_t num_slots;                         // num_blocks * block_size; slots >= this are skipped
  DType input_dtype;                         // kBF16 or kFP16
  bool ds_mla;                               // fp8_ds_mla, else auto
  cudaStream_t stream;
};

void run_concat_and_cache_mla_v4(const CacheWriteV4Params& params);

}  // namespace mla
