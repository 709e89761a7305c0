// What compute-sanitizer racecheck makes of a value handed between the two warpgroups of a CTA the way
// the tile-pairs decode kernel (csrc/decode/sm90/decode_split_wgmma_pairs.cu) hands its row maxima over:
// one warpgroup writes shared memory and arrives at a named barrier (bar.arrive), the other waits there
// (bar.sync) and reads. Standalone (no torch):
//   nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -o /tmp/probe bench/micro/racecheck_handoff_probe.cu
//   compute-sanitizer --tool racecheck /tmp/probe
// Four kernels, the same hand-offs a (warpgroup 0 -> 1, barrier 1) and b (1 -> 0, barrier 2) each:
//   probe<0> as described; probe<1> / probe<3> add a warpgroup-local bar.sync (128 threads; register /
//   immediate id) in each warpgroup, which orders nothing between the warpgroups; probe<2> hands b over
//   through an mbarrier (128 arrivals, try_wait.parity) instead.
// On the H200 (compute-sanitizer of CUDA 13.0, bench/results/logs/s9_pairs/s9i_probe) racecheck reported
// b as a race in probe<0> only, a's mirror image never: since probe<1> and probe<3> have exactly
// probe<0>'s ordering between the warpgroups, the report is the tool's, not a race.
#include <cstdio>
#include <cuda_runtime.h>
__device__ __forceinline__ void bsync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void barv(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned c) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(c)); }
__device__ __forceinline__ void mbar_arrive(unsigned bar) { asm volatile("{\n.reg .b64 s;\nmbarrier.arrive.shared::cta.b64 s, [%0];\n}\n" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned ph) {
  unsigned done = 0;
  do { asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(ph) : "memory"); } while (!done);
}
// kVariant 0: plain mirror of the kernel's exchange; 1: plus a warpgroup-local barrier with a register id
// before wg 0's sync; 2: the b hand-off through an mbarrier (128 arrivals); 3: like 1 with immediate ids.
template <int kVariant>
__global__ void probe(float* out, int iters) {
  __shared__ float a[2][64], b[2][64];
  __shared__ alignas(8) unsigned long long mb;
  const int tid = threadIdx.x, wg = __shfl_sync(~0u, tid / 128, 0), r = (tid % 128) / 2;
  const unsigned mba = static_cast<unsigned>(__cvta_generic_to_shared(&mb));
  if (tid == 0) mbar_init(mba, 128);
  __syncthreads();
  float acc = 0.f;
  for (int i = 0; i < iters; ++i) {
    const int par = i % 2;
    if (wg == 0) {
      if (tid % 2 == 0) a[par][r] = acc + i;
      barv(1, 256);
      if (kVariant == 1) bsync(5 + wg, 128);
      if (kVariant == 3) bsync(5, 128);
      if (kVariant == 2) mbar_wait(mba, i % 2); else bsync(2, 256);
      acc += b[par][r];
      barv(3, 256);
      bsync(4, 256);
    } else {
      bsync(1, 256);
      acc += a[par][r];
      if (tid % 2 == 0) b[par][r] = acc * 0.5f;
      if (kVariant == 2) mbar_arrive(mba); else barv(2, 256);
      barv(4, 256);
      if (kVariant == 1) bsync(5 + wg, 128);
      if (kVariant == 3) bsync(6, 128);
      bsync(3, 256);
    }
  }
  out[blockIdx.x * 256 + tid] = acc;
}
int main() {
  float* out;
  cudaMalloc(&out, 4 * 256 * sizeof(float));
  probe<0><<<2, 256>>>(out, 6);
  probe<1><<<2, 256>>>(out, 6);
  probe<2><<<2, 256>>>(out, 6);
  probe<3><<<2, 256>>>(out, 6);
  printf("sync: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
