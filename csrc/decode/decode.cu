// Decode host entry: shape helpers shared by planner and kernels, and the architecture dispatch.
#include "decode/decode.h"

#include <algorithm>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "decode/combine/combine.h"

namespace mla::decode {

int block_m_for(int num_rows, CacheFormat /*format*/) {
  if (num_rows <= 16) return 16;
  if (num_rows <= 32) return 32;
  return 64;
}

int num_m_blocks(int num_rows, CacheFormat format) {
  const int bm = block_m_for(num_rows, format);
  return (num_rows + bm - 1) / bm;
}

int num_parts_for(int num_sms, int s_q, int h_q, CacheFormat format) {
  return std::max(1, num_sms / num_m_blocks(s_q * h_q, format));
}

void run_decode(const DecodeParams& p, int device, bool force_portable) {
  const DeviceInfo& info = device_info(device);
  MLA_HOST_CHECK(info.sm_version >= 80, "decode needs sm80 or newer");
  // On sm90 (unless forced portable) the fp8 caches' memory-bound kernel runs QK^T on wgmma, the
  // only fp8 tensor math Hopper has; everything else, and sm100, runs the portable kernels.
  run_decode_split_portable(p, info.sm_version, info.sm_version == 90 && !force_portable);

  // Merge the pieces of split requests (the planner lists them in the kSplitReq column).
  static_assert(kSplitInfoFields == 2, "combine reads split_info as (num_splits, first slot) pairs");
  combine::CombineParams c{};
  c.partial_o = p.partial_o;
  c.partial_lse = p.partial_lse;
  c.lse_is_natural = false;  // the split kernels write log2-domain lse
  c.num_slots = p.max_partials;
  c.stride_partial_slot = p.num_rows;
  c.stride_partial_req = 0;
  c.split_list = p.schedule + kSplitReq;
  c.stride_split_list = kScheduleFields;
  c.list_len = p.num_parts;
  c.split_info = p.split_info;
  c.attn_sink = nullptr;
  c.out = p.out;
  c.lse = p.lse;
  c.stride_out_b = p.stride_out_b;
  c.stride_out_s = p.stride_out_s;
  c.stride_out_h = p.stride_out_h;
  c.stride_lse_b = p.stride_lse_b;
  c.stride_lse_h = p.stride_lse_h;
  c.stride_lse_s = p.stride_lse_s;
  c.b = p.b;
  c.s_q = p.s_q;
  c.h_q = p.h_q;
  c.out_dtype = p.q_dtype;
  c.num_sms = info.num_sms;
  c.stream = p.stream;
  combine::run_split_combine(c);
}

}  // namespace mla::decode
