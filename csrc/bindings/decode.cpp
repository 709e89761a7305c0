// torch.ops.mla_ext.{decode_plan, decode_mla, decode_mla_out}: schemas and CUDA implementations.
// The CPU implementations are the reference (mla_ext/reference.py), registered from Python.
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/stable_helpers.h"
#include "common/arch.h"
#include "decode/decode.h"

namespace mla::bindings {
namespace {

constexpr const char* kPlanOp = "decode_plan";
constexpr const char* kOp = "decode_mla";

void check_plan_shape(const Tensor& schedule, const Tensor& split_info, int64_t b, int device, const char* op) {
  check_cuda(schedule, "schedule", op, device);
  check_cuda(split_info, "split_info", op, device);
  MLA_ARG_CHECK(schedule.scalar_type() == ScalarType::Int && schedule.dim() == 2 && schedule.size(0) >= 1 &&
                    schedule.size(0) <= 4096 && schedule.size(1) == decode::kScheduleFields && schedule.is_contiguous(),
                op, "schedule must be a contiguous int32 [num_parts, " << decode::kScheduleFields
                                                                     << "] tensor from decode_plan, got " << shape_str(schedule));
  MLA_ARG_CHECK(split_info.scalar_type() == ScalarType::Int && split_info.dim() == 2 && split_info.size(0) == b &&
                    split_info.size(1) == decode::kSplitInfoFields && split_info.is_contiguous(),
                op, "split_info must be a contiguous int32 [b=" << b << ", " << decode::kSplitInfoFields
                                                                << "] tensor from decode_plan, got " << shape_str(split_info));
}

void check_seq_lens(const Tensor& seq_lens, int64_t b, const char* op) {
  MLA_ARG_CHECK(seq_lens.scalar_type() == ScalarType::Int, op,
                "seq_lens must be int32, got " << scalar_type_name(seq_lens.scalar_type()));
  MLA_ARG_CHECK(seq_lens.dim() == 1 && seq_lens.stride(0) == 1 && (b < 0 || seq_lens.size(0) == b), op,
                "seq_lens must be a contiguous 1-D [b] tensor, got " << shape_str(seq_lens));
}

std::tuple<Tensor, Tensor> decode_plan(Tensor seq_lens, int64_t s_q, int64_t h_q, std::string kv_cache_dtype,
                                       int64_t num_sms) {
  const CacheFormat format = parse_cache_format(kv_cache_dtype, kPlanOp);
  const int device = seq_lens.get_device_index();
  check_cuda(seq_lens, "seq_lens", kPlanOp, device);
  check_seq_lens(seq_lens, -1, kPlanOp);
  const int64_t b = seq_lens.size(0);
  MLA_ARG_CHECK(b >= 1, kPlanOp, "seq_lens must have at least one request");
  MLA_ARG_CHECK(s_q >= 1 && s_q <= 16, kPlanOp, "s_q must be in [1, 16], got " << s_q);
  MLA_ARG_CHECK(h_q >= 1 && s_q * h_q <= (1 << 20), kPlanOp,
                "h_q must be >= 1 with s_q * h_q <= 2^20, got s_q " << s_q << ", h_q " << h_q);
  MLA_ARG_CHECK(num_sms >= 1 && num_sms <= 4096, kPlanOp, "num_sms must be in [1, 4096], got " << num_sms);
  const torch::stable::accelerator::DeviceGuard guard(device);
  // One schedule row per part: its size tells decode_mla how many parts to launch.
  const int num_parts = decode::num_parts_for(static_cast<int>(num_sms), static_cast<int>(s_q), static_cast<int>(h_q), format);
  Tensor schedule = torch::stable::new_empty(seq_lens, {num_parts, decode::kScheduleFields}, ScalarType::Int);
  Tensor split_info = torch::stable::new_empty(seq_lens, {b, decode::kSplitInfoFields}, ScalarType::Int);
  decode::PlanParams params{};
  params.seq_lens = static_cast<const int32_t*>(seq_lens.data_ptr());
  params.schedule = static_cast<int32_t*>(schedule.data_ptr());
  params.split_info = static_cast<int32_t*>(split_info.data_ptr());
  params.b = static_cast<int>(b);
  params.num_parts = num_parts;
  params.stream = current_stream(device);
  decode::run_decode_plan(params);
  return {schedule, split_info};
}

// Validates, plans when no plan was passed, and runs split kernel + combine into out/lse.
void decode_into(const Tensor& q, const Tensor& kv_cache, const Tensor& block_table, const Tensor& seq_lens,
                 double softmax_scale, const std::string& kv_cache_dtype, bool causal, const std::optional<Tensor>& scale,
                 std::optional<Tensor> schedule, std::optional<Tensor> split_info, bool force_portable, Tensor& out,
                 Tensor& lse) {
  const CacheFormat format = parse_cache_format(kv_cache_dtype, kOp);
  const int device = q.get_device_index();
  check_cuda(q, "q", kOp, device);
  check_cuda(kv_cache, "kv_cache", kOp, device);
  check_cuda(block_table, "block_table", kOp, device);
  check_cuda(seq_lens, "seq_lens", kOp, device);
  check_cuda(out, "out", kOp, device);
  check_cuda(lse, "lse", kOp, device);

  MLA_ARG_CHECK(q.dim() == 4 && q.size(3) == kLatentDim, kOp, "q must be [b, s_q, h_q, 576], got " << shape_str(q));
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  MLA_ARG_CHECK(b >= 1 && b < 65536, kOp, "batch size must be in [1, 65535], got " << b);
  MLA_ARG_CHECK(s_q >= 1 && s_q <= 16, kOp, "s_q must be in [1, 16], got " << s_q);
  MLA_ARG_CHECK(h_q >= 1 && s_q * h_q <= (1 << 20), kOp,
                "h_q must be >= 1 with s_q * h_q <= 2^20, got s_q " << s_q << ", h_q " << h_q);
  const ScalarType q_type = q.scalar_type();
  MLA_ARG_CHECK(q_type == ScalarType::BFloat16 || q_type == ScalarType::Half, kOp,
                "q must be bfloat16 or float16, got " << scalar_type_name(q_type));
  MLA_ARG_CHECK(q.stride(3) == 1 && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 && q.stride(2) % 8 == 0 &&
                    aligned16(q.data_ptr()),
                kOp, "q needs a contiguous last dim and 16-byte aligned rows (strides multiples of 8); call .contiguous()");

  const float* scale_ptr = check_kv_cache(kv_cache, format, kv_cache_dtype, q_type, "q", scale, kOp, device);
  const int64_t cache_elem = element_size(kv_cache.scalar_type());
  const int64_t stride_block_bytes = kv_cache.stride(0) * cache_elem, stride_token_bytes = kv_cache.stride(1) * cache_elem;
  MLA_ARG_CHECK(aligned16(kv_cache.data_ptr()) && stride_block_bytes % 16 == 0 && stride_token_bytes % 16 == 0, kOp,
                "kv_cache must be 16-byte aligned with page and row strides that are multiples of 16 bytes, got strides "
                    << kv_cache.stride(0) << ", " << kv_cache.stride(1) << " elements");
  MLA_ARG_CHECK(kv_cache.size(0) < (int64_t(1) << 31) && kv_cache.size(1) >= 1 && kv_cache.size(1) < (int64_t(1) << 31), kOp,
                "kv_cache has a bad shape " << shape_str(kv_cache));

  MLA_ARG_CHECK(block_table.scalar_type() == ScalarType::Int && block_table.dim() == 2 && block_table.size(0) == b &&
                    block_table.stride(1) == 1 && block_table.size(1) >= 1,
                kOp, "block_table must be int32 [b=" << b << ", max_blocks] with a contiguous last dim, got "
                                                     << scalar_type_name(block_table.scalar_type()) << " " << shape_str(block_table));
  check_seq_lens(seq_lens, b, kOp);

  MLA_ARG_CHECK(out.scalar_type() == q_type && out.dim() == 4 && out.size(0) == b && out.size(1) == s_q &&
                    out.size(2) == h_q && out.size(3) == kKvLoraRank && out.stride(3) == 1 && out.stride(0) % 2 == 0 &&
                    out.stride(1) % 2 == 0 && out.stride(2) % 2 == 0 && reinterpret_cast<uintptr_t>(out.data_ptr()) % 4 == 0,
                kOp, "out must be " << scalar_type_name(q_type) << " [" << b << ", " << s_q << ", " << h_q
                                    << ", 512] with a contiguous last dim and even strides, got " << shape_str(out));
  MLA_ARG_CHECK(lse.scalar_type() == ScalarType::Float && lse.dim() == 3 && lse.size(0) == b && lse.size(1) == h_q &&
                    lse.size(2) == s_q,
                kOp, "lse must be float32 [" << b << ", " << h_q << ", " << s_q << "], got " << shape_str(lse));

  const torch::stable::accelerator::DeviceGuard guard(device);
  const mla::DeviceInfo& info = mla::device_info(device);
  if (!schedule.has_value()) {
    MLA_ARG_CHECK(!split_info.has_value(), kOp, "pass schedule and split_info together (both from decode_plan)");
    auto [sched, info_t] = decode_plan(seq_lens, s_q, h_q, kv_cache_dtype, info.num_sms);
    schedule = sched;
    split_info = info_t;
  }
  MLA_ARG_CHECK(split_info.has_value(), kOp, "pass schedule and split_info together (both from decode_plan)");
  check_plan_shape(*schedule, *split_info, b, device, kOp);

  // Launch as many parts as the plan has and room for all the partials it can produce, so any
  // plan for this batch (even one made for another s_q, h_q or format) is computed correctly;
  // only the plan's balance depends on its geometry.
  const int num_parts = static_cast<int>(schedule->size(0));
  const int64_t max_partials = decode::max_partials_for(num_parts, b);
  const int64_t num_rows = s_q * h_q;
  Tensor partial_o = torch::stable::new_empty(q, {max_partials, num_rows, kKvLoraRank}, ScalarType::Float);
  Tensor partial_lse = torch::stable::new_empty(q, {max_partials, num_rows}, ScalarType::Float);

  decode::DecodeParams p{};
  p.q = q.data_ptr();
  p.kv_cache = kv_cache.data_ptr();
  p.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  p.seq_lens = static_cast<const int32_t*>(seq_lens.data_ptr());
  p.scale = scale_ptr;
  p.schedule = static_cast<const int32_t*>(schedule->data_ptr());
  p.split_info = static_cast<const int32_t*>(split_info->data_ptr());
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.partial_o = static_cast<float*>(partial_o.data_ptr());
  p.partial_lse = static_cast<float*>(partial_lse.data_ptr());
  p.max_partials = max_partials;
  p.b = static_cast<int>(b);
  p.s_q = static_cast<int>(s_q);
  p.h_q = static_cast<int>(h_q);
  p.num_rows = static_cast<int>(num_rows);
  p.num_parts = num_parts;
  p.stride_q_b = q.stride(0);
  p.stride_q_s = q.stride(1);
  p.stride_q_h = q.stride(2);
  p.stride_out_b = out.stride(0);
  p.stride_out_s = out.stride(1);
  p.stride_out_h = out.stride(2);
  p.stride_lse_b = lse.stride(0);
  p.stride_lse_h = lse.stride(1);
  p.stride_lse_s = lse.stride(2);
  p.stride_cache_block_bytes = stride_block_bytes;
  p.stride_cache_token_bytes = stride_token_bytes;
  p.stride_block_table_b = block_table.stride(0);
  p.num_blocks = static_cast<int>(kv_cache.size(0));
  p.block_size = static_cast<int>(kv_cache.size(1));
  p.max_blocks = static_cast<int>(block_table.size(1));
  p.softmax_scale_log2 = static_cast<float>(softmax_scale * 1.4426950408889634);
  p.causal = causal;
  p.q_dtype = to_dtype(q_type);
  p.format = format;
  p.stream = current_stream(device);
  decode::run_decode(p, device, force_portable || mla::force_portable());
}

std::tuple<Tensor, Tensor> decode_mla(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, double softmax_scale,
                                      std::string kv_cache_dtype, bool causal, std::optional<Tensor> scale,
                                      std::optional<Tensor> schedule, std::optional<Tensor> split_info, bool force_portable) {
  MLA_ARG_CHECK(q.dim() == 4, kOp, "q must be [b, s_q, h_q, 576], got " << shape_str(q));
  Tensor out = torch::stable::new_empty(q, {q.size(0), q.size(1), q.size(2), kKvLoraRank});
  Tensor lse = torch::stable::new_empty(q, {q.size(0), q.size(2), q.size(1)}, ScalarType::Float);
  decode_into(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
              force_portable, out, lse);
  return {out, lse};
}

void decode_mla_out(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, double softmax_scale,
                    std::string kv_cache_dtype, bool causal, std::optional<Tensor> scale, std::optional<Tensor> schedule,
                    std::optional<Tensor> split_info, bool force_portable, Tensor out, Tensor lse) {
  decode_into(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
              force_portable, out, lse);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(mla_ext, m) {
  m.def("decode_plan(Tensor seq_lens, int s_q, int h_q, str kv_cache_dtype, int num_sms) -> (Tensor, Tensor)");
  m.def(
      "decode_mla(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, float softmax_scale, "
      "str kv_cache_dtype, bool causal, Tensor? scale=None, Tensor? schedule=None, Tensor? split_info=None, "
      "bool force_portable=False) -> (Tensor, Tensor)");
  m.def(
      "decode_mla_out(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, float softmax_scale, "
      "str kv_cache_dtype, bool causal, Tensor? scale, Tensor? schedule, Tensor? split_info, bool force_portable, "
      "Tensor(a!) out, Tensor(b!) lse) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mla_ext, CUDA, m) {
  m.impl("decode_plan", TORCH_BOX(&decode_plan));
  m.impl("decode_mla", TORCH_BOX(&decode_mla));
  m.impl("decode_mla_out", TORCH_BOX(&decode_mla_out));
}

}  // namespace mla::bindings
