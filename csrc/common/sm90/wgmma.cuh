// sm90a wgmma: shared-memory descriptors of tiles in the 128-byte swizzle, the bf16/fp16 and e4m3
// instructions the kernels use, fences. Compiled only into sm_90a code (callers guard with
// MLA_SM90A, common/target.h); other targets never call them.
#pragma once

#include <cstdint>

#include "common/mbarrier.cuh"  // fence_proxy_async_smem, which orders st.shared before wgmma
#include "common/sm80.cuh"
#include "common/target.h"

namespace mla::sm90 {

// Descriptor of a K-major bf16 tile stored as rows of 64 elements (128 bytes), 8-row groups of
// 1024 bytes, 16-byte chunks XOR-swizzled by (row % 8) on a 1024-byte aligned base (the layout
// absorb::swizzle(row, chunk, 8) writes). Stepping k by 16 inside the 64-wide row = adding 32
// bytes to the start address; the hardware applies the swizzle to the final address.
//   bits 0-13: start address >> 4; 16-29: leading byte offset >> 4 (unused for swizzled K-major,
//   1 by convention); 32-45: stride byte offset >> 4 (1024 bytes between 8-row groups);
//   62-63: layout type 1 = 128-byte swizzle.
// (constexpr, host too: its constant high word is usable as an immediate, kKmajorSw128DescHi below.)
__host__ __device__ __forceinline__ constexpr uint64_t kmajor_sw128_desc(uint32_t smem_byte_addr) {
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// The dynamic shared memory base rounded up to 1024 bytes, the alignment of the 128-byte swizzle
// atoms that TMA writes and wgmma descriptors address (kernels reserve 1 KiB extra for it).
__device__ __forceinline__ uint8_t* align_to_swizzle_atom(uint8_t* smem_raw) {
  return smem_raw + ((1024 - sm80::smem_addr(smem_raw) % 1024) % 1024);
}

// A descriptor split into its constant high word (stride byte offset, layout) and a low word
// (start address >> 4, leading byte offset), for kernels that step one base through many MMAs:
// at(bytes) adds bytes >> 4 to the start address only (shared addresses stay below 2^18, so the
// field cannot carry), one add per MMA instead of masking and shifting a new address each time.
struct SmemDesc {
  uint32_t lo, hi;
  __device__ __forceinline__ uint64_t at(uint32_t byte_offset) const {
    return (static_cast<uint64_t>(hi) << 32) | (lo + (byte_offset >> 4));
  }
  // The base moved by `bytes` (a runtime offset taken out of the per-MMA constant ones).
  __device__ __forceinline__ SmemDesc plus(uint32_t byte_offset) const { return {lo + (byte_offset >> 4), hi}; }
};
// = kmajor_sw128_desc(base + bytes) for at(bytes)
__device__ __forceinline__ SmemDesc kmajor_sw128(uint32_t base) {
  const uint64_t d = kmajor_sw128_desc(base);
  return {static_cast<uint32_t>(d), static_cast<uint32_t>(d >> 32)};
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// setmaxnreg: a warpgroup's registers per thread from here on (warp-specialised kernels: the
// warpgroups that convert or copy give registers, the MMA warpgroups take them).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Keeps the compiler from moving accumulator reads/writes across wgmma issue and wait.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// fence_operand on every element of a thread's accumulators (S, or O as [2][64]).
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&acc)[N]) {
#pragma unroll
  for (int e = 0; e < N; ++e) fence_operand(acc[e]);
}
template <int M, int N>
__device__ __forceinline__ void fence_accumulators(float (&acc)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) fence_accumulators(acc[i]);
}

// The accumulator operands of the m64nN wgmma wrappers below ("+f" constraints of d[o] .. d[o + 15]).
#define MLA_WGMMA_D16(d, o)                                                                                          \
  "+f"(d[o + 0]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]),     \
      "+f"(d[o + 7]), "+f"(d[o + 8]), "+f"(d[o + 9]), "+f"(d[o + 10]), "+f"(d[o + 11]), "+f"(d[o + 12]), "+f"(d[o + 13]), \
      "+f"(d[o + 14]), "+f"(d[o + 15])
