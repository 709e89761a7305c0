// Helpers for the binding layer: the only place that sees the torch stable API. Each op's
// binding validates its inputs (naming the argument and what was expected), fills the kernel's
// params struct and calls its launcher.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cuda_runtime.h>

#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "common/types.h"

namespace mla::bindings {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Throws std::runtime_error("mla_ext.<op>: <message>") when cond is false; torch turns it into
// a Python RuntimeError.
#define MLA_ARG_CHECK(cond, op, ...)                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::ostringstream mla_msg_;                                             \
      mla_msg_ << "mla_ext." << op << ": " << __VA_ARGS__;                     \
      throw std::runtime_error(mla_msg_.str());                                \
    }                                                                          \
  } while (0)

inline std::string shape_str(const Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int64_t i = 0; i < t.dim(); ++i) s << (i ? ", " : "") << t.size(i);
  s << "]";
  return s.str();
}

inline const char* scalar_type_name(ScalarType t) {
  switch (t) {
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Half: return "float16";
    case ScalarType::Float: return "float32";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    default: return "an unsupported dtype";
  }
}

inline DType to_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::BFloat16: return DType::kBF16;
    case ScalarType::Half: return DType::kFP16;
    case ScalarType::Float: return DType::kFP32;
    case ScalarType::Float8_e4m3fn: return DType::kFP8E4M3;
    case ScalarType::Byte: return DType::kUInt8;
    default: throw std::runtime_error(std::string("mla_ext: unsupported dtype ") + scalar_type_name(t));
  }
}

inline int64_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::BFloat16: case ScalarType::Half: return 2;
    case ScalarType::Float: case ScalarType::Int: return 4;
    case ScalarType::Long: return 8;
    case ScalarType::Float8_e4m3fn: case ScalarType::Byte: return 1;
    default: throw std::runtime_error(std::string("mla_ext: unsupported dtype ") + scalar_type_name(t));
  }
}

inline CacheFormat parse_cache_format(std::string_view s, const char* op) {
  if (s == "auto") return CacheFormat::kAuto;
  if (s == "fp8" || s == "fp8_e4m3") return CacheFormat::kFp8;
  if (s == "fp8_ds_mla") return CacheFormat::kFp8DsMla;
  MLA_ARG_CHECK(false, op, "kv_cache_dtype must be one of 'auto', 'fp8', 'fp8_e4m3', 'fp8_ds_mla', got '"
                               << s << "'");
  return CacheFormat::kAuto;
}

inline void check_cuda(const Tensor& t, const char* name, const char* op, int device) {
  MLA_ARG_CHECK(t.is_cuda(), op, name << " must be a CUDA tensor (all inputs on one GPU)");
  MLA_ARG_CHECK(t.get_device_index() == device, op,
                name << " is on cuda:" << t.get_device_index() << " but the other inputs are on cuda:" << device);
}

// kv_cache [num_blocks, block_size, row] in `format` (DESIGN.md §2): 3-D with a contiguous last
// dim, the format's element type and row width, and for fp8 a float32 scale of one element on
// the same device. 'auto' stores `auto_dtype` (the activations' dtype, of the tensor named
// `auto_dtype_of`). Returns the fp8 scale's device pointer, nullptr for the other formats.
// The C++ twin of check_kv_cache_rows in mla_ext/_validate.py.
inline const float* check_kv_cache(const Tensor& kv_cache, CacheFormat format, std::string_view kv_cache_dtype,
                                   ScalarType auto_dtype, const char* auto_dtype_of,
                                   const std::optional<Tensor>& scale, const char* op, int device) {
  MLA_ARG_CHECK(kv_cache.dim() == 3, op, "kv_cache must be [num_blocks, block_size, row], got " << shape_str(kv_cache));
  MLA_ARG_CHECK(kv_cache.stride(2) == 1, op, "kv_cache's last dim must be contiguous (stride 1)");
  const ScalarType cache_type = kv_cache.scalar_type();
  if (format == CacheFormat::kAuto) {
    MLA_ARG_CHECK(cache_type == auto_dtype, op,
                  "kv_cache_dtype='auto' needs a kv_cache of " << auto_dtype_of << "'s dtype " << scalar_type_name(auto_dtype)
                                                               << ", got " << scalar_type_name(cache_type));
    MLA_ARG_CHECK(kv_cache.size(2) == kLatentDim, op,
                  "kv_cache_dtype='auto' needs rows of 576 elements, got kv_cache " << shape_str(kv_cache));
    return nullptr;
  }
  if (format == CacheFormat::kFp8DsMla) {
    MLA_ARG_CHECK(cache_type == ScalarType::Byte, op,
                  "kv_cache_dtype='fp8_ds_mla' needs a uint8 kv_cache, got " << scalar_type_name(cache_type));
    MLA_ARG_CHECK(kv_cache.size(2) == kDsMlaRowBytes, op,
                  "kv_cache_dtype='fp8_ds_mla' needs rows of 656 bytes, got kv_cache " << shape_str(kv_cache));
    return nullptr;
  }
  MLA_ARG_CHECK(cache_type == ScalarType::Byte || cache_type == ScalarType::Float8_e4m3fn, op,
                "kv_cache_dtype='" << kv_cache_dtype << "' needs a uint8 or float8_e4m3fn kv_cache, got "
                                   << scalar_type_name(cache_type));
  MLA_ARG_CHECK(kv_cache.size(2) == kLatentDim, op,
                "kv_cache_dtype='" << kv_cache_dtype << "' needs rows of 576 bytes, got kv_cache " << shape_str(kv_cache));
  MLA_ARG_CHECK(scale.has_value(), op, "kv_cache_dtype='" << kv_cache_dtype << "' needs scale (fp32 tensor of 1 element)");
  check_cuda(*scale, "scale", op, device);
  MLA_ARG_CHECK(scale->scalar_type() == ScalarType::Float && scale->numel() == 1, op,
                "scale must be a float32 tensor with one element, got " << scalar_type_name(scale->scalar_type()) << " "
                                                                        << shape_str(*scale));
  return static_cast<const float*>(scale->data_ptr());
}

inline cudaStream_t current_stream(int device) {
  void* stream = nullptr;
  if (aoti_torch_get_current_cuda_stream(device, &stream) != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error("mla_ext: could not get the current CUDA stream");
  }
  return static_cast<cudaStream_t>(stream);
}

}  // namespace mla::bindings
