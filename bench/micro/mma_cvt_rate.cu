// Issue rates of the two instructions that bound the fp8 decode kernel's tile loop, per SM
// sub-partition: mma.sync m16n8k16 (fp16 in, fp32 accumulate) and cvt.rn.f16x2.e4m3x2, alone and
// one MMA fed by two conversions. Standalone (no torch):
//   nvcc -O3 -arch=sm_90a -o /tmp/mma_cvt_rate bench/micro/mma_cvt_rate.cu && /tmp/mma_cvt_rate
// Each warp runs 8 independent chains so that with 4+ warps per sub-partition the pipes, not the
// latencies, set the rate. (mma.sync with e4m3 operands is not measured: on sm_90a it compiles to
// these same conversions plus two fp16 HMMAs; Hopper's fp8 tensor math is wgmma only.)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t cvt_e4m3x2(uint32_t w) {
  uint32_t r;
  asm volatile("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "=r"(r) : "r"(w));
  return r;
}

// The same e4m3 -> fp16 conversion with integer instructions: the e4m3 bytes 1 and 3 (lo) or 0 and 2
// (hi) of w become fp16 values 2^-8 times theirs, exactly for every finite e4m3 value (sign kept,
// exponent and mantissa shifted into fp16's fields; the 2^-8 goes into a scale elsewhere).
__device__ __forceinline__ uint32_t alu_e4m3x2_lo(uint32_t w) { return (w & 0x80008000u) | ((w >> 1) & 0x3F803F80u); }
__device__ __forceinline__ uint32_t alu_e4m3x2_hi(uint32_t w) { return ((w << 8) & 0x80008000u) | ((w << 7) & 0x3F803F80u); }

enum Mode { kMma = 0, kCvt = 1, kCvtMma = 2, kAlu = 3, kAluMma = 4, kMixMma = 5 };

// Per chain and iteration: kMma one MMA; kCvt two conversions (+ one xor); kCvtMma two
// conversions feeding one MMA; kAlu two integer conversions of the same word (+ xor, add), kAluMma
// two integer conversions feeding one MMA; kMixMma one of each feeding one MMA.
template <int kMode>
__global__ void rate_kernel(float* out, int iters, uint32_t seed) {
  const uint32_t a[4] = {seed, seed * 3, seed * 5, seed * 7};
  float c[8][4] = {};
  uint32_t x[8];
  const uint32_t b = seed ^ threadIdx.x;
  for (int j = 0; j < 8; ++j) x[j] = b + j;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (kMode == kMma) mma_f16(c[j], a, b, b + j);
      if (kMode == kCvt) x[j] = cvt_e4m3x2(cvt_e4m3x2(x[j]) ^ 0x01010101u);
      if (kMode == kCvtMma) {
        x[j] = cvt_e4m3x2(x[j] ^ i);
        mma_f16(c[j], a, x[j], cvt_e4m3x2(x[j] + 1));
      }
      if (kMode == kAlu) x[j] = (alu_e4m3x2_lo(x[j]) ^ alu_e4m3x2_hi(x[j])) + i;  // (+ i: not folded away)
      if (kMode == kAluMma) {
        x[j] = alu_e4m3x2_lo(x[j] ^ i);
        mma_f16(c[j], a, x[j], alu_e4m3x2_hi(x[j] + 1));
      }
      if (kMode == kMixMma) {
        x[j] = cvt_e4m3x2(x[j] ^ i);
        mma_f16(c[j], a, x[j], alu_e4m3x2_hi(x[j] + 1));
      }
    }
  }
  float s = 0.f;
  for (int j = 0; j < 8; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3] + x[j];
  if (s == 12345.f) out[threadIdx.x] = s;  // keeps the work alive
}

template <int kMode>
void run(const char* name, int warps, int sms, double clock_ghz) {
  float* out = nullptr;
  cudaMalloc(&out, 4096);
  const int iters = 4096;
  rate_kernel<kMode><<<sms, 32 * warps>>>(out, 16, 1);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  rate_kernel<kMode><<<sms, 32 * warps>>>(out, iters, 1);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, e0, e1);
  const double groups_per_subpartition = double(warps) / 4 * iters * 8;
  const double ns = ms * 1e6 / groups_per_subpartition;
  printf("| %-26s | %2d | %6.3f | %5.2f | %5.1f |\n", name, warps, ms, ns, ns * clock_ghz);
  cudaFree(out);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace

int main() {
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const double ghz = clock_khz * 1e-6;
  printf("%d SMs, max clock %.2f GHz (cycles below assume it)\n", sms, ghz);
  printf("| per chain step | warps/SM | ms | ns per step per sub-partition | cycles |\n|---|---:|---:|---:|---:|\n");
  for (int warps : {4, 8, 16}) {
    run<kMma>("1 mma m16n8k16 f16", warps, sms, ghz);
    run<kCvt>("2 cvt e4m3x2 + 1 xor", warps, sms, ghz);
    run<kCvtMma>("2 cvt + 1 mma", warps, sms, ghz);
    run<kAlu>("2 int conv + 1 xor + 1 add", warps, sms, ghz);
    run<kAluMma>("2 int conversions + 1 mma", warps, sms, ghz);
    run<kMixMma>("1 cvt + 1 int conv + 1 mma", warps, sms, ghz);
  }
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
