// Session 15 microbenchmark (run as measured, with the two cvt helpers merged into one since): issue cost (cycles per warp instruction per SM sub-partition) of the
// instructions the portable fp8 decode kernel is made of, 16 warps per SM like the kernel.
#include <cstdio>
#include <cstdint>
#include <cuda_fp16.h>

// e4m3 pair (the low or the high half of x) to f16x2.
template <bool kHigh = false>
__device__ __forceinline__ uint32_t f2fp(uint32_t x) {
  uint32_t y;
  const uint16_t h = kHigh ? x >> 16 : x & 0xffff;
  asm volatile("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(y) : "h"(h));
  return y;
}
// e4m3 pairs (bytes 1, 3 of each half) to fp16 x 2^-8 with integer ops (finite values).
__device__ __forceinline__ uint32_t alu_cvt(uint32_t q) {
  uint32_t r;
  asm volatile("{ .reg .b32 t; and.b32 t, %1, 0x7F007F00; shr.b32 t, t, 1; lop3.b32 %0, %1, t, 0x80008000, 0xf8; }" : "=r"(r) : "r"(q));
  return r;  // lop3 0xf8 = a & c | b  (a = q, b = t, c = mask)
}
__device__ __forceinline__ void hmma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int kMode>
__global__ void __launch_bounds__(512, 1) bench(uint32_t* sink, long long* cyc, int iters) {
  uint32_t r[8];
  float c[4][4] = {};
#pragma unroll
  for (int i = 0; i < 8; ++i) r[i] = threadIdx.x * 0x01010101u + i * 0x11;
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    if constexpr (kMode == 0) {  // F2FP only: 8 per iteration
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = f2fp(r[i]);
    } else if constexpr (kMode == 1) {  // HMMA only: 4 per iteration, 4 accumulators
#pragma unroll
      for (int j = 0; j < 4; ++j) hmma(c[j], r[0], r[1], r[2], r[3], r[4 + j % 4], r[(5 + j) % 8]);
    } else if constexpr (kMode == 2) {  // 8 F2FP + 4 HMMA (the kernel's ratio is ~2:1)
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = f2fp(r[i]);
#pragma unroll
      for (int j = 0; j < 4; ++j) hmma(c[j], r[0], r[1], r[2], r[3], r[4 + j % 4], r[(5 + j) % 8]);
    } else if constexpr (kMode == 3) {  // integer conversion: 8 per iteration (3 ALU each)
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = alu_cvt(r[i]);
    } else if constexpr (kMode == 4) {  // 4 F2FP + 4 integer conversions + 4 HMMA
#pragma unroll
      for (int i = 0; i < 4; ++i) r[i] = f2fp(r[i]);
#pragma unroll
      for (int i = 4; i < 8; ++i) r[i] = alu_cvt(r[i]);
#pragma unroll
      for (int j = 0; j < 4; ++j) hmma(c[j], r[0], r[1], r[2], r[3], r[4 + j % 4], r[(5 + j) % 8]);
    } else if constexpr (kMode == 5) {  // F2FP of the high halves (.H1 operand)
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = f2fp<true>(r[i]);
    } else if constexpr (kMode == 6) {  // PRMT only
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = __byte_perm(r[i], r[(i + 1) % 8], 0x5140);
    }
  }
  long long t1 = clock64();
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc ^= r[i];
#pragma unroll
  for (int j = 0; j < 4; ++j) acc ^= __float_as_uint(c[j][0] + c[j][1] + c[j][2] + c[j][3]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
}

template <int kMode>
void run(const char* name, int per_iter, uint32_t* sink, long long* cyc, int iters) {
  bench<kMode><<<132, 512>>>(sink, cyc, iters);
  bench<kMode><<<132, 512>>>(sink, cyc, iters);
  cudaDeviceSynchronize();
  long long h[132];
  cudaMemcpy(h, cyc, sizeof(h), cudaMemcpyDeviceToHost);
  double mean = 0;
  for (int i = 0; i < 132; ++i) mean += h[i] / 132.0;
  // 16 warps, 4 sub-partitions: each issues 4 warps' instructions
  printf("%-40s %8.2f cycles per warp instruction per sub-partition (%s)\n", name, mean / (4.0 * iters * per_iter),
         cudaGetErrorString(cudaGetLastError()));
}

int main() {
  uint32_t* sink; long long* cyc;
  cudaMalloc(&sink, 132 * 512 * 4); cudaMalloc(&cyc, 132 * 8);
  const int iters = 4096;
  run<0>("F2FP e4m3x2 -> f16x2 (lo)", 8, sink, cyc, iters);
  run<5>("F2FP e4m3x2 -> f16x2 (hi)", 8, sink, cyc, iters);
  run<1>("HMMA m16n8k16 f32", 4, sink, cyc, iters);
  run<2>("8 F2FP + 4 HMMA (per HMMA)", 4, sink, cyc, iters);
  run<3>("integer cvt (and, shr, lop3), per cvt", 8, sink, cyc, iters);
  run<4>("4 F2FP + 4 int cvt + 4 HMMA (per HMMA)", 4, sink, cyc, iters);
  run<6>("PRMT", 8, sink, cyc, iters);
  return 0;
}
