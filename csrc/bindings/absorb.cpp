// torch.ops.mla_ext.{q_absorb, q_absorb_out, v_up, v_up_out}: schemas and CUDA implementations.
// The CPU implementations are the reference (mla_ext/reference.py), registered from Python.
#include <optional>
#include <string>

#include "absorb/absorb.h"
#include "bindings/stable_helpers.h"

namespace mla::bindings {
namespace {

constexpr const char* kQOp = "q_absorb";
constexpr const char* kVOp = "v_up";

// Activations are bf16: the kernels run mma.sync / wgmma on bf16 operands (fp8 weights are
// dequantised to bf16), so float16 is refused with a message that says so.
void check_bf16(const Tensor& t, const char* name, const char* op) {
  const ScalarType got = t.scalar_type();
  MLA_ARG_CHECK(got == ScalarType::BFloat16, op,
                name << " must be bfloat16, got " << scalar_type_name(got)
                     << (got == ScalarType::Half ? std::string(" (the absorb kernels take bfloat16 activations only: "
                                                               "convert with ") + name + ".to(torch.bfloat16))"
                                                 : std::string()));
}

// Weight [H, 128, 512] bf16 or e4m3 in the row-major layout of its kv_b_proj rows (strides
// given by the caller: W_UK_T contiguous, W_UV as the transpose of a contiguous [H, 128, 512]),
// plus its [H, 4] scales when e4m3. (The caller checked devices.)
DType check_weight(const Tensor& w, const std::optional<Tensor>& scale, const char* name, int64_t heads,
                   const int64_t (&shape)[2], const int64_t (&strides)[3], const char* op) {
  MLA_ARG_CHECK(w.dim() == 3 && w.size(0) == heads && w.size(1) == shape[0] && w.size(2) == shape[1], op,
                name << " must be [" << heads << ", " << shape[0] << ", " << shape[1] << "], got " << shape_str(w));
  const ScalarType wt = w.scalar_type();
  MLA_ARG_CHECK(wt == ScalarType::BFloat16 || wt == ScalarType::Float8_e4m3fn, op,
                name << " must be bfloat16 or float8_e4m3fn, got " << scalar_type_name(wt));
  // (the stride of a size-1 dim is irrelevant: H = 1 weights may keep kv_b_proj's head stride)
  MLA_ARG_CHECK((w.stride(0) == strides[0] || heads == 1) && w.stride(1) == strides[1] && w.stride(2) == strides[2], op,
                name << " must have strides (" << strides[0] << ", " << strides[1] << ", " << strides[2]
                     << ") (the layout prepare_absorb_weights makes), got " << strides_str(w));
  MLA_ARG_CHECK(mla::aligned16(w.data_ptr()), op, name << " must be 16-byte aligned");
  if (wt == ScalarType::Float8_e4m3fn) {
    MLA_ARG_CHECK(scale.has_value(), op, "float8_e4m3fn " << name << " needs " << name << "_scale [H, 4] float32");
    MLA_ARG_CHECK(scale->scalar_type() == ScalarType::Float && scale->dim() == 2 && scale->size(0) == heads &&
                      scale->size(1) == kNumLatentBlocks && scale->stride(1) == 1 &&
                      (scale->stride(0) == kNumLatentBlocks || heads == 1),
                  op, name << "_scale must be a contiguous [" << heads << ", 4] float32 tensor, got "
                           << scalar_type_name(scale->scalar_type()) << " " << shape_str(*scale));
  } else {
    MLA_ARG_CHECK(!scale.has_value(), op, name << "_scale is only for float8_e4m3fn " << name << ", got " << name
                                                << " in " << scalar_type_name(wt));
  }
  return to_dtype(wt);
}

// q_absorb into out_in, or into a new tensor when out_in is absent. Returns the output.
Tensor q_absorb_impl(const Tensor& q_nope_in, const Tensor& q_pe_in, const Tensor& w_uk_t,
                     const std::optional<Tensor>& w_uk_t_scale, const std::optional<Tensor>& out_in) {
  const int device = check_same_cuda_device(
      kQOp, {{"q_nope", &q_nope_in}, {"q_pe", &q_pe_in}, {"w_uk_t", &w_uk_t}, {"w_uk_t_scale", opt(w_uk_t_scale)},
             {"out", opt(out_in)}});
  MLA_ARG_CHECK(q_nope_in.dim() == 3 && q_nope_in.size(2) == kQkNopeHeadDim, kQOp,
                "q_nope must be [num_tokens, num_heads, 128], got " << shape_str(q_nope_in));
  const int64_t T = q_nope_in.size(0), H = q_nope_in.size(1);
  MLA_ARG_CHECK(q_pe_in.dim() == 3 && q_pe_in.size(0) == T && q_pe_in.size(1) == H && q_pe_in.size(2) == kRopeDim, kQOp,
                "q_pe must be [" << T << ", " << H << ", 64] like q_nope, got " << shape_str(q_pe_in));
  check_bf16(q_nope_in, "q_nope", kQOp);
  MLA_ARG_CHECK(q_pe_in.scalar_type() == ScalarType::BFloat16, kQOp,
                "q_pe must have q_nope's dtype bfloat16, got " << scalar_type_name(q_pe_in.scalar_type()));
  MLA_ARG_CHECK(q_nope_in.stride(2) == 1, kQOp,
                "q_nope's last dim must be contiguous (stride 1), got strides " << strides_str(q_nope_in));
  MLA_ARG_CHECK(q_pe_in.stride(2) == 1, kQOp,
                "q_pe's last dim must be contiguous (stride 1), got strides " << strides_str(q_pe_in));
  const DType wdt = check_weight(w_uk_t, w_uk_t_scale, "w_uk_t", H, {kQkNopeHeadDim, kKvLoraRank},
                                 {kQkNopeHeadDim * kKvLoraRank, kKvLoraRank, 1}, kQOp);
  if (out_in.has_value()) {
    const Tensor& out = *out_in;
    MLA_ARG_CHECK(out.dim() == 3 && out.size(0) == T && out.size(1) == H && out.size(2) == kLatentDim, kQOp,
                  "out must be [" << T << ", " << H << ", 576], got " << shape_str(out));
    MLA_ARG_CHECK(out.scalar_type() == ScalarType::BFloat16, kQOp,
                  "out must have q_nope's dtype bfloat16, got " << scalar_type_name(out.scalar_type()));
    MLA_ARG_CHECK(out.stride(2) == 1, kQOp,
                  "out's last dim must be contiguous (stride 1), got strides " << strides_str(out));
    check_no_zero_strides(out, "out", kQOp);
  }
  // Views off a 16-byte boundary: copies in, and out through an aligned temporary (slow path).
  const Tensor q_nope = aligned_or_copy(q_nope_in, "q_nope", kQOp), q_pe = aligned_or_copy(q_pe_in, "q_pe", kQOp);
  const bool direct = out_in.has_value() && aligned16(*out_in);
  Tensor out = direct ? *out_in : empty_cuda({T, H, kLatentDim}, ScalarType::BFloat16, device);

  const CudaDeviceScope device_scope(device);
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
  if (out_in.has_value() && !direct) {
    Tensor target = *out_in;
    torch::stable::copy_(target, out);
    return target;
  }
  return out;
}

Tensor q_absorb(Tensor q_nope, Tensor q_pe, Tensor w_uk_t, std::optional<Tensor> w_uk_t_scale) {
  return q_absorb_impl(q_nope, q_pe, w_uk_t, w_uk_t_scale, std::nullopt);
}

void q_absorb_out(Tensor q_nope, Tensor q_pe, Tensor w_uk_t, std::optional<Tensor> w_uk_t_scale, Tensor out) {
  q_absorb_impl(q_nope, q_pe, w_uk_t, w_uk_t_scale, out);
}

// v_up into out_in, or into a new tensor of x's shape with a last dim of 128.
Tensor v_up_impl(const Tensor& x_in, const Tensor& w_uv, const std::optional<Tensor>& w_uv_scale,
                 const std::optional<Tensor>& out_in) {
  const int device = check_same_cuda_device(
      kVOp, {{"x", &x_in}, {"w_uv", &w_uv}, {"w_uv_scale", opt(w_uv_scale)}, {"out", opt(out_in)}});
  const int64_t nd = x_in.dim();
  MLA_ARG_CHECK((nd == 3 || nd == 4) && x_in.size(nd - 1) == kKvLoraRank, kVOp,
                "x must be [num_tokens, num_heads, 512] or [b, s_q, num_heads, 512], got " << shape_str(x_in));
  check_bf16(x_in, "x", kVOp);
  MLA_ARG_CHECK(x_in.stride(nd - 1) == 1, kVOp,
                "x's last dim must be contiguous (stride 1), got strides " << strides_str(x_in));
  // A 4-D x is read as [b * s_q, H, 512]: b and s_q must merge into one token stride.
  MLA_ARG_CHECK(nd == 3 || x_in.size(0) <= 1 || x_in.size(1) <= 1 || x_in.stride(0) == x_in.size(1) * x_in.stride(1),
                kVOp, "a 4-D x must have mergeable [b, s_q] dims (stride(0) == s_q * stride(1)), got strides "
                          << strides_str(x_in));
  const int64_t H = x_in.size(nd - 2);
  const DType wdt = check_weight(w_uv, w_uv_scale, "w_uv", H, {kKvLoraRank, kVHeadDim},
                                 {kVHeadDim * kKvLoraRank, 1, kKvLoraRank}, kVOp);
  if (out_in.has_value()) {
    const Tensor& out = *out_in;
    bool same = out.dim() == nd && out.size(nd - 1) == kVHeadDim;
    for (int64_t d = 0; same && d + 1 < nd; ++d) same = out.size(d) == x_in.size(d);
    MLA_ARG_CHECK(same, kVOp, "out must be x's shape with a last dim of 128, got " << shape_str(out) << " for x "
                                                                                     << shape_str(x_in));
    MLA_ARG_CHECK(out.scalar_type() == ScalarType::BFloat16, kVOp,
                  "out must have x's dtype bfloat16, got " << scalar_type_name(out.scalar_type()));
    MLA_ARG_CHECK(out.is_contiguous(), kVOp,
                  "out must be contiguous (so that view(T, H * 128) feeds o_proj), got strides " << strides_str(out));
  }
  const Tensor x = aligned_or_copy(x_in, "x", kVOp);
  const bool direct = out_in.has_value() && mla::aligned16(out_in->data_ptr());
  Tensor out = direct ? *out_in
               : nd == 3 ? empty_cuda({x.size(0), H, kVHeadDim}, ScalarType::BFloat16, device)
                         : empty_cuda({x.size(0), x.size(1), H, kVHeadDim}, ScalarType::BFloat16, device);
  const int64_t T = nd == 4 ? x.size(0) * x.size(1) : x.size(0);
  const int64_t stride_token = nd == 4 && x.size(1) > 1 ? x.stride(1) : x.stride(0);

  const CudaDeviceScope device_scope(device);
  AbsorbParams p{};
  p.a = x.data_ptr();
  p.w = w_uv.data_ptr();
  p.w_scale = w_uv_scale.has_value() ? static_cast<const float*>(w_uv_scale->data_ptr()) : nullptr;
  p.q_pe = nullptr;
  p.c = out.data_ptr();
  p.num_tokens = T;
  p.num_heads = H;
  p.stride_a_token = stride_token;
  p.stride_a_head = x.stride(nd - 2);
  p.stride_c_token = H * kVHeadDim;
  p.stride_c_head = kVHeadDim;
  p.op = AbsorbOp::kVUp;
  p.weight_dtype = wdt;
  p.device = device;
  p.stream = current_stream(device);
  run_absorb(p);
  if (out_in.has_value() && !direct) {
    Tensor target = *out_in;
    torch::stable::copy_(target, out);
    return target;
  }
  return out;
}

Tensor v_up(Tensor x, Tensor w_uv, std::optional<Tensor> w_uv_scale) {
  return v_up_impl(x, w_uv, w_uv_scale, std::nullopt);
}

void v_up_out(Tensor x, Tensor w_uv, std::optional<Tensor> w_uv_scale, Tensor out) {
  v_up_impl(x, w_uv, w_uv_scale, out);
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
