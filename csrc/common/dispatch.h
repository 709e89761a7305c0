// Lambda switches that turn runtime values into template parameters. Every default branch
// throws: an unsupported case fails loudly, never silently does nothing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "common/types.h"

// Calls __VA_ARGS__ (a lambda body) with `scalar_t` bound to the 16-bit activation type.
#define MLA_DISPATCH_HALF_TYPES(dtype, what, ...)                                           \
  [&] {                                                                                      \
    switch (dtype) {                                                                         \
      case ::mla::DType::kBF16: { using scalar_t = __nv_bfloat16; return __VA_ARGS__(); }    \
      case ::mla::DType::kFP16: { using scalar_t = __half; return __VA_ARGS__(); }           \
      default:                                                                               \
        throw std::runtime_error(std::string("mla_ext: unsupported ") + (what) + " dtype " +  \
                                 ::mla::dtype_name(dtype) + " (expected bfloat16 or float16)"); \
    }                                                                                        \
  }()

// Calls __VA_ARGS__ with `constexpr ::mla::CacheFormat kFormat` bound.
#define MLA_DISPATCH_CACHE_FORMAT(format, ...)                                                  \
  [&] {                                                                                         \
    switch (format) {                                                                           \
      case ::mla::CacheFormat::kAuto: { constexpr auto kFormat = ::mla::CacheFormat::kAuto; return __VA_ARGS__(); } \
      case ::mla::CacheFormat::kFp8: { constexpr auto kFormat = ::mla::CacheFormat::kFp8; return __VA_ARGS__(); }   \
      case ::mla::CacheFormat::kFp8DsMla: { constexpr auto kFormat = ::mla::CacheFormat::kFp8DsMla; return __VA_ARGS__(); } \
      default: throw std::runtime_error("mla_ext: unsupported cache format " + std::to_string(int(format))); \
    }                                                                                           \
  }()

// Calls __VA_ARGS__ with `constexpr bool NAME` bound to `cond`.
#define MLA_BOOL_SWITCH(cond, NAME, ...)      \
  [&] {                                       \
    if (cond) {                               \
      constexpr bool NAME = true;             \
      return __VA_ARGS__();                   \
    } else {                                  \
      constexpr bool NAME = false;            \
      return __VA_ARGS__();                   \
    }                                         \
  }()
