// torch.ops.mla_ext.{decode_plan, decode_mla (and its overload .planned), decode_mla_out}: schemas
// and CUDA implementations.
// The CPU implementations are the reference (mla_ext/reference.py), registered from Python.
//
// Per step, decode_plan makes the schedule (and mla_ext.get_decode_plan the split kernels'
// workspace for partial o and lse, workspace_floats in decode.h); per layer, decode_mla allocates
// only its outputs (decode_mla_out nothing) when it is given the plan and the workspace. The
// workspace is shared by every call that is given it: calls on one stream (the layers of a step)
// are ordered, but two streams running the same plan at once need a plan each. Without a
// workspace a call allocates its own (one allocation through the caching allocator).
#include <optional>
#include <string>
#include <tuple>

#include "bindings/stable_helpers.h"
#include "common/arch.h"
#include "decode/decode.h"

namespace mla::bindings {
namespace {

constexpr const char* kPlanOp = "decode_plan";
constexpr const char* kOp = "decode_mla";

// seq_lens int32 [b], contiguous. b < 0: any batch of 1 .. kPlanMaxBatch (the planner's input).
void check_seq_lens(const Tensor& seq_lens, int64_t b, const char* op) {
  check_index_dtype(seq_lens, "seq_lens", ScalarType::Int, op);
  if (b < 0) {
    MLA_ARG_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) >= 1 && seq_lens.size(0) <= decode::kPlanMaxBatch &&
                      seq_lens.stride(0) == 1,
                  op, "seq_lens must be 1-D [b] with 1 <= b <= " << decode::kPlanMaxBatch << ", contiguous, got "
                                                               << shape_str(seq_lens) << " strides "
                                                               << strides_str(seq_lens));
  } else {
    MLA_ARG_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == b && (seq_lens.stride(0) == 1 || b == 1), op,
                  "seq_lens must be [b=" << b << "], contiguous, got " << shape_str(seq_lens) << " strides "
                                         << strides_str(seq_lens));
  }
}

void check_plan_args(int64_t s_q, int64_t h_q, const char* op) {
  MLA_ARG_CHECK(s_q >= 1 && s_q <= 16, op, "s_q must be in [1, 16], got " << s_q);
  MLA_ARG_CHECK(h_q >= 1 && s_q * h_q <= (1 << 20), op,
                "h_q must be >= 1 with s_q * h_q <= 2^20, got s_q " << s_q << ", h_q " << h_q);
}

// The plan's tensors, as decode_plan makes them for a batch of b. Their values are bounds-checked
// by the kernels (a hand-made plan can give a wrong answer, never an access outside the buffers).
void check_plan_shape(const Tensor& schedule, const Tensor& split_info, int64_t b) {
  MLA_ARG_CHECK(schedule.scalar_type() == ScalarType::Int && schedule.dim() == 2 && schedule.size(0) >= 1 &&
                    schedule.size(0) <= decode::kPlanMaxParts && schedule.size(1) == decode::kScheduleFields &&
                    schedule.is_contiguous(),
                kOp, "schedule must be int32 [num_parts, " << decode::kScheduleFields << "] with 1 <= num_parts <= "
                                                           << decode::kPlanMaxParts
                                                           << ", contiguous, from decode_plan, got "
                                                           << scalar_type_name(schedule.scalar_type()) << " "
                                                           << shape_str(schedule));
  MLA_ARG_CHECK(split_info.scalar_type() == ScalarType::Int && split_info.dim() == 2 && split_info.size(0) == b &&
                    split_info.size(1) == decode::kSplitInfoFields && split_info.is_contiguous(),
                kOp, "split_info must be int32 [b=" << b << ", " << decode::kSplitInfoFields
                                                    << "], contiguous, from decode_plan for this batch, got "
                                                    << scalar_type_name(split_info.scalar_type()) << " "
                                                    << shape_str(split_info));
}

