// torch.ops.mla_ext.concat_and_cache_mla and concat_and_cache_mla_v4 (DeepSeek-V4): schemas and
// CUDA implementations. The CPU implementations are the reference (mla_ext/reference.py),
// registered from Python.
#include "bindings/stable_helpers.h"
#include "cache_write/cache_write.h"

namespace mla::bindings {
namespace {

constexpr const char* kOp = "concat_and_cache_mla";

void concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor kv_cache, Tensor slot_mapping,
                          std::string kv_cache_dtype, std::optional<Tensor> scale) {
  const CacheFormat format = parse_cache_format(kv_cache_dtype, kOp);
  const int device = check_same_cuda_device(
      kOp, {{"kv_c", &kv_c}, {"k_pe", &k_pe}, {"kv_cache", &kv_cache}, {"slot_mapping", &slot_mapping},
            {"scale", opt(scale)}});

  // kv_c [T, 512]; k_pe [T, 64] or [T, 1, 64].
  MLA_ARG_CHECK(kv_c.dim() == 2 && kv_c.size(1) == kKvLoraRank, kOp,
                "kv_c must be [num_tokens, 512], got " << shape_str(kv_c));
  const bool k_pe_ok = (k_pe.dim() == 2 && k_pe.size(1) == kRopeDim) ||
                       (k_pe.dim() == 3 && k_pe.size(1) == 1 && k_pe.size(2) == kRopeDim);
  MLA_ARG_CHECK(k_pe_ok, kOp, "k_pe must be [num_tokens, 64] or [num_tokens, 1, 64], got " << shape_str(k_pe));
  MLA_ARG_CHECK(k_pe.size(0) == kv_c.size(0), kOp,
                "kv_c and k_pe must have the same number of tokens, got " << kv_c.size(0) << " and " << k_pe.size(0));
  const ScalarType in_type = kv_c.scalar_type();
  MLA_ARG_CHECK(in_type == ScalarType::BFloat16 || in_type == ScalarType::Half, kOp,
                "kv_c must be bfloat16 or float16, got " << scalar_type_name(in_type));
  MLA_ARG_CHECK(k_pe.scalar_type() == in_type, kOp,
                "k_pe must have kv_c's dtype " << scalar_type_name(in_type) << ", got " << scalar_type_name(k_pe.scalar_type()));
  MLA_ARG_CHECK(kv_c.stride(1) == 1, kOp,
                "kv_c's last dim must be contiguous (stride 1), got strides " << strides_str(kv_c));
  MLA_ARG_CHECK(k_pe.stride(k_pe.dim() - 1) == 1, kOp,
                "k_pe's last dim must be contiguous (stride 1), got strides " << strides_str(k_pe));

  check_index_dtype(slot_mapping, "slot_mapping", ScalarType::Long, kOp);
  MLA_ARG_CHECK(slot_mapping.dim() == 1 && (slot_mapping.stride(0) == 1 || slot_mapping.size(0) <= 1), kOp,
                "slot_mapping must be 1-D [num_tokens], contiguous, got " << shape_str(slot_mapping) << " strides "
                                                                          << strides_str(slot_mapping));
  MLA_ARG_CHECK(slot_mapping.size(0) <= kv_c.size(0), kOp,
                "slot_mapping has " << slot_mapping.size(0) << " entries but kv_c only " << kv_c.size(0) << " tokens");

  const float* scale_ptr = check_kv_cache(kv_cache, format, kv_cache_dtype, in_type, "kv_c", scale, kOp);
  const int64_t cache_elem = element_size(kv_cache.scalar_type());
  const CudaDeviceScope device_scope(device);
  CacheWriteParams params{};
  params.kv_c = kv_c.data_ptr();
  params.k_pe = k_pe.data_ptr();
  params.kv_cache = kv_cache.data_ptr();
  params.slot_mapping = static_cast<const int64_t*>(slot_mapping.data_ptr());
  params.scale = scale_ptr;
  params.num_tokens = slot_mapping.size(0);
  params.stride_kv_c_token = kv_c.stride(0);
  params.stride_k_pe_token = k_pe.stride(0);
  params.stride_cache_block_bytes = kv_cache.stride(0) * cache_elem;
  params.stride_cache_token_bytes = kv_cache.stride(1) * cache_elem;
  params.block_size = kv_cache.size(1);
  params.num_slots = kv_cache.size(0) * kv_cache.size(1);
  params.input_dtype = to_dtype(in_type);
  params.format = format;
  params.stream = current_stream(device);
  run_concat_and_cache_mla(params);  // no allocation, no sync: a kernel launch
}

constexpr const char* kOpV4 = "concat_and_cache_mla_v4";

void concat_and_cache_mla_v4(Tensor kv, Tensor kv_cache, Tensor slot_mapping, std::string kv_cache_dtype) {
  MLA_ARG_CHECK(kv_cache_dtype == "auto" || kv_cache_dtype == "fp8_ds_mla", kOpV4,
                "kv_cache_dtype must be one of ('auto', 'fp8_ds_mla') for DeepSeek-V4, got '" << kv_cache_dtype << "'");
  const bool ds_mla = kv_cache_dtype == "fp8_ds_mla";
  const int device = check_same_cuda_device(
      kOpV4, {{"kv", &kv}, {"kv_cache", &kv_cache}, {"slot_mapping", &slot_mapping}});
  MLA_ARG_CHECK(kv.dim() == 2 && kv.size(1) == kV4HeadDim, kOpV4,
                "kv must be [num_tokens, 512] (DeepSeek-V4: 448 NoPE + 64 RoPE), got "
                    << shape_str(kv)
                    << (kv.dim() == 2 && kv.size(1) == kLatentDim
                            ? " (rows of 576 are V3's [kv_c | k_pe]: write those with concat_and_cache_mla)"
                            : ""));
  const ScalarType in_type = kv.scalar_type();
  MLA_ARG_CHECK(in_type == ScalarType::BFloat16 || in_type == ScalarType::Half, kOpV4,
                "kv must be bfloat16 or float16, got " << scalar_type_name(in_type));
  MLA_ARG_CHECK(kv.stride(1) == 1, kOpV4, "kv's last dim must be contiguous (stride 1), got strides " << strides_str(kv));
  check_index_dtype(slot_mapping, "slot_mapping", ScalarType::Long, kOpV4);
  MLA_ARG_CHECK(slot_mapping.dim() == 1, kOpV4, "slot_mapping must be 1-D [num_tokens], got " << shape_str(slot_mapping));
  MLA_ARG_CHECK(slot_mapping.size(0) <= kv.size(0), kOpV4,
                "slot_mapping has " << slot_mapping.size(0) << " entries but kv only " << kv.size(0) << " tokens");
  check_kv_cache_v4(kv_cache, "kv_cache", ds_mla, in_type, "kv", kOpV4);
  // The kernel reads slot_mapping as a plain array.
  const Tensor slots = slot_mapping.is_contiguous() ? slot_mapping : torch::stable::contiguous(slot_mapping);

  const CudaDeviceScope device_scope(device);
  CacheWriteV4Params params{};
  params.kv = kv.data_ptr();
  params.kv_cache = kv_cache.data_ptr();
  params.slot_mapping = static_cast<const int64_t*>(slots.data_ptr());
  params.num_tokens = slots.size(0);
  params.stride_kv_token = kv.stride(0);
  params.stride_cache_block_bytes = kv_cache.stride(0) * element_size(kv_cache.scalar_type());
  params.stride_cache_token_bytes = kv_cache.stride(1) * element_size(kv_cache.scalar_type());
  params.block_size = kv_cache.size(1);
  params.num_slots = kv_cache.size(0) * kv_cache.size(1);
  params.input_dtype = to_dtype(in_type);
  params.ds_mla = ds_mla;
  params.stream = current_stream(device);
  run_concat_and_cache_mla_v4(params);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(mla_ext, m) {
  m.def("concat_and_cache_mla_v4(Tensor kv, Tensor(a!) kv_cache, Tensor slot_mapping, str kv_cache_dtype) -> ()");
  m.def(
      "concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, "
      "str kv_cache_dtype, Tensor? scale=None) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mla_ext, CUDA, m) {
  m.impl("concat_and_cache_mla", TORCH_BOX(&concat_and_cache_mla));
  m.impl("concat_and_cache_mla_v4", TORCH_BOX(&concat_and_cache_mla_v4));
}

}  // namespace mla::bindings