#define MLA_WGMMA_D32(d) MLA_WGMMA_D16(d, 0), MLA_WGMMA_D16(d, 16)
#define MLA_WGMMA_D64(d) MLA_WGMMA_D32(d), MLA_WGMMA_D16(d, 32), MLA_WGMMA_D16(d, 48)

// d[64 x 128] (+)= a[64 x 16] * b[16 x 128], both K-major in shared memory, fp32 accumulators in
// the m64nNk16 fragment layout: d[4 i + e] is row 16 (warp % 4) + lane / 4 + 8 (e / 2), column
// 8 i + 2 (lane % 4) + e % 2. accumulate = false overwrites d.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : MLA_WGMMA_D64(d)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// The same for n = 64: d[4 i + e] is row 16 (warp % 4) + lane / 4 + 8 (e / 2), column 8 i + 2 (lane % 4) + e % 2.
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MLA_WGMMA_D32(d)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// The same for n = 32: d[4 i + e] is row 16 (warp % 4) + lane / 4 + 8 (e / 2), column 8 i + 2 (lane % 4) + e % 2.
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : MLA_WGMMA_D16(d, 0)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// The fp16 twin of wgmma_m64n32k16_bf16 (same fragment layout).
__device__ __forceinline__ void wgmma_m64n32k16_f16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : MLA_WGMMA_D16(d, 0)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// Descriptor of an MN-major 16-bit operand in the 128-byte swizzle (used for B = V in P V: the
// rows of the tile are the K dimension, 64 consecutive N elements per 128-byte row). Canonical
// layout: 8-row groups of 1024 bytes along K, `sbo` bytes apart; 64-element blocks along N,
// `lbo` bytes apart (both multiples of 16). Same 1024-byte aligned swizzle atoms as above.
__device__ __forceinline__ uint64_t mnmajor_sw128_desc(uint32_t smem_byte_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
}

// = mnmajor_sw128_desc(base + bytes, lbo, sbo) for at(bytes)
__device__ __forceinline__ SmemDesc mnmajor_sw128(uint32_t base, uint32_t lbo, uint32_t sbo) {
  const uint64_t d = mnmajor_sw128_desc(base, lbo, sbo);
  return {static_cast<uint32_t>(d), static_cast<uint32_t>(d >> 32)};
}

// d[64 x 64] (+)= a[64 x 16] * b[16 x 64] with fp16 operands, both K-major in shared memory
// (the fp16 twin of wgmma_m64n64k16_bf16; same fragment layout).
__device__ __forceinline__ void wgmma_m64n64k16_f16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MLA_WGMMA_D32(d)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// d[64 x 128] += a[64 x 16] * b[16 x 128], bf16 (kBf16) or fp16: A from registers (the m16n8k16 A
// fragment of the warp's 16 rows: a[0] = rows lane / 4, k 2 (lane % 4) + {0, 1}; a[1] = rows + 8;
// a[2], a[3] = k + 8), B MN-major in shared memory (imm-trans-b = 1). Always accumulates.
template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n128k16_rs_mn(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
#define MLA_WGMMA_N128_RS_MN(TYPE)                                                                                     \
  asm volatile(                                                                                                       \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                                               \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                    \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                                   \
      : MLA_WGMMA_D64(d)                                                                                              \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))
  if constexpr (kBf16) MLA_WGMMA_N128_RS_MN("bf16");
  else MLA_WGMMA_N128_RS_MN("f16");
#undef MLA_WGMMA_N128_RS_MN
}

