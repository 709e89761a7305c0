// Small device helpers for 16-byte vector access and fp8 conversion, shared by all kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace mla {

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }

// 16 bytes of anything, kept as four 32-bit words so that it lives in 4 registers (a byte
// array here made the compiler keep 16 byte-registers and spill).
struct alignas(16) Bytes16 {
  uint4 v;
};

// Loads/stores 16 bytes: one vector instruction when kVec (caller checked 16-byte alignment),
// otherwise byte by byte (any alignment).
template <bool kVec>
__device__ __forceinline__ Bytes16 load16(const void* src) {
  Bytes16 r;
  if constexpr (kVec) {
    r.v = *static_cast<const uint4*>(src);
  } else {
    const uint8_t* b = static_cast<const uint8_t*>(src);
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = b[4 * i] | (b[4 * i + 1] << 8) | (b[4 * i + 2] << 16) | (uint32_t(b[4 * i + 3]) << 24);
    }
    r.v = make_uint4(w[0], w[1], w[2], w[3]);
  }
  return r;
}

template <bool kVec>
__device__ __forceinline__ void store16(void* dst, const Bytes16& v) {
  if constexpr (kVec) {
    *static_cast<uint4*>(dst) = v.v;
  } else {
    const uint32_t w[4] = {v.v.x, v.v.y, v.v.z, v.v.w};
    uint8_t* b = static_cast<uint8_t*>(dst);
#pragma unroll
    for (int i = 0; i < 16; ++i) b[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
  }
}

// Eight 16-bit elements of a Bytes16 as floats.
template <typename T>
__device__ __forceinline__ void unpack8(const Bytes16& v, float (&out)[8]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = to_float(e[i]);
}

// Saturating round-to-nearest-even float -> e4m3 (NaN stays NaN), two at a time.
__device__ __forceinline__ uint16_t float2_to_e4m3x2(float lo, float hi) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// 8 floats -> 8 e4m3 bytes of x[i] / scale, for a power-of-two scale in [2^-126, 2^126]:
// multiplying by its (exact) reciprocal gives the same bits as the division.
__device__ __forceinline__ uint2 quantize8_e4m3(const float (&x)[8], float pow2_scale) {
  const float inv = 1.0f / pow2_scale;
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    w[i] = uint32_t(float2_to_e4m3x2(x[4 * i] * inv, x[4 * i + 1] * inv)) |
           (uint32_t(float2_to_e4m3x2(x[4 * i + 2] * inv, x[4 * i + 3] * inv)) << 16);
  }
  return make_uint2(w[0], w[1]);
}

}  // namespace mla
