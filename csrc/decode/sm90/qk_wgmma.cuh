// sm90a wgmma instructions for the fp8 decode kernel's S^T = K q^T (decode_split_fp8.cuh with
// kQkWgmma): the cache tile is the A operand as it lies in shared memory (e4m3, K-major, 128-byte
// swizzle), q the B operand (two e4m3 terms per value, or bf16 for fp8_ds_mla's rope dims).
// Hopper has fp8 tensor math only in wgmma: mma.sync with e4m3 operands compiles to fp16 MMAs
// plus the very conversions this avoids. Descriptors, fences and accumulator operand lists:
// absorb/sm90/wgmma.cuh.
#pragma once

#include <cstdint>

#include "absorb/sm90/wgmma.cuh"

namespace mla::sm90 {

// Descriptors as their low 32 bits (kmajor_sw128_desc's start address and leading offset): its
// high word is the same for every tile, and passed as an immediate it stays a constant; a low
// word moves with k-steps and dim blocks by plain 32-bit adds (shared addresses stay below 2^18,
// so no carry). Built from scratch for each wgmma, a descriptor pair cost ~12 instructions.
// (SmemDesc in wgmma.cuh is the same split for instructions that take 64-bit descriptors.)
__device__ __forceinline__ uint32_t kmajor_sw128_desc_lo(uint32_t smem_byte_addr) {
  return static_cast<uint32_t>(kmajor_sw128_desc(smem_byte_addr));
}
inline constexpr uint32_t kKmajorSw128DescHi = static_cast<uint32_t>(kmajor_sw128_desc(0) >> 32);

// d[64 x 32] (+)= a[64 x 32] * b[32 x 32], e4m3 operands, both K-major in shared memory (fp8
// wgmma has no transposed forms), fp32 accumulators: d[4 i + e] is row 16 (warp % 4) + lane / 4
// + 8 (e / 2), column 8 i + 2 (lane % 4) + e % 2. accumulate = false overwrites d. Descriptors:
// low words (kmajor_sw128_desc_lo + byte offset / 16).
__device__ __forceinline__ void wgmma_m64n32k32_e4m3(float (&d)[16], uint32_t desc_a_lo, uint32_t desc_b_lo, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nmov.b64 da, {%16, %18};\nmov.b64 db, {%17, %18};\n"
      "setp.ne.b32 p, %19, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, da, db, p, 1, 1;\n}\n"
      : MLA_WGMMA_D16(d, 0)
      : "r"(desc_a_lo), "r"(desc_b_lo), "n"(kKmajorSw128DescHi), "r"(static_cast<int>(accumulate)));
}

// d[64 x 16] (+)= a[64 x 16] * b[16 x 16], bf16, both K-major in shared memory; d as above (i < 2).
__device__ __forceinline__ void wgmma_m64n16k16_bf16(float (&d)[8], uint32_t desc_a_lo, uint32_t desc_b_lo, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nmov.b64 da, {%8, %10};\nmov.b64 db, {%9, %10};\n"
      "setp.ne.b32 p, %11, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, da, db, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(desc_a_lo), "r"(desc_b_lo), "n"(kKmajorSw128DescHi), "r"(static_cast<int>(accumulate)));
}

}  // namespace mla::sm90
