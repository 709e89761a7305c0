// e4m3 -> fp16 conversion helpers for kernels that keep fp8 cache bytes and convert in registers
// (sm89+ cvt; the portable kernels target sm90 / sm100). e4m3 values are exact in fp16, so the
// cache's scales can stay out of the MMA operands (applied to partial sums instead).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/vec.cuh"  // float2_to_e4m3x2

namespace mla::e4m3 {

// Four e4m3 bytes -> two fp16x2 (bytes 0,1 and bytes 2,3; low byte in the low half), exact.
__device__ __forceinline__ void x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// PV B fragments from 4 keys' words (w[e] = 4 e4m3 bytes of key k0 + qd + 4 e, dims 4 n .. 4 n + 3):
// b0[j] = byte j of keys e 0, 1 and b1[j] = byte j of keys e 2, 3, as fp16x2: the m16n8k16 B
// fragment of n-tile j whose column n is dim 4 n + j, with k indices permuted to keys
// (qd, qd + 4 | qd + 8, qd + 12).
__device__ __forceinline__ void regroup_pv_b(const uint32_t (&w)[4], uint32_t (&b0)[4], uint32_t (&b1)[4]) {
  x4_to_f16x2x2(__byte_perm(w[0], w[1], 0x5140), b0[0], b0[1]);
  x4_to_f16x2x2(__byte_perm(w[0], w[1], 0x7362), b0[2], b0[3]);
  x4_to_f16x2x2(__byte_perm(w[2], w[3], 0x5140), b1[0], b1[1]);
  x4_to_f16x2x2(__byte_perm(w[2], w[3], 0x7362), b1[2], b1[3]);
}

// PV A fragment of k-step ks from a 16-row fp16 P tile stored so that the keys of k indices
// (2 qd, 2 qd + 1) are the 32-bit word at 16 ks + 2 qd of a row of kStride halves, and those of
// (2 qd + 8, 2 qd + 9) the word at + 8: rows grp and grp + 8. (The sparse 16-head kernel and the
// fp8 decode kernel's mma.sync path put key k at 8 (k / 8) + 2 (k % 4) + (k % 8) / 4, pairs
// (k, k + 4); the decode kernel's sm90 path keeps the natural order.)
template <int kStride>
__device__ __forceinline__ void load_pv_a(const __half* p, int ks, int lane, uint32_t (&pa)[4]) {
  const int grp = lane / 4, qd = lane % 4;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const __half* prow = p + (grp + 8 * rr) * kStride + 16 * ks + 2 * qd;
    pa[rr] = *reinterpret_cast<const uint32_t*>(prow);
    pa[2 + rr] = *reinterpret_cast<const uint32_t*>(prow + 8);
  }
}

// Scales out of the PV operands: P' = P scale / R in fp16 for one scale tile, here for a 64-key
// tile (scales a, b: keys lane and lane + 32). R follows the scales both ways: it is reset to the
// tile's max |scale| when a key exceeds R 2^kFitLog2 or every key is below R / 16, so
// |P'| <= 2^kFitLog2 P (the caller picks kFitLog2 so that its largest P times that stays below
// fp16's 65504) and a key within 2^10 of its own tile's largest scale keeps P' in fp16's normal
// range (an outlier costs precision in its own tile only). Shrinking is capped at 2^-60 per step
// so that O, kept in units of R, cannot overflow. Usually one warp vote; when R changes, rescale =
// R_old / R_new for O (1 while R was 0) and inv = 1 / R_new. ref and inv persist across tiles (0
// until a nonzero scale is seen); rescale is 1 unless R changed. Warp-uniform.
template <int kFitLog2 = 14>
__device__ __forceinline__ void update_scale_ref(float a, float b, float& ref, float& rescale, float& inv) {
  static_assert(kFitLog2 >= 4 && kFitLog2 <= 14, "R must stay above the tile's scales / 16 and P' within fp16");
  rescale = 1.f;
  const float fa = fabsf(a), fb = fabsf(b);
  const float fit = ref * static_cast<float>(1 << kFitLog2);
  const bool fits = fa <= fit && fb <= fit;
  const bool near = fa >= ref * 0.0625f || fb >= ref * 0.0625f;
  if (__all_sync(0xffffffffu, fits) && __any_sync(0xffffffffu, near)) return;
  float tmax = fmaxf(fa, fb);
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, d));
  if (!(tmax > 0.f)) return;  // no nonzero scale in this tile: P' = 0 whatever R is
  const float r_new = fmaxf(tmax, ref * 8.6736174e-19f);  // 2^-60
  rescale = ref > 0.f ? ref / r_new : 1.f;
  inv = 1.f / r_new;
  ref = r_new;
}

