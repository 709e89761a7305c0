// GPU index builders for sparse decode: elementwise kernels that write into caller-provided
// buffers (no host sync, no allocation: safe inside a captured CUDA graph).
#include <cstdint>

#include "common/cuda_check.h"
#include "sparse/sparse_decode.h"

namespace mla {
namespace {

constexpr int kThreads = 256;

// Global slot of position pos through one block-table row; -1 when pos is negative, past the
// table, its page is unassigned (negative entry), or the slot does not fit the int32 indices
// (narrowing would wrap it to a valid-looking slot).
__device__ __forceinline__ int32_t position_to_slot(int64_t pos, const int32_t* table_row, int max_blocks, int block_size) {
  if (pos < 0) return -1;
  const int64_t page = pos / block_size;
  if (page >= max_blocks) return -1;
  const int32_t block = table_row[page];
  if (block < 0) return -1;
  const int64_t slot = int64_t(block) * block_size + pos % block_size;
  return slot <= INT32_MAX ? static_cast<int32_t>(slot) : -1;
}

__global__ void __launch_bounds__(kThreads) indices_to_slots_kernel(const __grid_constant__ SparseIndicesToSlotsParams p) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.total) return;
  const int64_t req = i / p.num_rows_per_request;
  p.slots[i] = position_to_slot(p.local_indices[i], p.block_table + req * p.stride_block_table, p.max_blocks, p.block_size);
}

// grid = (num_tokens, width / kThreads rounded up): thread j of token t writes indices[t, j].
__global__ void __launch_bounds__(kThreads) compressed_indices_kernel(const __grid_constant__ SparseCompressedIndicesParams p) {
  const int64_t t = blockIdx.x;
  const int j = blockIdx.y * kThreads + threadIdx.x;
  // A token without a valid request (CUDA-graph padding, e.g. -1) is padding: length 0, row -1.
  const int64_t req = p.token_to_req[t];
  const bool padding = req < 0 || req >= p.num_requests;
  const int64_t q = (p.positions[t] + 1) / p.compress_ratio;
  const int64_t n = q > 0 && !padding ? q : 0;  // C division: -k/r -> <= 0
  if (j == 0) p.lengths[t] = static_cast<int32_t>(n < p.width ? n : p.width);
  if (j >= p.width) return;
  int32_t value = -1;
  if (j < n) {
    value = t < p.num_decode_tokens
                ? position_to_slot(j, p.block_table + req * p.stride_block_table, p.max_blocks, p.block_size)
                : j;
  }
  p.indices[t * p.stride_indices + j] = value;
}

// One CTA per token: thread i converts entries i, i + kThreads, ...; the CTA's largest index of a
// non-negative entry, plus one, is the token's length.
__global__ void __launch_bounds__(kThreads) topk_to_slots_kernel(const __grid_constant__ SparseTopkToSlotsParams p) {
  const int64_t t = blockIdx.x;
  const int64_t req = p.token_to_req[t];
  const bool padding = req < 0 || req >= p.num_requests;
  const int32_t* row = p.topk_indices + t * p.stride_topk_indices;
  const int32_t* table_row = p.block_table + (padding ? 0 : req) * p.stride_block_table;
  int last = 0;
  for (int j = threadIdx.x; j < p.topk; j += kThreads) {
    const int32_t pos = row[j];
    if (pos >= 0) last = j + 1;
    p.slots[t * p.topk + j] = padding ? -1 : position_to_slot(pos, table_row, p.max_blocks, p.block_size);
  }
  __shared__ int cta_last;
  if (threadIdx.x == 0) cta_last = 0;
  __syncthreads();
  if (last > 0) atomicMax(&cta_last, last);
  __syncthreads();
  if (threadIdx.x == 0) p.lengths[t] = padding ? 0 : cta_last;
}

__global__ void __launch_bounds__(kThreads) compressed_slot_mapping_kernel(const __grid_constant__ CompressedSlotMappingParams p) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.num_tokens) return;
  const int64_t req = p.token_to_req[t], pos = p.positions[t];
  int64_t slot = -1;
  if (req >= 0 && req < p.num_requests && pos >= 0 && (pos + 1) % p.compress_ratio == 0) {
    slot = position_to_slot(pos / p.compress_ratio, p.block_table + req * p.stride_block_table, p.max_blocks, p.block_size);
  }
  p.slot_mapping[t] = slot;
}

}  // namespace

void run_sparse_topk_to_slots(const SparseTopkToSlotsParams& p) {
  if (p.num_tokens == 0) return;
  MLA_HOST_CHECK(p.block_size > 0, "block_size must be positive");
  topk_to_slots_kernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

void run_compressed_slot_mapping(const CompressedSlotMappingParams& p) {
  if (p.num_tokens == 0) return;
  MLA_HOST_CHECK(p.block_size > 0 && p.compress_ratio > 0, "block_size and compress_ratio must be positive");
  const dim3 grid(static_cast<unsigned>((p.num_tokens + kThreads - 1) / kThreads));
  compressed_slot_mapping_kernel<<<grid, kThreads, 0, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

void run_sparse_indices_to_slots(const SparseIndicesToSlotsParams& p) {
  if (p.total == 0) return;
  const dim3 grid(static_cast<unsigned>((p.total + kThreads - 1) / kThreads));
  indices_to_slots_kernel<<<grid, kThreads, 0, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

void run_sparse_compressed_indices(const SparseCompressedIndicesParams& p) {
  if (p.num_tokens == 0) return;
  MLA_HOST_CHECK(p.width > 0 && p.compress_ratio > 0 && p.block_size > 0, "width, compress_ratio and block_size must be positive");
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>((p.width + kThreads - 1) / kThreads));
  compressed_indices_kernel<<<grid, kThreads, 0, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

}  // namespace mla
