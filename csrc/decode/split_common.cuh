// Pieces shared by every split kernel (portable, fp8 16-row, sm90): the schedule walk, the cache
// row lookup, the q loads and the launch.
#pragma once

#include <string>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/sm80.cuh"
#include "common/pdl.cuh"
#include "decode/decode.h"

namespace mla::decode {

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

// This CTA's part of the schedule (row blockIdx.x of p.schedule), clamped: a hand-made schedule must
// not send a CTA outside the block table or the workspace. Every split kernel walks it the same way:
// for req in [begin_req, end_req], the piece part_piece(p, part, req).
struct SchedulePart {
  int begin_req, begin_tile, end_req, end_tile, begin_split;
  int64_t max_kv;  // keys the block table can address
};
__device__ __forceinline__ SchedulePart schedule_part(const DecodeParams& p) {
  const int32_t* sched = p.schedule + blockIdx.x * kScheduleFields;
  return {max(sched[kBeginReq], 0), max(sched[kBeginTile], 0), min(sched[kEndReq], p.b - 1), sched[kEndTile],
          max(sched[kBeginSplit], 0), int64_t(p.max_blocks) * p.block_size};
}

// Request req's piece of a part: its length, the keys it may read (positions past the block table
// are invalid), its tiles (relative to the request) and its block-table row.
struct Piece {
  int seq_len, kv_len, tile_begin, num_tiles;
  const int32_t* bt;
};
__device__ __forceinline__ Piece part_piece(const DecodeParams& p, const SchedulePart& part, int req) {
  const int seq_len = max(p.seq_lens[req], 0);
  const int kv_len = static_cast<int>(seq_len < part.max_kv ? seq_len : part.max_kv);
  const int tile_begin = req == part.begin_req ? part.begin_tile : 0;
  const int tile_end = min(req == part.end_req ? part.end_tile : key_tiles(seq_len), key_tiles(kv_len));
  return {seq_len, kv_len, tile_begin, max(tile_end - tile_begin, 0), p.block_table + req * p.stride_block_table_b};
}

// Where request req's piece writes its partial results when the request is split (num_splits > 1;
// else 0, unused).
__device__ __forceinline__ int64_t partial_slot(const DecodeParams& p, const SchedulePart& part, int req, int num_splits) {
  return num_splits > 1 ? int64_t(p.split_info[req * kSplitInfoFields + 1]) + (req == part.begin_req ? part.begin_split : 0) : 0;
}

// cp.async of the 16-bit query rows row0 .. row0 + kRows - 1 of request req (row = s * h_q + h)
// into shared memory at q_base + offset(r, chunk), 16-byte chunks; rows past rows_here zero-filled.
template <typename T, int kRows, int kThreads, typename Offset>
__device__ __forceinline__ void load_q_rows(const DecodeParams& p, int req, int row0, int rows_here, int tid, uint32_t q_base,
                                            Offset offset) {
  constexpr int kRowChunks = 2 * kLatentDim / 16;
  const T* q = static_cast<const T*>(p.q) + req * p.stride_q_b;
  for (int c = tid; c < kRows * kRowChunks; c += kThreads) {
    const int r = c / kRowChunks, ch = c % kRowChunks;
    const bool ok = r < rows_here;
    const int s = (row0 + r) / p.h_q, h = (row0 + r) % p.h_q;
    const T* src = ok ? q + s * p.stride_q_s + h * p.stride_q_h + 8 * ch : q;
    sm80::cp_async16(q_base + offset(r, ch), src, ok);
  }
}

// Tiles are sized for the 227 KB of sm90/sm100; sm80/sm86 would need smaller configurations.
inline void launch_split_kernel(void (*kernel)(DecodeParams), int threads, int smem_bytes, const char* what,
                                const DecodeParams& p) {
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  MLA_HOST_CHECK(device_info(device).max_smem_per_block >= smem_bytes,
                 std::string("the ") + what + " needs " + std::to_string(smem_bytes) +
                     " bytes of shared memory per block, more than this GPU offers");
  opt_in_smem(reinterpret_cast<const void*>(kernel), smem_bytes, device);
  // A programmatic dependent launch (common/pdl.cuh): its start overlaps the kernel before it, which
  // it waits for before it lets the combine launch.
  launch_dependent(kernel, dim3(p.num_parts, num_m_blocks(p.num_rows, p.format)), dim3(threads), smem_bytes,
                   p.stream, p);
}

}  // namespace mla::decode
