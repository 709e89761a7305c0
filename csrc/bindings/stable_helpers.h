// Helpers for the binding layer: the only place that sees the torch stable API. Each op's
// binding validates its inputs (naming the argument, what was expected and what it got), fills
// the kernel's params struct and calls its launcher.
//
// On CUDA the bindings are the only validation: the Python wrappers call the ops directly (the
// CPU implementations and the fakes validate in Python, with the same messages), so every check
// here must say what is wrong in words a caller of mla_ext.<op> understands. Every accessor of
// torch::stable::Tensor is a call through the C shim, and every torch::stable op a boxed
// dispatcher call found by name: read metadata once, allocate through empty_cuda.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cuda_runtime.h>

#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "common/types.h"

namespace mla::bindings {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Throws std::runtime_error("mla_ext.<op>: <message>") when cond is false; torch turns it into
// a Python RuntimeError (mla_ext.MlaInputError, raised by the CPU and fake paths, is one too).
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

inline std::string strides_str(const Tensor& t) {
  std::ostringstream s;
  s << "(";
  for (int64_t i = 0; i < t.dim(); ++i) s << (i ? ", " : "") << t.stride(i);
  s << (t.dim() == 1 ? ",)" : ")");
  return s.str();
}

inline const char* scalar_type_name(ScalarType t) {
  switch (t) {
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Half: return "float16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Bool: return "bool";
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

// ---- devices ---------------------------------------------------------------------------------

inline std::string device_str(const Tensor& t) {
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  if (t.is_cpu()) return "cpu";
  return "a device that is neither CPU nor CUDA";
}

// One named input of an op; `tensor` may be null (an absent optional input, skipped).
using NamedTensor = std::pair<const char*, const Tensor*>;

inline const Tensor* opt(const std::optional<Tensor>& t) { return t.has_value() ? &*t : nullptr; }

// All present tensors on one CUDA device; returns its index. The message is the Python
// wrappers' (check_same_device in mla_ext/_validate.py): it names two of them and where they are.
inline int check_same_cuda_device(const char* op, std::initializer_list<NamedTensor> tensors) {
  const NamedTensor* first = nullptr;
  int device = -1;
  for (const NamedTensor& t : tensors) {
    if (t.second != nullptr && t.second->is_cuda()) {
      first = &t;
      device = t.second->get_device_index();
      break;
    }
  }
  MLA_ARG_CHECK(first != nullptr, op, "the CUDA implementation got no CUDA tensor");
  for (const NamedTensor& t : tensors) {
    if (t.second == nullptr) continue;
    MLA_ARG_CHECK(t.second->is_cuda() && t.second->get_device_index() == device, op,
                  "all tensors must be on one device: " << first->first << " is on cuda:" << device << ", "
                                                        << t.first << " is on " << device_str(*t.second));
  }
  return device;
}

// Makes `device` current for the launches of one call, as a DeviceGuard does, constructing the
// guard (~0.7 us through the shim) only when another device is current: an engine calls each
// device's ops from a thread with that device already current. (Hidden, as the guard type it holds
// is.)
class __attribute__((visibility("hidden"))) CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device) guard_.emplace(device);
  }

 private:
  std::optional<torch::stable::accelerator::DeviceGuard> guard_;
};

// ---- dtypes, shapes, strides -----------------------------------------------------------------

// Index tensors have one integer type each (block_table, seq_lens, indices, topk_length: int32;
// slot_mapping, positions: int64): the kernels read them as they are, and converting per call
// would be a kernel launch per layer. The message says how to convert once per step.
inline void check_index_dtype(const Tensor& t, const char* name, ScalarType want, const char* op) {
  const ScalarType got = t.scalar_type();
  MLA_ARG_CHECK(got == want, op,
                name << " must be " << scalar_type_name(want) << ", got " << scalar_type_name(got)
                     << ": convert once per step with " << name << ".to(torch."
                     << scalar_type_name(want) << ")");
}

// Outputs written by many CTAs must not alias themselves: no zero stride on a dim of size > 1
// (an expanded view).
inline void check_no_zero_strides(const Tensor& t, const char* name, const char* op) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    MLA_ARG_CHECK(t.stride(d) != 0 || t.size(d) <= 1, op,
                  name << " must not have zero strides (an expanded view), got strides " << strides_str(t));
  }
}

// The kernels move 16-byte pieces: the base and every outer stride (of a dim of size > 1) must
// be 16-byte aligned.
inline bool aligned16(const Tensor& t) {
  if (!mla::aligned16(t.data_ptr())) return false;
  const int64_t elem = element_size(t.scalar_type());
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if ((t.stride(d) * elem) % 16 != 0 && t.size(d) > 1) return false;
  }
  return true;
}

