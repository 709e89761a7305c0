// Helpers shared by the absorbed-projection kernels: shared-memory swizzle, e4m3 weight
// dequantisation, the dynamic shared memory opt-in.
#pragma once

#include <cuda_runtime.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "absorb/absorb.h"
#include "common/cuda_check.h"

namespace mla::absorb {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][row_chunks] array.
// For rows of 8 chunks (128 bytes) on a 1024-byte aligned base this is exactly the 128-byte
// swizzle (Swizzle<3,4,3>) that wgmma descriptors with layout type 1 expect.
__device__ __forceinline__ uint32_t swizzle(int row, int chunk, int row_chunks) {
  return static_cast<uint32_t>(row * row_chunks + (chunk ^ (row & 7))) * 16u;
}

// 16 e4m3 -> 16 bf16 of (w * scale), as two 16-byte chunks: the rounding of the bf16 weights
// prepare_absorb_weights makes, so bf16 and fp8 weights give the same kernel results.
__device__ __forceinline__ void dequant16_e4m3(const uint4& raw, float scale, uint4 (&out)[2]) {
  const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
  auto* dst = reinterpret_cast<__nv_bfloat162*>(out);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
    dst[i] = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  }
}

// One head's e4m3 W_UV[h]^T ([128 n, 512 k] row-major, `w`) dequantised to bf16(w * scale) into
// eight K-major [128 n, 64 k] bf16 tiles of 16 KiB in the 128-byte swizzle at `tiles` (1024-byte
// aligned), by threads tid = 0 .. kThreads - 1: the resident weight of the sm90 v_up kernels.
// 16 e4m3 per load = two bf16 chunks; batches of 8 loads in flight per thread.
template <int kThreads>
__device__ __forceinline__ void dequant_w_uv_sw128(uint8_t* tiles, const uint8_t* w, const float* scale, int tid) {
  constexpr int N = kVHeadDim, K = kKvLoraRank, BK = 64, kTileBytes = N * BK * 2;
  constexpr int kLoads = N * K / 16, kPerRow = K / 16, kBatch = 8;
  static_assert(kLoads % (kThreads * kBatch) == 0);
  for (int base = tid; base < kLoads; base += kThreads * kBatch) {
    uint4 raw[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = base + j * kThreads;
      raw[j] = __ldg(reinterpret_cast<const uint4*>(w + (i / kPerRow) * K + (i % kPerRow) * 16));
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = base + j * kThreads, n = i / kPerRow, col = (i % kPerRow) * 16;
      uint4 out[2];
      dequant16_e4m3(raw[j], __ldg(scale + col / kWeightBlock), out);
      uint8_t* tile = tiles + (col / BK) * kTileBytes;
      const int c = (col % BK) / 8;
      *reinterpret_cast<uint4*>(tile + swizzle(n, c, 8)) = out[0];
      *reinterpret_cast<uint4*>(tile + swizzle(n, c + 1, 8)) = out[1];
    }
  }
}

}  // namespace mla::absorb