// d[64 x 128] += a[64 x 16] * b[16 x 128], both in shared memory: A K-major, B MN-major (imm-trans-b
// = 1; mnmajor_sw128_desc), bf16 (kBf16) or fp16 operands. Always accumulates.
template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n128k16_ss_mn(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
#define MLA_WGMMA_N128_SS_MN(TYPE)                                                                                     \
  asm volatile(                                                                                                       \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                                               \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, " \
      "0, 1;\n}\n"                                                                                                   \
      : MLA_WGMMA_D64(d)                                                                                              \
      : "l"(desc_a), "l"(desc_b), "r"(1))
  if constexpr (kBf16) MLA_WGMMA_N128_SS_MN("bf16");
  else MLA_WGMMA_N128_SS_MN("f16");
#undef MLA_WGMMA_N128_SS_MN
}

// The accumulator list of the m64n256 wrappers below: %0 .. %127.
#define MLA_WGMMA_N256_ACC                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                                  \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                                  \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                  \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                      \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "

// d[64 x 256] += a[64 x 16] * b[16 x 256]: m64n128k16_rs_mn over twice the columns, d[0] columns 0-127 and
// d[1] 128-255 (the m64n256 fragment is the two m64n128 ones one after the other). One instruction
// instead of two: half the issue slots and descriptor arithmetic for a P V over 256 dims.
template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n256k16_rs_mn(float (&d)[2][64], const uint32_t (&a)[4], uint64_t desc_b) {
#define MLA_WGMMA_N256_RS_MN(TYPE)                                                                                     \
  asm volatile(                                                                                                       \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " "                                               \
      MLA_WGMMA_N256_ACC                                                                                             \
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                                         \
      : MLA_WGMMA_D64(d[0]), MLA_WGMMA_D64(d[1])                                                                      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))
  if constexpr (kBf16) MLA_WGMMA_N256_RS_MN("bf16");
  else MLA_WGMMA_N256_RS_MN("f16");
#undef MLA_WGMMA_N256_RS_MN
}

// d[64 x 256] += a[64 x 16] * b[16 x 256], both in shared memory (m64n128k16_ss_mn over twice the columns).
template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n256k16_ss_mn(float (&d)[2][64], uint64_t desc_a, uint64_t desc_b) {
#define MLA_WGMMA_N256_SS_MN(TYPE)                                                                                     \
  asm volatile(                                                                                                       \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " "                                               \
      MLA_WGMMA_N256_ACC                                                                                             \
      "%128, %129, p, 1, 1, 0, 1;\n}\n"                                                                            \
      : MLA_WGMMA_D64(d[0]), MLA_WGMMA_D64(d[1])                                                                      \
      : "l"(desc_a), "l"(desc_b), "r"(1))
  if constexpr (kBf16) MLA_WGMMA_N256_SS_MN("bf16");
  else MLA_WGMMA_N256_SS_MN("f16");
#undef MLA_WGMMA_N256_SS_MN
}

// d[64 x N] (+)= a[64 x 16] * b[16 x N] for N = 32, 64 or 128 (the overloads above).
template <int N>
__device__ __forceinline__ void wgmma_m64nNk16_bf16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  if constexpr (N == 128) wgmma_m64n128k16_bf16(d, desc_a, desc_b, accumulate);
  else if constexpr (N == 64) wgmma_m64n64k16_bf16(d, desc_a, desc_b, accumulate);
  else wgmma_m64n32k16_bf16(d, desc_a, desc_b, accumulate);
}

// ---- the fp8 decode kernel's S^T = K q^T (csrc/decode/fp8_16rows/): e4m3 wgmma, whose
// operands must both be K-major in shared memory (fp8 wgmma has no transposed forms).

// Descriptors as their low 32 bits (kmajor_sw128_desc's start address and leading offset): its
// high word is the same for every tile, and passed as an immediate it stays a constant; a low
// word moves with k-steps and dim blocks by plain 32-bit adds (shared addresses stay below 2^18,
// so no carry). Built from scratch for each wgmma, a descriptor pair cost ~12 instructions.
// (SmemDesc above is the same split for instructions that take 64-bit descriptors.)
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