// `t` when aligned16, else a fresh copy (the slow path of views that start or step off a
// 16-byte boundary, e.g. q[..., 1:577] or a contiguous view at element 1; every kernel row is a
// multiple of 16 bytes, so a dense copy is aligned). Not contiguous(): that returns an already
// contiguous but misaligned view unchanged.
inline Tensor aligned_or_copy(const Tensor& t, const char* name, const char* op) {
  if (aligned16(t)) return t;
  Tensor copy = torch::stable::clone(t);
  MLA_ARG_CHECK(aligned16(copy), op, name << " " << shape_str(t) << " could not be copied to 16-byte aligned rows");
  return copy;
}

// An uninitialised contiguous CUDA tensor, through the C shim's empty_strided: one call into
// at::empty_strided (the caching allocator, CUDA-graph aware), not a boxed dispatcher call of
// aten::new_empty found by name (a few microseconds per allocation on the host).
inline Tensor empty_cuda(std::initializer_list<int64_t> sizes, ScalarType dtype, int device) {
  int64_t shape[8], strides[8];
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  int64_t i = 0;
  for (int64_t s : sizes) shape[i++] = s;
  int64_t stride = 1;
  for (int64_t d = ndim - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= shape[d] > 1 ? shape[d] : 1;
  }
  const int32_t aoti_dtype = torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype));
  AtenTensorHandle handle = nullptr;
  if (aoti_torch_empty_strided(ndim, shape, strides, aoti_dtype, aoti_torch_device_type_cuda(), device, &handle) !=
      AOTI_TORCH_SUCCESS) {
    throw std::runtime_error("mla_ext: could not allocate a CUDA tensor (out of memory?)");
  }
  return Tensor(handle);
}

// ---- the cache -------------------------------------------------------------------------------

// kv_cache [num_blocks, block_size, row] in `format` (DESIGN.md §2): 3-D with a contiguous last
// dim, the format's element type and row width, and for fp8 a float32 scale of one element on
// the same device (the caller checked devices). 'auto' stores `auto_dtype` (the activations'
// dtype, of the tensor named `auto_dtype_of`). Returns the fp8 scale's device pointer, nullptr
// for the other formats. The C++ twin of check_kv_cache_rows in mla_ext/_validate.py.
inline const float* check_kv_cache(const Tensor& kv_cache, CacheFormat format, std::string_view kv_cache_dtype,
                                   ScalarType auto_dtype, const char* auto_dtype_of,
                                   const std::optional<Tensor>& scale, const char* op) {
  MLA_ARG_CHECK(kv_cache.dim() == 3, op, "kv_cache must be [num_blocks, block_size, row], got " << shape_str(kv_cache));
  MLA_ARG_CHECK(kv_cache.stride(2) == 1, op,
                "kv_cache's last dim must be contiguous (stride 1), got strides " << strides_str(kv_cache));
  const ScalarType cache_type = kv_cache.scalar_type();
  if (format == CacheFormat::kAuto) {
    // An fp8 cache passed without its format: say which one its rows look like.
    const bool bytes = cache_type == ScalarType::Byte || cache_type == ScalarType::Float8_e4m3fn;
    const char* hint = "";
    if (bytes && kv_cache.size(2) == kDsMlaRowBytes) {
      hint = ": a uint8 cache of 656-byte rows is fp8_ds_mla, pass kv_cache_dtype='fp8_ds_mla'";
    } else if (bytes) {
      hint = ": an 8-bit cache of 576-byte rows is fp8, pass kv_cache_dtype='fp8' and its scale";
    }
    MLA_ARG_CHECK(cache_type == auto_dtype, op,
                  "kv_cache_dtype='auto' needs a kv_cache of " << auto_dtype_of << "'s dtype " << scalar_type_name(auto_dtype)
                                                               << ", got " << scalar_type_name(cache_type) << hint);
    MLA_ARG_CHECK(kv_cache.size(2) == kLatentDim, op,
                  "kv_cache_dtype='auto' needs rows of 576 elements, got kv_cache " << shape_str(kv_cache));
    return nullptr;
  }
  if (format == CacheFormat::kFp8DsMla) {
    MLA_ARG_CHECK(cache_type == ScalarType::Byte, op,
                  "kv_cache must be uint8 for kv_cache_dtype='fp8_ds_mla', got " << scalar_type_name(cache_type));
    MLA_ARG_CHECK(kv_cache.size(2) == kDsMlaRowBytes, op,
                  "kv_cache_dtype='fp8_ds_mla' needs rows of 656 bytes, got kv_cache " << shape_str(kv_cache));
    return nullptr;
  }
  MLA_ARG_CHECK(cache_type == ScalarType::Byte || cache_type == ScalarType::Float8_e4m3fn, op,
                "kv_cache must be uint8 or float8_e4m3fn for kv_cache_dtype='" << kv_cache_dtype << "', got "
                                                                             << scalar_type_name(cache_type));
  MLA_ARG_CHECK(kv_cache.size(2) == kLatentDim, op,
                "kv_cache_dtype='" << kv_cache_dtype << "' needs rows of 576 bytes, got kv_cache " << shape_str(kv_cache));
  MLA_ARG_CHECK(scale.has_value(), op,
                "kv_cache_dtype='" << kv_cache_dtype << "' needs scale (float32 tensor of 1 element)");
  MLA_ARG_CHECK(scale->scalar_type() == ScalarType::Float && scale->numel() == 1, op,
                "scale must be a float32 tensor with one element, got " << scalar_type_name(scale->scalar_type()) << " "
                                                                        << shape_str(*scale));
  return static_cast<const float*>(scale->data_ptr());
}