// Schedule and split_info of a validated seq_lens on `device` (the current device).
std::tuple<Tensor, Tensor> plan_on(const Tensor& seq_lens, int64_t s_q, int64_t h_q, CacheFormat format,
                                   int64_t num_sms, int device) {
  const int64_t b = seq_lens.size(0);
  // One schedule row per part: its size tells decode_mla how many parts to launch.
  const int num_parts =
      decode::num_parts_for(static_cast<int>(num_sms), static_cast<int>(s_q), static_cast<int>(h_q), format);
  Tensor schedule = empty_cuda({num_parts, decode::kScheduleFields}, ScalarType::Int, device);
  Tensor split_info = empty_cuda({b, decode::kSplitInfoFields}, ScalarType::Int, device);
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

std::tuple<Tensor, Tensor> decode_plan(Tensor seq_lens, int64_t s_q, int64_t h_q, std::string kv_cache_dtype,
                                               int64_t num_sms) {
  const CacheFormat format = parse_cache_format(kv_cache_dtype, kPlanOp);
  const int device = check_same_cuda_device(kPlanOp, {{"seq_lens", &seq_lens}});
  check_seq_lens(seq_lens, -1, kPlanOp);
  check_plan_args(s_q, h_q, kPlanOp);
  MLA_ARG_CHECK(num_sms >= 1 && num_sms <= decode::kPlanMaxParts, kPlanOp,
                "num_sms must be in [1, " << decode::kPlanMaxParts << "], got " << num_sms);
  const CudaDeviceScope device_scope(device);
  return plan_on(seq_lens, s_q, h_q, format, num_sms, device);
}

// Validates, plans when no plan was passed, allocates what was not passed (out, lse, workspace)
// and runs split kernel + combine. Returns (out, lse).
std::tuple<Tensor, Tensor> decode_impl(const Tensor& q_in, const Tensor& kv_cache, const Tensor& block_table,
                                       const Tensor& seq_lens, double softmax_scale, const std::string& kv_cache_dtype,
                                       bool causal, const std::optional<Tensor>& scale, std::optional<Tensor> schedule,
                                       std::optional<Tensor> split_info, std::optional<Tensor> workspace,
                                       bool force_portable, const std::optional<Tensor>& out_in,
                                       const std::optional<Tensor>& lse_in) {
  const CacheFormat format = parse_cache_format(kv_cache_dtype, kOp);
  const int device = check_same_cuda_device(
      kOp, {{"q", &q_in}, {"kv_cache", &kv_cache}, {"block_table", &block_table}, {"seq_lens", &seq_lens},
            {"scale", opt(scale)}, {"schedule", opt(schedule)}, {"split_info", opt(split_info)},
            {"workspace", opt(workspace)}, {"out", opt(out_in)}, {"lse", opt(lse_in)}});

  // q [b, s_q, h_q, 576] bf16/fp16 with a contiguous last dim; rows read in 16-byte pieces.
  MLA_ARG_CHECK(q_in.dim() == 4 && q_in.size(3) == kLatentDim, kOp,
                "q must be [b, s_q, h_q, 576], got " << shape_str(q_in));
  const int64_t b = q_in.size(0), s_q = q_in.size(1), h_q = q_in.size(2);
  MLA_ARG_CHECK(b >= 1 && b <= decode::kPlanMaxBatch, kOp,
                "b (q.shape[0]) must be in [1, " << decode::kPlanMaxBatch << "], got " << b);
  MLA_ARG_CHECK(s_q >= 1 && s_q <= 16, kOp, "s_q (q.shape[1]) must be in [1, 16], got " << s_q);
  MLA_ARG_CHECK(h_q >= 1 && s_q * h_q <= (1 << 20), kOp,
                "h_q (q.shape[2]) must be >= 1 with s_q * h_q <= 2^20, got s_q " << s_q << ", h_q " << h_q);
  const ScalarType q_type = q_in.scalar_type();
  MLA_ARG_CHECK(q_type == ScalarType::BFloat16 || q_type == ScalarType::Half, kOp,
                "q must be bfloat16 or float16, got " << scalar_type_name(q_type));
  MLA_ARG_CHECK(q_in.stride(3) == 1, kOp,
                "q's last dim must be contiguous (stride 1), got strides " << strides_str(q_in));
  const Tensor q = aligned_or_copy(q_in, "q", kOp);

  const float* scale_ptr = check_kv_cache(kv_cache, format, kv_cache_dtype, q_type, "q", scale, kOp);
  const int64_t cache_elem = element_size(kv_cache.scalar_type());
  const int64_t stride_block_bytes = kv_cache.stride(0) * cache_elem, stride_token_bytes = kv_cache.stride(1) * cache_elem;
  MLA_ARG_CHECK(mla::aligned16(kv_cache.data_ptr()) && stride_block_bytes % 16 == 0 && stride_token_bytes % 16 == 0,
                kOp, "kv_cache must be 16-byte aligned with page and row strides that are multiples of 16 bytes, "
                     "got strides " << strides_str(kv_cache));
  MLA_ARG_CHECK(kv_cache.size(1) >= 1 && kv_cache.size(1) < (int64_t(1) << 31), kOp,
                "kv_cache's block_size must be >= 1 (and < 2^31), got " << shape_str(kv_cache));
  MLA_ARG_CHECK(kv_cache.size(0) < (int64_t(1) << 31), kOp,
                "kv_cache must have < 2^31 blocks, got " << shape_str(kv_cache));

  check_index_dtype(block_table, "block_table", ScalarType::Int, kOp);
  MLA_ARG_CHECK(block_table.dim() == 2 && block_table.size(0) == b && block_table.size(1) >= 1 &&
                    (block_table.stride(1) == 1 || block_table.size(1) == 1),
                kOp, "block_table must be [b=" << b << ", max_blocks >= 1] with a contiguous last dim, got "
                                               << shape_str(block_table) << " strides " << strides_str(block_table));
  check_seq_lens(seq_lens, b, kOp);

  if (out_in.has_value()) {
    const Tensor& out = *out_in;
    MLA_ARG_CHECK(out.scalar_type() == q_type && out.dim() == 4 && out.size(0) == b && out.size(1) == s_q &&
                      out.size(2) == h_q && out.size(3) == kKvLoraRank,
                  kOp, "out must be " << scalar_type_name(q_type) << " [" << b << ", " << s_q << ", " << h_q
                                      << ", 512], got " << scalar_type_name(out.scalar_type()) << " "
                                      << shape_str(out));
    check_no_zero_strides(out, "out", kOp);
    MLA_ARG_CHECK(out.stride(3) == 1 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0 && out.stride(2) % 2 == 0 &&
                      reinterpret_cast<uintptr_t>(out.data_ptr()) % 4 == 0,
                  kOp, "out needs a contiguous last dim and even strides (4-byte aligned pairs), got strides "
                           << strides_str(out));
  }
  if (lse_in.has_value()) {
    const Tensor& lse = *lse_in;
    MLA_ARG_CHECK(lse.scalar_type() == ScalarType::Float && lse.dim() == 3 && lse.size(0) == b && lse.size(1) == h_q &&
                      lse.size(2) == s_q,
                  kOp, "lse must be float32 [" << b << ", " << h_q << ", " << s_q << "], got "
                                               << scalar_type_name(lse.scalar_type()) << " " << shape_str(lse));
    check_no_zero_strides(lse, "lse", kOp);
  }
  MLA_ARG_CHECK(schedule.has_value() == split_info.has_value(), kOp,
                "pass schedule and split_info together (both from decode_plan)");

  const CudaDeviceScope device_scope(device);
  if (!schedule.has_value()) {
    // Planned here: one plan per call (get_decode_plan once per step is what an engine does).
    auto [sched, info] = plan_on(seq_lens, s_q, h_q, format, mla::device_info(device).num_sms, device);
    schedule = sched;
    split_info = info;
  }
  check_plan_shape(*schedule, *split_info, b);

  // Launch as many parts as the plan has and room for all the partials it can produce, so any
  // plan for this batch (even one made for another s_q, h_q or format) is computed correctly;
  // only the plan's balance depends on its geometry (and its workspace's size on s_q * h_q).
  const int num_parts = static_cast<int>(schedule->size(0));
  const int64_t num_rows = s_q * h_q;
  const int64_t max_partials = decode::max_partials_for(num_parts, b);
  const int64_t need = decode::workspace_floats(num_parts, b, num_rows);
  if (workspace.has_value()) {
    // get_decode_plan's workspace is [max_partials, s_q, h_q, 513]: its shape records the geometry
    // the plan was made for (Python metadata the wrapper would otherwise compare on every call).
    MLA_ARG_CHECK(workspace->dim() != 4 || (workspace->size(1) == s_q && workspace->size(2) == h_q), kOp,
                  "plan was made for s_q=" << workspace->size(1) << ", h_q=" << workspace->size(2)
                                           << " but this call has s_q=" << s_q << ", h_q=" << h_q
                                           << ": make a plan with get_decode_plan for this geometry");
    MLA_ARG_CHECK(workspace->scalar_type() == ScalarType::Float && workspace->is_contiguous() &&
                      workspace->numel() >= need && mla::aligned16(workspace->data_ptr()),
                  kOp, "workspace must be a contiguous, 16-byte aligned float32 tensor of at least "
                           << need << " elements (the one get_decode_plan made for this batch, s_q=" << s_q
                           << " and h_q=" << h_q << "), got " << scalar_type_name(workspace->scalar_type()) << " "
                           << shape_str(*workspace));
  } else {
    workspace = empty_cuda({need}, ScalarType::Float, device);
  }
  Tensor out = out_in.has_value() ? *out_in : empty_cuda({b, s_q, h_q, kKvLoraRank}, q_type, device);
  Tensor lse = lse_in.has_value() ? *lse_in : empty_cuda({b, h_q, s_q}, ScalarType::Float, device);
  float* partials = static_cast<float*>(workspace->data_ptr());

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
  p.partial_o = partials;
  p.partial_lse = partials + max_partials * num_rows * kKvLoraRank;
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
  return {out, lse};
}

std::tuple<Tensor, Tensor> decode_mla(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens,
                                      double softmax_scale, std::string kv_cache_dtype, bool causal,
                                      std::optional<Tensor> scale, std::optional<Tensor> schedule,
                                      std::optional<Tensor> split_info, bool force_portable,
                                      std::optional<Tensor> workspace) {
  return decode_impl(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                     split_info, workspace, force_portable, std::nullopt, std::nullopt);
}

// The overload the wrapper calls with a plan in the usual case: causal, no fp8 scale, nothing
// forced, the format the cache's own (a 16-bit cache: 'auto'; uint8 rows of 656 bytes:
// 'fp8_ds_mla'; an fp8 cache, which needs its scale, is refused). Every argument passed through
// torch.ops costs host time (on the H200's host 0.3-0.5 us a tensor, up to 0.7 a Python float; four
// left at their defaults 0.5), so this schema has the 8 that change from call to call and no more.
std::tuple<Tensor, Tensor> decode_mla_planned(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens,
                                              double softmax_scale, Tensor schedule, Tensor split_info,
                                              Tensor workspace) {
  const ScalarType cache_type = kv_cache.scalar_type();
  const bool ds_mla = cache_type == ScalarType::Byte && kv_cache.dim() == 3 && kv_cache.size(2) == kDsMlaRowBytes;
  MLA_ARG_CHECK(ds_mla || (cache_type != ScalarType::Byte && cache_type != ScalarType::Float8_e4m3fn), kOp,
                "the planned overload takes a 16-bit cache ('auto') or an fp8_ds_mla one (uint8, rows of 656 bytes), "
                "got " << scalar_type_name(cache_type) << " " << shape_str(kv_cache)
                       << ": for an fp8 cache call decode_mla with kv_cache_dtype='fp8' and its scale");
  const char* format = ds_mla ? "fp8_ds_mla" : "auto";
  return decode_impl(q, kv_cache, block_table, seq_lens, softmax_scale, format, /*causal=*/true, std::nullopt,
                     schedule, split_info, workspace, /*force_portable=*/false, std::nullopt, std::nullopt);
}

void decode_mla_out(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, double softmax_scale,
                    std::string kv_cache_dtype, bool causal, std::optional<Tensor> scale, std::optional<Tensor> schedule,
                    std::optional<Tensor> split_info, bool force_portable, Tensor out, Tensor lse,
                    std::optional<Tensor> workspace) {
  decode_impl(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
              workspace, force_portable, out, lse);
}

}  // namespace