// Packed fp16x2 (as raw bits) times b.
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, __half2 b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), b);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// 32- / 64- / 128-bit shared loads by shared-space address (fragments read straight from cache rows).
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

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// x = hi + lo in two e4m3 terms per value (hi = e4m3(x), lo = e4m3(x - hi)), packed as e4m3x2
// pairs: two e4m3 products with the terms equal one with x, which is how a bf16 q meets e4m3
// cache bytes in an fp8 MMA without converting the cache. Exact for values of at most 8
// significant bits (bf16) and magnitude >= 2^-2 (then lo is a multiple of e4m3's smallest step
// 2^-9); smaller ones are off by at most 2^-10, values of more bits (fp16) by at most 2^-9 of
// themselves. The caller keeps |x| below 448.
__device__ __forceinline__ void split_e4m3x2(float x0, float x1, uint16_t& hi, uint16_t& lo) {
  hi = float2_to_e4m3x2(x0, x1);
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(hi));
  const float2 hf = __half22float2(*reinterpret_cast<const __half2*>(&h));
  lo = float2_to_e4m3x2(x0 - hf.x, x1 - hf.y);
}

// 2^e for |e| <= 126, exactly.
__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }

// A DeepSeek-V4 UE8M0 scale byte -> 2^(byte - 127) (byte 0: the fp32 subnormal 2^-127), 0xFF NaN.
__device__ __forceinline__ float ue8m0_to_float(uint32_t byte) {
  if (byte == 0xFFu) return __uint_as_float(0x7fc00000u);
  return byte == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(byte << 23);
}

// A UE8M0 scale byte s as the factor of x8_to_bf16x8_by_shift: 2^(s - 15) in both bf16 halves (e4m3
// in fp16, shifted into bf16, is 2^-112 times its value; 2^(s - 127) 2^112 = 2^(s - 15)); 0xFF NaN.
// Exact for s <= 142 (scales up to 2^15): larger ones take ue8m0_split_factors.
__device__ __forceinline__ uint32_t ue8m0_to_bf16x2_factor(uint32_t s) {
  const uint32_t h = s == 0xFFu ? 0x7fc0u : (s + 112u) << 7;
  return h | (h << 16);
}
// s in 143 .. 254: 2^(s - 15) as 2^127 times 2^(s - 142), each a normal bf16 (the first product
// stays below 448 2^15, the second rounds and overflows as the fp32 product would).
__device__ __forceinline__ void ue8m0_split_factors(uint32_t s, uint32_t& f1, uint32_t& f2) {
  f1 = 0x7f007f00u;
  const uint32_t h = (s - 15u) << 7;
  f2 = h | (h << 16);
}

// Eight e4m3 bytes (w.x: elements 0-3) -> eight bf16 times 2^(s - 127) (element 0 in the low half
// of .x), from the factor(s) above: cvt to fp16x2, the fp16 bits shifted into bf16 (exact: an e4m3
// value has 3 mantissa bits and an fp16 exponent of at most 15 + 8), one bf16 multiply (two with
// kSplit). 5 instructions per pair where the fp32 route takes 6, all on full-rate pipes but the cvt.
// An e4m3 NaN byte comes out finite (NaN needs the NaN scale 0xFF, which is how writers mark it).
template <bool kSplit>
__device__ __forceinline__ uint4 x8_to_bf16x8_by_shift(uint2 w, uint32_t f1, uint32_t f2) {
  uint32_t h[4], r[4];
  x4_to_f16x2x2(w.x, h[0], h[1]);
  x4_to_f16x2x2(w.y, h[2], h[3]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t b = ((h[i] >> 3) & 0x0fff0fffu) | (h[i] & 0x80008000u);  // (no bit crosses halves)
    __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&b), *reinterpret_cast<const __nv_bfloat162*>(&f1));
    if constexpr (kSplit) v = __hmul2(v, *reinterpret_cast<const __nv_bfloat162*>(&f2));
    r[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// Eight e4m3 bytes (w.x: elements 0-3) times an fp32 scale -> eight bf16 (uint4, element 0 in the low
// half of .x), through fp32: e4m3 -> fp16 -> fp32 is exact, one fp32 multiply, rounded to bf16. For a
// V4 (power-of-two) scale the product and its rounding are exact for every scale a writer makes (4
// significant bits, fp32's exponent range): the same values as x8_to_bf16x8_by_shift at one
// instruction more per pair; an e4m3 NaN byte stays NaN here (the V4 gather path). V3 fp8_ds_mla
// (any fp32 scale): the sm90 64-head kernel's conversion.
__device__ __forceinline__ uint4 x8_scaled_to_bf16x8(uint2 w, float scale) {
  uint32_t h[4], r[4];
  x4_to_f16x2x2(w.x, h[0], h[1]);
  x4_to_f16x2x2(w.y, h[2], h[3]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
    const __nv_bfloat162 v = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    r[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

}  // namespace mla::e4m3