// A DeepSeek-V4 cache [num_blocks, block_size, row]: the C++ twin of check_kv_cache_v4 in
// mla_ext/_validate_v4.py (same messages). 'auto': rows of 512 in auto_type (the dtype of the
// tensor named auto_type_of), last dim contiguous. 'fp8_ds_mla': uint8 tokens of 584 bytes whose
// pages are each one run of 584 * block_size bytes, page strides multiples of 576 bytes.
inline void check_kv_cache_v4(const Tensor& kv_cache, const char* name, bool ds_mla, ScalarType auto_type,
                              const char* auto_type_of, const char* op) {
  MLA_ARG_CHECK(kv_cache.dim() == 3, op, name << " must be [num_blocks, block_size, row], got " << shape_str(kv_cache));
  const int64_t row = kv_cache.size(2);
  const ScalarType type = kv_cache.scalar_type();
  if (!ds_mla) {
    const bool fp8_bytes = (type == ScalarType::Byte || type == ScalarType::Float8_e4m3fn) && row == kV4TokenBytes;
    MLA_ARG_CHECK(type == auto_type, op,
                  "kv_cache_dtype='auto' needs " << name << " of " << auto_type_of << "'s dtype "
                                                 << scalar_type_name(auto_type) << ", got "
                      << scalar_type_name(type)
                      << (fp8_bytes ? ": a uint8 cache of 584-byte tokens is fp8_ds_mla, pass kv_cache_dtype='fp8_ds_mla'"
                                    : ""));
    MLA_ARG_CHECK(row == kV4HeadDim, op,
                  "kv_cache_dtype='auto' needs " << name << " rows of 512 elements (DeepSeek-V4: 448 NoPE + 64 RoPE), got "
                      << shape_str(kv_cache) << (row == kLatentDim ? " (rows of 576 are the V3 latent layout)" : ""));
    MLA_ARG_CHECK(kv_cache.stride(2) == 1, op,
                  name << "'s last dim must be contiguous (stride 1), got strides " << strides_str(kv_cache));
    return;
  }
  MLA_ARG_CHECK(type == ScalarType::Byte, op,
                name << " must be uint8 for kv_cache_dtype='fp8_ds_mla', got " << scalar_type_name(type));
  MLA_ARG_CHECK(row == kV4TokenBytes, op,
                "kv_cache_dtype='fp8_ds_mla' needs " << name << " of DeepSeek-V4 tokens, [num_blocks, block_size, 584] bytes, got "
                    << shape_str(kv_cache) << (row == kDsMlaRowBytes ? " (656-byte rows are the V3.2 fp8_ds_mla layout)" : ""));
  const int64_t num_blocks = kv_cache.size(0), block_size = kv_cache.size(1);
  MLA_ARG_CHECK(kv_cache.stride(2) == 1 && (block_size <= 1 || kv_cache.stride(1) == kV4TokenBytes), op,
                name << "'s pages must each be one contiguous run of block_size * 584 bytes (strides (page, 584, 1)), "
                "got strides " << strides_str(kv_cache));
  if (num_blocks > 1) {
    const int64_t page = kv_cache.stride(0);
    const int64_t padded = (kV4TokenBytes * block_size + kV4PageAlign - 1) / kV4PageAlign * kV4PageAlign;
    MLA_ARG_CHECK(page >= block_size * kV4TokenBytes && page % kV4PageAlign == 0, op,
                  name << "'s page stride must be a multiple of 576 bytes and at least 584 x block_size = "
                      << block_size * kV4TokenBytes
                      << " (the DeepSeek-V4 fp8_ds_mla layout pads each page to " << padded << " bytes for block_size "
                      << block_size << "), got " << page << "; allocate the cache with mla_ext.formats.empty_kv_cache_v4");
  }
}

inline cudaStream_t current_stream(int device) {
  void* stream = nullptr;
  if (aoti_torch_get_current_cuda_stream(device, &stream) != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error("mla_ext: could not get the current CUDA stream");
  }
  return static_cast<cudaStream_t>(stream);
}

}  // namespace mla::bindings
