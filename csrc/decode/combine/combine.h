// Split combine shared by dense decode (csrc/decode) and sparse decode (csrc/sparse): merges the
// normalised fp32 partial outputs of a query row by their lse,
//   out = sum_k 2^(lse_k - lse) o_k,  lse = log2 sum_k 2^lse_k   (then natural log),
// optionally times the attention-sink factor e^lse / (e^lse + e^sink) (lse unchanged).
//
// Partial row of split k of request `req`, query row `row` (row = s * h_q + h):
//   (first_slot(req) + k) * stride_partial_slot + req * stride_partial_req + row
// dense:  first_slot = split_info[req].partial_base, stride_slot = s_q * h_q, stride_req = 0
//         ([max_partials, s_q * h_q, 512], slots handed out by the planner);
// sparse: first_slot = 0, stride_slot = b * s_q * h_q, stride_req = s_q * h_q
//         ([splits, b * s_q, h_q, 512], every row split the same number of times).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/types.h"

namespace mla::combine {

struct CombineParams {
  const float* __restrict__ partial_o;    // [num_slots, ..., 512] fp32, rows addressed as above
  const float* __restrict__ partial_lse;  // same rows, fp32; log2 units, or natural log (lse_is_natural)
  bool lse_is_natural;                    // sparse partials carry natural-log lse, dense ones log2
  int64_t num_slots;                      // slots in the workspace: slots past it are never read
  int64_t stride_partial_slot;            // rows between consecutive slots
  int64_t stride_partial_req;             // rows between consecutive requests (0 for dense)

  // Which requests to merge.
  // Dense: split_list[y * stride_split_list] for y = 0, 1, ... is the y-th split request (-1 ends
  //        the list; at most list_len entries) and split_info[req] = (num_splits, first_slot).
  // Sparse: split_list == nullptr: requests 0..b-1, each with `num_splits` splits from slot 0.
  const int32_t* __restrict__ split_list;  // dense: &schedule[0][kSplitReq]; else nullptr
  int stride_split_list;                   // int32 between list entries (kScheduleFields)
  int list_len;                            // rows of the schedule (dense)
  const int32_t* __restrict__ split_info;  // [b, 2] int32 (dense); else nullptr
  int num_splits;                          // splits of every request (sparse)

  const float* __restrict__ attn_sink;  // [h_q] fp32, may be nullptr (no sink)
  void* __restrict__ out;               // [b, s_q, h_q, 512] out_dtype, strides below (even, 4-byte aligned rows)
  float* __restrict__ lse;              // [b, h_q, s_q] fp32, natural log, strides below
  int64_t stride_out_b, stride_out_s, stride_out_h;  // elements
  int64_t stride_lse_b, stride_lse_h, stride_lse_s;  // elements
  int b, s_q, h_q;
  DType out_dtype;                      // kBF16 or kFP16
  int num_sms;                          // sizes the grid
  cudaStream_t stream;
};

// Launches the combine. With programmatic dependent launch (sm90+), the grid is launched while
// the kernel that wrote the partials is still running (the dense split kernels allow it from their
// start) and waits for it on the device before reading them, and before exiting, hiding the launch
// gap. The number of CTAs per query row (1, 2, 4 or 8) is picked from the shape.
void run_split_combine(const CombineParams& params);

}  // namespace mla::combine
