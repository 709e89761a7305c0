// e4m3 -> fp16 conversion helpers for kernels that keep fp8 cache bytes and convert in registers
// (sm89+ cvt; the portable kernels target sm90 / sm100). e4m3 values are exact in fp16, so the
// cache's scales can stay out of the MMA operands (applied to partial sums instead).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace mla::e4m3 {

// Four e4m3 bytes -> two fp16x2 (bytes 0,1 and bytes 2,3; low byte in the low half), exact.
__device__ __forceinline__ void x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// Packed fp16x2 (as raw bits) times b.
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, __half2 b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), b);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// 32- / 64-bit shared loads by shared-space address (fragments read straight from cache rows).
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// 2^e for |e| <= 126, exactly.
__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }

}  // namespace mla::e4m3
