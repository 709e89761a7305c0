// Dense paged split-KV MLA decode: planner, split kernel(s), combine. Host API free of torch.
//
// A decode step runs three kernels, all on the caller's stream, none syncing with the host:
//   1. plan (once per step, shared by every layer): seq_lens -> a schedule of `num_parts`
//      parts, each a contiguous run of (request, 64-key tile) work, plus per request its number
//      of splits and where its partial results go;
//   2. split kernel (per layer): grid (num_parts, m_blocks); each CTA walks its part for one
//      block of (s_q x h_q) query rows, writing the output directly for requests it covers
//      whole and fp32 partials (o, lse) for split requests;
//   3. combine (per layer): merges the partials of split requests by their lse.
// The schedule only depends on seq_lens, s_q, h_q, the cache format and the SM count, so the
// shapes of every buffer are fixed for a given batch size: the step is CUDA-graph capturable.
#pragma once

#include <cuda.h>  // CUtensorMap

#include "common/fast_divmod.h"
#include <cuda_runtime.h>

#include <cstdint>

#include "common/types.h"

namespace mla::decode {

inline constexpr int kBlockN = 64;          // keys per tile: the planner's and kernels' work unit
inline constexpr int kScheduleFields = 8;   // int32 per part, see ScheduleField
inline constexpr int kSplitInfoFields = 2;  // int32 per request: num_splits, partial_base
inline constexpr int kPlanOverheadTiles = 5;  // planner's cost of a request beyond its tiles, in tiles
inline constexpr float kLn2 = 0.693147180559945309f;  // lse out = log2-domain lse * ln 2
// 64-key tiles covering `len` keys, without the int32 overflow of (len + 63) / 64 near 2^31.
__host__ __device__ constexpr int key_tiles(int len) { return len / kBlockN + (len % kBlockN != 0); }

// One part of the schedule covers requests begin_req..end_req (inclusive; empty when
// begin_req > end_req); tiles [begin_tile, ...) of begin_req, [..., end_tile) of end_req and all
// tiles of the requests between. begin_split is the split index of its first piece.
// kSplitReq is a list, not a property of the part: row y holds the y-th split request (in
// request order), -1 after the last one, so combine visits exactly the split requests.
enum ScheduleField : int { kBeginReq = 0, kBeginTile, kEndReq, kEndTile, kBeginSplit, kSplitReq };

// Query rows (s_q x h_q) per CTA: 16, 32 or 64, so that h_q = 16 does not pay for 64 rows.
// (The format is an argument because a future kernel may size its tiles by it.)
int block_m_for(int num_rows, CacheFormat format);
int num_m_blocks(int num_rows, CacheFormat format);
// Parts of the schedule for this shape: the SMs divided among the m-blocks (at least 1). The
// schedule has one row per part, so a plan's size is its number of parts.
int num_parts_for(int num_sms, int s_q, int h_q, CacheFormat format);
// Upper bound on partial results (pieces of split requests) of any schedule with num_parts parts
// for b requests: each part ends with at most one cut, and each split request has one more piece
// than cuts.
inline int64_t max_partials_for(int64_t num_parts, int64_t b) { return num_parts + (b < num_parts ? b : num_parts); }
// The split kernels' fp32 workspace for a plan of num_parts parts, b requests and num_rows = s_q *
// h_q query rows: partial o [max_partials, num_rows, 512], then partial lse [max_partials,
// num_rows]. mla_ext.get_decode_plan allocates it once per step with the schedule, shaped
// [max_partials, s_q, h_q, 513] so that the binding can check a call's geometry against it; every
// layer's decode call of that step reuses it (they run in stream order, each combine reading it
// before the next layer's split kernel writes it).
inline int64_t workspace_floats(int64_t num_parts, int64_t b, int64_t num_rows) {
  return max_partials_for(num_parts, b) * num_rows * (kKvLoraRank + 1);
}

struct PlanParams {
  const int32_t* __restrict__ seq_lens;  // [b] int32 (negative = 0)
  int32_t* __restrict__ schedule;        // [num_parts, kScheduleFields] int32, written
  int32_t* __restrict__ split_info;      // [b, kSplitInfoFields] int32, written
  int b;                                 // 1 .. kPlanMaxBatch
  int num_parts;                         // num_parts_for(num_sms, s_q, h_q, format), <= kPlanMaxParts
  cudaStream_t stream;
};
inline constexpr int kPlanMaxBatch = 65535;  // the split kernels' and combine's grids
inline constexpr int kPlanMaxParts = 4096;

// One small kernel (one CTA), no host sync, CUDA-graph capturable; see plan/plan.cu.
void run_decode_plan(const PlanParams& params);

struct DecodeParams {
  // sm90 kernels with TMA tile copies (the fp8 16-row kernel's wgmma variant, the 16-bit pairs
  // kernel): the cache as a 3-D byte tensor [num_blocks][block_size][row bytes] read in [rows][128 B]
  // boxes in the 128-byte swizzle, and fp8_ds_mla's tile scales as [num_blocks][block_size][16 B].
  // Built by the dispatcher (kernel parameter space, where TMA wants them); unused otherwise.
  alignas(64) CUtensorMap kv_map;
  alignas(64) CUtensorMap scale_map;
  bool tma_tiles;                         // the maps are valid (else the kernel copies with cp.async)
  int tma_box_rows;                       // rows per TMA box: min(64, block_size); 64 % it == 0
  const void* __restrict__ q;             // [b, s_q, h_q, 576] bf16/fp16, strides below, 16-B aligned rows
  const void* __restrict__ kv_cache;      // [num_blocks, block_size, row] (row: 576 elems / 576 B / 656 B)
  const int32_t* __restrict__ block_table;  // [b, max_blocks] int32
  const int32_t* __restrict__ seq_lens;   // [b] int32
  const float* __restrict__ scale;        // [1] fp32 per-tensor scale (kFp8), else nullptr
  const int32_t* __restrict__ schedule;   // [num_parts, kScheduleFields] from the planner
  const int32_t* __restrict__ split_info; // [b, kSplitInfoFields] from the planner
  void* __restrict__ out;                 // [b, s_q, h_q, 512] q's dtype, strides below
  float* __restrict__ lse;                // [b, h_q, s_q] fp32, strides below
  float* __restrict__ partial_o;          // [max_partials, s_q * h_q, 512] fp32 workspace
  float* __restrict__ partial_lse;        // [max_partials, s_q * h_q] fp32 workspace (log2 units)
  int64_t max_partials;                   // slots of the workspace: max_partials_for(num_parts, b)
  int b, s_q, h_q;
  int num_rows;                           // s_q * h_q
  int num_parts;                          // grid.x = rows of schedule (the plan's part count)
  int64_t stride_q_b, stride_q_s, stride_q_h;        // elements
  int64_t stride_out_b, stride_out_s, stride_out_h;  // elements
  int64_t stride_lse_b, stride_lse_h, stride_lse_s;  // elements
  int64_t stride_cache_block_bytes, stride_cache_token_bytes;
  int64_t stride_block_table_b;           // elements
  int num_blocks, block_size, max_blocks;
  FastDivmod block_div;                   // block_size as multiply-shift; set by run_decode
  float softmax_scale_log2;               // softmax_scale * log2(e): scores live in the exp2 domain
  bool causal;
  DType q_dtype;                          // kBF16 or kFP16; the MMAs run in this type
  CacheFormat format;
  cudaStream_t stream;
};

// Picks the split kernel (decode/dispatch.cu: the sm90 kernels where they exist, unless
// force_portable, else the portable ones) and runs it, then the combine
// (csrc/decode/combine/combine.h). The caller ran the planner; num_parts and max_partials follow
// from the plan's shape, so a plan for another s_q / h_q / format still gives the right answer.
void run_decode(const DecodeParams& params, int device, bool force_portable);

}  // namespace mla::decode
