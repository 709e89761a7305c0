// Sparse top-k MLA decode (DeepSeek V3.2): each query token attends only to the cache slots its
// indexer chose. Host entry points for the decode and the two GPU index builders. No torch
// headers: the binding (csrc/bindings/sparse.cpp) fills these structs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/fast_divmod.h"
#include "common/types.h"

namespace mla {

// Largest top-k list: the kernels hold topk in int and round it up to 64-key tiles.
constexpr int64_t kSparseMaxTopk = INT32_MAX - 64;

struct SparseDecodeParams {
  const void* __restrict__ q;                // [b, s_q, h_q, 576] bf16, strides below, last dim contiguous
  const void* __restrict__ kv_cache;         // [num_blocks, block_size, row]: bf16 row 576 (auto) or uint8 656 (fp8_ds_mla)
  const int32_t* __restrict__ indices;       // [b, s_q, topk] int32 global slots; < 0 or >= num_slots: invalid
  const int32_t* __restrict__ topk_length;   // [b] int32, only the first topk_length[i] indices count; may be nullptr
  const float* __restrict__ attn_sink;       // [h_q] fp32; may be nullptr
  void* __restrict__ out;                    // [b, s_q, h_q, 512] bf16, contiguous
  float* __restrict__ lse;                   // [b, h_q, s_q] fp32, contiguous, natural log
  // When num_splits > 1: the query tokens from split_from on (b * s_q - split_from of them) are split.
  float* __restrict__ partial_out;           // [num_splits, b * s_q - split_from, h_q, 512] fp32, else nullptr
  float* __restrict__ partial_lse;           // [num_splits, b * s_q - split_from, h_q] fp32, else nullptr
  int batch;
  int s_q;
  int h_q;
  int topk;
  int64_t stride_q_b, stride_q_s, stride_q_h;  // elements; all multiples of 8 (16-byte rows)
  int64_t stride_indices_b, stride_indices_s;  // elements; last dim contiguous
  int64_t stride_cache_block_bytes;            // bytes, multiple of 16 (pages may be padded)
  int64_t stride_cache_token_bytes;            // bytes, multiple of 16
  int64_t block_size;
  int64_t num_slots;                           // num_blocks * block_size
  FastDivmod block_div;                        // min(block_size, 2^31 - 1), set by plan_sparse_decode()
  float softmax_scale;
  CacheFormat format;                          // kAuto (bf16) or kFp8DsMla
  int num_splits;                              // from plan_sparse_decode(); 1 = no combine
  int tiles_per_split;                         // 64-key tiles each split covers
  int split_from;                              // first split query token (b * s_q index, a request's first)
  cudaStream_t stream;
};

// CTAs along grid z: the whole query tokens, then num_splits per split token (cta_work in
// portable/sparse_decode_portable.cuh).
inline int sparse_grid_z(const SparseDecodeParams& p) {
  return p.split_from + (p.batch * p.s_q - p.split_from) * p.num_splits;
}

// How the work is split (a function of the shapes and the GPU only: no device data is read, so
// a captured CUDA graph replays the same plan). Fills num_splits, tiles_per_split and split_from:
// the top-k lists are split when the CTAs leave SMs idle, all of them in small batches, else (64-head
// tiles) those of the last requests, whose CTAs alone would make a last, mostly idle wave.
void plan_sparse_decode(SparseDecodeParams& params, int device);

// Launches the decode (and, when num_splits > 1, the split combine shared with dense decode,
// csrc/decode/combine/combine.h, which also applies attn_sink). CUDA-graph safe: no host sync, no
// allocation (partial_out/partial_lse are allocated by the caller from the plan).
void run_sparse_decode_mla(const SparseDecodeParams& params, int device);
// The combine of a split plan (num_splits > 1): merges the partials of the tokens from split_from on
// into out and lse and applies attn_sink to them. run_sparse_decode_mla calls it; so does the fused
// DeepSeek-V4 decode (v4_decode.h), whose partials have the same layout.
void run_sparse_combine(const SparseDecodeParams& params, int num_sms);

struct SparseIndicesToSlotsParams {
  const int32_t* __restrict__ local_indices;  // [b, s_q, topk] int32 token positions, contiguous; < 0 = padding
  const int32_t* __restrict__ block_table;    // [b, max_blocks] int32, row stride below
  int32_t* __restrict__ slots;                // [b, s_q, topk] int32 out, contiguous
  int64_t num_rows_per_request;               // s_q * topk
  int64_t total;                              // b * s_q * topk
  int64_t stride_block_table;                 // elements
  int max_blocks;
  int block_size;
  cudaStream_t stream;
};
void run_sparse_indices_to_slots(const SparseIndicesToSlotsParams& params);

struct SparseCompressedIndicesParams {
  const int64_t* __restrict__ positions;     // [T] int64 position of each query token
  const int32_t* __restrict__ token_to_req;  // [T] int32 row of block_table; outside [0, num_requests): padding token
  const int32_t* __restrict__ block_table;   // [R, max_blocks] int32 (compressed cache pages)
  int32_t* __restrict__ indices;             // [T, width] int32 out, row stride below
  int32_t* __restrict__ lengths;             // [T] int32 out
  int64_t num_tokens;
  int64_t num_requests;                      // block_table.size(0)
  int64_t num_decode_tokens;                 // tokens [0, this) get global slots, the rest local indices
  int64_t stride_block_table;
  int64_t stride_indices;
  int width;                                 // multiple of 128
  int max_blocks;
  int block_size;
  int compress_ratio;
  cudaStream_t stream;
};
void run_sparse_compressed_indices(const SparseCompressedIndicesParams& params);

// A flat batch's top-k lists of compressed-cache positions -> global slots, and per token one past
// its last non-negative entry (DeepSeek-V4 C4A decode lists; mla_ext.reference.sparse_topk_to_slots).
struct SparseTopkToSlotsParams {
  const int32_t* __restrict__ topk_indices;  // [T, topk] int32, row stride below (contiguous: topk); < 0 = none
  const int32_t* __restrict__ token_to_req;  // [T] int32 row of block_table; outside [0, num_requests): padding token
  const int32_t* __restrict__ block_table;   // [R, max_blocks] int32
  int32_t* __restrict__ slots;               // [T, topk] int32 out, contiguous
  int32_t* __restrict__ lengths;             // [T] int32 out
  int64_t num_tokens;
  int64_t num_requests;
  int64_t stride_topk_indices;
  int64_t stride_block_table;
  int topk;
  int max_blocks;
  int block_size;
  cudaStream_t stream;
};
void run_sparse_topk_to_slots(const SparseTopkToSlotsParams& params);

// The compressed cache's slot_mapping: a token whose position p completes compressed entry
// p / compress_ratio ((p + 1) % compress_ratio == 0) writes it there; others -1
// (mla_ext.reference.compressed_slot_mapping).
struct CompressedSlotMappingParams {
  const int64_t* __restrict__ positions;     // [T] int64
  const int32_t* __restrict__ token_to_req;  // [T] int32; outside [0, num_requests): padding token
  const int32_t* __restrict__ block_table;   // [R, max_blocks] int32 (compressed cache pages)
  int64_t* __restrict__ slot_mapping;        // [T] int64 out, contiguous
  int64_t num_tokens;
  int64_t num_requests;
  int64_t stride_block_table;
  int max_blocks;
  int block_size;
  int compress_ratio;
  cudaStream_t stream;
};
void run_compressed_slot_mapping(const CompressedSlotMappingParams& params);

}  // namespace mla
