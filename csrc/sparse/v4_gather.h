// DeepSeek-V4 sparse decode, first step: the rows both pools' index lists select, dequantised to
// bf16 and widened to the V3 latent layout, so that the V3 sparse decode computes the attention.
// A V4 head is 512 wide and its value is the whole row: with each gathered row written as [row | 64
// zeros] and q as [q | 64 zeros], the V3 kernels' scores (576 dims) are the V4 scores and their value
// (the first 512 dims) is the V4 value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mla {

struct V4Pool {
  const void* __restrict__ cache;           // auto: bf16 [num_blocks, block_size, 512]; fp8_ds_mla: pages
  const int32_t* __restrict__ indices;      // [b, s_q, topk] int32 global slots, last dim contiguous
  const int32_t* __restrict__ lengths;      // [b] int32 (topk_length / extra_topk_length); may be nullptr
  int64_t stride_indices_b, stride_indices_s;
  int topk;                                 // 0: no such pool
  int64_t block_size;
  int64_t num_slots;                        // num_blocks * block_size
  int64_t stride_block_bytes;               // page stride
  int64_t stride_token_bytes;               // auto: row stride (fp8_ds_mla tokens are 576 bytes apart)
};

struct V4GatherParams {
  const void* __restrict__ q;               // [b, s_q, h_q, 512] bf16, strides below, last dim contiguous
  int64_t stride_q_b, stride_q_s, stride_q_h;
  V4Pool pool[2];                           // the main cache, then the extra (sliding-window) one
  bool ds_mla;                              // both pools fp8_ds_mla, else both bf16
  int b, s_q, h_q;
  void* __restrict__ q_wide;                // [b, s_q, h_q, 576] bf16, written: q then 64 zeros
  void* __restrict__ rows;                  // [b * s_q * K, 576] bf16, K = topk + extra topk: row r of
                                            // query token t = r / K, entry r % K (main, then extra)
  int32_t* __restrict__ row_index;          // [b, s_q, K]: r where the entry is valid, else -1
  cudaStream_t stream;
};

// One launch; rows of invalid entries are not written (never read: their index is -1).
void run_v4_gather(const V4GatherParams& params);

}  // namespace mla
