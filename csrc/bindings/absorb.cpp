// torch.ops.mla_ext.{q_absorb, q_absorb_out, v_up, v_up_out}: schemas and CUDA implementations.
// The CPU implementations are the reference (mla_ext/reference.py), registered from Python.
#include <vector>

#include "absorb/absorb.h"
#include "bindings/stable_helpers.h"

namespace mla::bindings {
namespace {

constexpr const char* kQOp = "q_absorb";
constexpr const char* kVOp = "v_up";

bool aligned16(const Tensor& t) {
  if (!mla::aligned16(t.data_ptr())) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if ((t.stride(d) * element_size(t.scalar_type())) % 16 != 0 && t.size(d) > 1) return false;
  }
  return true;
}

void check_aligned(const Tensor& t, const char* name, const char* op) {
  MLA_ARG_CHECK(aligned16(t), op,
                name << " (" << shape_str(t) << ") must start on a 16-byte boundary and have row strides that are "
                        "multiples of 8 elements (mla_ext.q_absorb / mla_ext.v_up go through aligned copies instead)");
}

// Weight [H, 128, 512] bf16 or e4m3 in the row-major layout of its kv_b_proj rows (strides
// given by the caller: W_UK_T contiguous, W_UV as the transpose of a contiguous [H, 128, 512]),
// plus its [H, 4] scales when e4m3.
DType check_weight(const Tensor& w, const std::optional<Tensor>& scale, const char* name, int64_t heads,
                   const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, const char* op, int device) {
  check_cuda(w, name, op, device);
  MLA_ARG_CHECK(w.dim() == 3 && w.size(0) == heads && w.size(1) == shape[0] && w.size(2) == shape[1], op,
                name << " must be [" << heads << ", " << shape[0] << ", " << shape[1] << "], got " << shape_str(w));
  // (the stride of a size-1 dim is irrelevant: H = 1 weights may keep kv_b_proj's head stride)
  MLA_ARG_CHECK((w.stride(0) == strides[0] || heads == 1) && w.stride(1) == strides[1] && w.stride(2) == strides[2], op,
                name << " must have strides (" << strides[0] << ", " << strides[1] << ", " << strides[2]
                     << "), the layout prepare_absorb_weights makes");
  const ScalarType wt = w.scalar_type();
  MLA_ARG_CHECK(wt == ScalarType::BFloat16 || wt == ScalarType::Float8_e4m3fn, op,
                name << " must be bfloat16 or float8_e4m3fn, got " << scalar_type_name(wt));
  MLA_ARG_CHECK(reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0, op, name << " must be 16-byte aligned");
  if (wt == ScalarType::Float8_e4m3fn) {
    MLA_ARG_CHECK(scale.has_value(), op, "float8_e4m3fn " << name << " needs " << name << "_scale [H, 4] float32");
    check_cuda(*scale, "scale", op, device);
    MLA_ARG_CHECK(scale->scalar_type() == ScalarType::Float && scale->dim() == 2 && scale->size(0) == heads &&
                      scale->size(1) == kNumLatentBlocks && scale->stride(1) == 1 &&
                      (scale->stride(0) == kNumLatentBlocks || heads == 1),
                  op, name << "_scale must be a contiguous [" << heads << ", 4] float32 tensor, got "
                           << scalar_type_name(scale->scalar_type()) << " " << shape_str(*scale));
  } else {
    MLA_ARG_CHECK(!scale.has_value(), op, name << "_scale is only for float8_e4m3fn " << name);
  }
  return to_dtype(wt);
}

void q_absorb_out(Tensor q_nope, Tensor q_pe, Tensor w_uk_t, std::optional<Tensor> w_uk_t_scale, Tensor out) {
  const int device = q_nope.get_device_index();
  check_cuda(q_nope, "q_nope", kQOp, device);
  check_cuda(q_pe, "q_pe", kQOp, device);
  check_cuda(out, "out", kQOp, device);
  MLA_ARG_CHECK(q_nope.dim() == 3 && q_nope.size(2) == kQkNopeHeadDim, kQOp,
                "q_nope must be [num_tokens, num_heads, 128], got " << shape_str(q_nope));
  const int64_t T = q_nope.size(0), H = q_nope.size(1);
  MLA_ARG_CHECK(q_pe.dim() == 3 && q_pe.size(0) == T && q_pe.size(1) == H && q_pe.size(2) == kRopeDim, kQOp,
                "q_pe must be [" << T << ", " << H << ", 64] like q_nope, got " << shape_str(q_pe));
  MLA_ARG_CHECK(out.dim() == 3 && out.size(0) == T && out.size(1) == H && out.size(2) == kLatentDim, kQOp,
                "out must be [" << T << ", " << H << ", 576], got " << shape_str(out));
  MLA_ARG_CHECK(q_nope.scalar_type() == ScalarType::BFloat16, kQOp,
                "q_nope must be bfloat16, got " << scalar_type_name(q_nope.scalar_type()));
  MLA_ARG_CHECK(q_pe.scalar_type() == ScalarType::BFloat16 && out.scalar_type() == ScalarType::BFloat16, kQOp,
                "q_pe and out must be bfloat16 like q_nope");
  MLA_ARG_CHECK(q_nope.stride(2) == 1 && q_pe.stride(2) == 1 && out.stride(2) == 1, kQOp,
                "q_nope, q_pe and out must have a contiguous last dim (stride 1)");
  check_aligned(q_nope, "q_nope", kQOp);
  check_aligned(q_pe, "q_pe", kQOp);
  check_aligned(out, "out", kQOp);
  const DType wdt = check_weight(w_uk_t, w_uk_t_scale, "w_uk_t", H, {kQkNopeHeadDim, kKvLoraRank},
                                 {kQkNopeHeadDim * kKvLoraRank, kKvLoraRank, 1}, kQOp, device);

  const torch::stable::accelerator::DeviceGuard guard(device);
  AbsorbParams p{};
  p.a = q_nope.data_ptr();
  p.w = w_uk_t.data_ptr();
  p.w_scale = w_uk_t_scale.has_value() ? static_cast<const float*>(w_uk_t_scale->data_ptr()) : nullptr;
  p.q_pe = q_pe.data_ptr();
  p.c = out.data_ptr();
  p.num_tokens = T;
  p.num_heads = H;
  p.stride_a_token = q_nope.stride(0);
  p.stride_a_head = q_nope.stride(1);
  p.stride_q_pe_token = q_pe.stride(0);
  p.stride_q_pe_head = q_pe.stride(1);
  p.stride_c_token = out.stride(0);
  p.stride_c_head = out.stride(1);
  p.op = AbsorbOp::kQAbsorb;
  p.weight_dtype = wdt;
  p.device = device;
  p.stream = current_stream(device);
  run_absorb(p);
}

Tensor q_absorb(Tensor q_nope, Tensor q_pe, Tensor w_uk_t, std::optional<Tensor> w_uk_t_scale) {
  MLA_ARG_CHECK(q_nope.dim() == 3, kQOp, "q_nope must be [num_tokens, num_heads, 128], got " << shape_str(q_nope));
  Tensor out = torch::stable::new_empty(q_nope, {q_nope.size(0), q_nope.size(1), kLatentDim});
  q_absorb_out(q_nope, q_pe, w_uk_t, w_uk_t_scale, out);
  return out;
}

void v_up_out(Tensor x, Tensor w_uv, std::optional<Tensor> w_uv_scale, Tensor out) {
  const int device = x.get_device_index();
  check_cuda(x, "x", kVOp, device);
  check_cuda(out, "out", kVOp, device);
  MLA_ARG_CHECK((x.dim() == 3 || x.dim() == 4) && x.size(x.dim() - 1) == kKvLoraRank, kVOp,
                "x must be [num_tokens, num_heads, 512] or [b, s_q, num_heads, 512], got " << shape_str(x));
  MLA_ARG_CHECK(x.scalar_type() == ScalarType::BFloat16 && out.scalar_type() == ScalarType::BFloat16, kVOp,
                "x and out must be bfloat16, got " << scalar_type_name(x.scalar_type()) << " and "
                                                   << scalar_type_name(out.scalar_type()));
  const int64_t H = x.size(x.dim() - 2);
  // A 4-D x is read as [b * s_q, H, 512]: b and s_q must merge into one token stride.
  int64_t T = x.size(0), stride_token = x.stride(0);
  if (x.dim() == 4) {
    T = x.size(0) * x.size(1);
    stride_token = x.size(1) > 1 ? x.stride(1) : x.stride(0);
    MLA_ARG_CHECK(x.size(0) <= 1 || x.size(1) <= 1 || x.stride(0) == x.size(1) * x.stride(1), kVOp,
                  "a 4-D x must have mergeable [b, s_q] dims (stride(0) == s_q * stride(1))");
  }
  MLA_ARG_CHECK(out.dim() == x.dim(), kVOp, "out must have x's rank, got " << shape_str(out));
  for (int64_t d = 0; d + 1 < x.dim(); ++d) {
    MLA_ARG_CHECK(out.size(d) == x.size(d), kVOp, "out must be x's shape with a last dim of 128, got " << shape_str(out));
  }
  MLA_ARG_CHECK(out.size(out.dim() - 1) == kVHeadDim, kVOp, "out's last dim must be 128, got " << shape_str(out));
  MLA_ARG_CHECK(out.is_contiguous(), kVOp, "out must be contiguous (so that view(T, H * 128) feeds o_proj)");
  MLA_ARG_CHECK(x.stride(x.dim() - 1) == 1, kVOp, "x must have a contiguous last dim (stride 1)");
  check_aligned(x, "x", kVOp);
  check_aligned(out, "out", kVOp);
  const DType wdt = check_weight(w_uv, w_uv_scale, "w_uv", H, {kKvLoraRank, kVHeadDim},
                                 {kVHeadDim * kKvLoraRank, 1, kKvLoraRank}, kVOp, device);

  const torch::stable::accelerator::DeviceGuard guard(device);
  AbsorbParams p{};
  p.a = x.data_ptr();
  p.w = w_uv.data_ptr();
  p.w_scale = w_uv_scale.has_value() ? static_cast<const float*>(w_uv_scale->data_ptr()) : nullptr;
  p.q_pe = nullptr;
  p.c = out.data_ptr();
  p.num_tokens = T;
  p.num_heads = H;
  p.stride_a_token = stride_token;
  p.stride_a_head = x.stride(x.dim() - 2);
  p.stride_c_token = H * kVHeadDim;
  p.stride_c_head = kVHeadDim;
  p.op = AbsorbOp::kVUp;
  p.weight_dtype = wdt;
  p.device = device;
  p.stream = current_stream(device);
  run_absorb(p);
}

Tensor v_up(Tensor x, Tensor w_uv, std::optional<Tensor> w_uv_scale) {
  MLA_ARG_CHECK(x.dim() == 3 || x.dim() == 4, kVOp,
                "x must be [num_tokens, num_heads, 512] or [b, s_q, num_heads, 512], got " << shape_str(x));
  std::vector<int64_t> shape;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) shape.push_back(x.size(d));
  shape.push_back(kVHeadDim);
  Tensor out = torch::stable::new_empty(x, shape);
  v_up_out(x, w_uv, w_uv_scale, out);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(mla_ext, m) {
  m.def("q_absorb(Tensor q_nope, Tensor q_pe, Tensor w_uk_t, Tensor? w_uk_t_scale=None) -> Tensor");
  m.def("q_absorb_out(Tensor q_nope, Tensor q_pe, Tensor w_uk_t, Tensor? w_uk_t_scale, Tensor(a!) out) -> ()");
  m.def("v_up(Tensor x, Tensor w_uv, Tensor? w_uv_scale=None) -> Tensor");
  m.def("v_up_out(Tensor x, Tensor w_uv, Tensor? w_uv_scale, Tensor(a!) out) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mla_ext, CUDA, m) {
  m.impl("q_absorb", TORCH_BOX(&q_absorb));
  m.impl("q_absorb_out", TORCH_BOX(&q_absorb_out));
  m.impl("v_up", TORCH_BOX(&v_up));
  m.impl("v_up_out", TORCH_BOX(&v_up_out));
}

}  // namespace mla::bindings