// The workspace is written by every call (scratch: its values do not matter before or after), so
// the schema marks it mutable; torch.compile then threads it through the layers of a step.
STABLE_TORCH_LIBRARY_FRAGMENT(mla_ext, m) {
  m.def("decode_plan(Tensor seq_lens, int s_q, int h_q, str kv_cache_dtype, int num_sms) -> (Tensor, Tensor)");
  m.def(
      "decode_mla(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, float softmax_scale, "
      "str kv_cache_dtype, bool causal, Tensor? scale=None, Tensor? schedule=None, Tensor? split_info=None, "
      "bool force_portable=False, Tensor(a!)? workspace=None) -> (Tensor, Tensor)");
  m.def(
      "decode_mla.planned(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, float softmax_scale, "
      "Tensor schedule, Tensor split_info, Tensor(a!) workspace) -> (Tensor, Tensor)");
  m.def(
      "decode_mla_out(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, float softmax_scale, "
      "str kv_cache_dtype, bool causal, Tensor? scale, Tensor? schedule, Tensor? split_info, bool force_portable, "
      "Tensor(a!) out, Tensor(b!) lse, Tensor(c!)? workspace=None) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mla_ext, CUDA, m) {
  m.impl("decode_plan", TORCH_BOX(&decode_plan));
  m.impl("decode_mla", TORCH_BOX(&decode_mla));
  m.impl("decode_mla.planned", TORCH_BOX(&decode_mla_planned));
  m.impl("decode_mla_out", TORCH_BOX(&decode_mla_out));
}

}  // namespace mla::bindings
