// Does compute-sanitizer synccheck mind where a bulk copy (cp.async.bulk, mbarrier complete_tx) lands in
// shared memory? The portable fp8 16-row decode kernel with its rows 32-63 shifted by 32 bytes
// (kRowHalfShift, csrc/decode/portable/decode_split_fp8.cuh) ends in a launch failure under synccheck,
// and the same kernel without the shift does not. This probe keeps that kernel's copy protocol and
// nothing else: 512 threads in two teams of 256, two stages of 64 rows of 576 bytes per team, one
// mbarrier per stage (4 arrivals: lanes 0-3 of the team's warp 0, each arrive.expect_tx + one bulk copy
// of its 16 rows, or a plain arrival), the team waits on the stage's parity and syncs on a named
// barrier, then reads the stage. Standalone (no torch):
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -o /tmp/bulk_probe bench/micro/synccheck_bulk_probe.cu
//   compute-sanitizer --tool synccheck /tmp/bulk_probe <shift> <whole>
// shift: bytes by which rows 32-63 of a stage move on (0, 16, 32, 128); whole: 1 = lanes 0 and 2 copy
// 32 rows each and lanes 1 and 3 arrive without bytes, 0 = each lane its quarter's 16 rows.
// On the H200 it passes synccheck at every shift, whole or quarter copies; the kernel's fault went away
// with `--num-cuda-barriers 4096` (the tool's table of tracked barriers: bench/results/logs/s18_synccheck).
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>

#include "absorb/sm90/tma.cuh"  // the kernel's own mbarrier and bulk-copy instructions (sm90::)

using namespace mla;
constexpr int kRowBytes = 576, kRows = 64, kStages = 2, kTeamThreads = 256;

__global__ void __launch_bounds__(512, 1) probe(const uint8_t* cache, float* out, int tiles, int shift, int whole) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int stage_bytes = kRows * kRowBytes + shift + 16;  // rows, then 16 flag bytes (as the kernel)
  const int team_bytes = kStages * stage_bytes + 2304 + 512 + 128;
  const int tid = threadIdx.x, team = tid / kTeamThreads, ttid = tid % kTeamThreads;
  uint8_t* const team_smem = smem + team * team_bytes;
  const uint32_t stage_base = static_cast<uint32_t>(__cvta_generic_to_shared(team_smem));
  const uint32_t bar0 = stage_base + kStages * stage_bytes + 2304 + 512 + 64;
  if (ttid == 0) {
    for (int s = 0; s < kStages; ++s) sm90::mbar_init(bar0 + 8 * s, 4);
    sm90::mbar_init_fence();
  }
  __syncthreads();
  auto row_offset = [&](int r) { return r * kRowBytes + shift * (r / 32); };
  auto issue = [&](int t, int stage) {
    if (ttid >= 4) return;
    const int q = ttid;
    const uint32_t bar = bar0 + 8 * stage;
    const bool copies = whole ? q % 2 == 0 : true;
    const int rows = copies ? (whole ? 32 : 16) : 0;
    const uint8_t* src = cache + (int64_t(2 * t + team) * kRows + 16 * q) * kRowBytes;
    if (rows > 0) {
      sm90::mbar_arrive_expect_tx(bar, rows * kRowBytes);
      sm90::bulk_load(stage_base + stage * stage_bytes + row_offset(16 * q), src, rows * kRowBytes, bar);
    } else {
      sm90::mbar_arrive(bar);
    }
  };
  if (ttid < 32) issue(0, 0);
  uint32_t phase = 0;
  float acc = 0.f;
  for (int i = 0; i < tiles; ++i) {
    const int stage = i % kStages;
    sm90::mbar_wait(bar0 + 8 * stage, (phase >> stage) & 1);
    phase ^= 1u << stage;
    sm80::named_barrier(1 + team, kTeamThreads);  // the team is done with the previous tile: its stage may be refilled
    if (i + 1 < tiles && ttid < 32) issue(i + 1, (i + 1) % kStages);
    const uint8_t* st = team_smem + stage * stage_bytes;
    for (int r = ttid / 4; r < kRows; r += kTeamThreads / 4) acc += st[row_offset(r) + 16 * (ttid % 4)];
  }
  out[blockIdx.x * 512 + tid] = acc;
}

int main(int argc, char** argv) {
  const int shift = argc > 1 ? atoi(argv[1]) : 32, whole = argc > 2 ? atoi(argv[2]) : 1;
  const int tiles = 8, blocks = 4;
  const size_t cache_bytes = size_t(2 * tiles) * kRows * kRowBytes;
  uint8_t* cache;
  float* out;
  cudaMalloc(&cache, cache_bytes);
  cudaMemset(cache, 1, cache_bytes);
  cudaMalloc(&out, blocks * 512 * sizeof(float));
  const int smem = 2 * (kStages * (kRows * kRowBytes + shift + 16) + 2304 + 512 + 128);
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<<<blocks, 512, smem>>>(cache, out, tiles, shift, whole);
  const cudaError_t e = cudaDeviceSynchronize();
  float h = 0.f;
  if (e == cudaSuccess) cudaMemcpy(&h, out, sizeof(float), cudaMemcpyDeviceToHost);
  // each thread adds 64 / 64 rows x tiles of byte value 1: expect `tiles`
  printf("shift %d whole %d: %s, out[0] = %g (expect %d)\n", shift, whole, cudaGetErrorString(e), h, tiles);
  return e == cudaSuccess ? 0 : 1;
}
