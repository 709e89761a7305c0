// Pieces shared by the sm90 64-row decode kernels (decode_split_wgmma.cu, decode_split_wgmma_pairs.cu):
// the swizzled tile layout both read with wgmma, the rows' causal limits and the end of a piece
// (row sums, output or partials). Their O accumulators have one layout: warpgroup wg holds output
// dims 256 wg .. + 255 of all 64 rows as o[v][4 j + e] = row row_lo + 8 (e / 2), dim
// 256 wg + 128 v + 8 j + 2 (lane % 4) + e % 2, with row_lo = 16 (warp % 4) + lane / 4.
#pragma once

#include <cmath>

#include "common/sm90/wgmma.cuh"
#include "common/sm80.cuh"
#include "decode/decode.h"
#include "decode/split_common.cuh"

namespace mla::decode::hopper {

inline constexpr int kWgmmaRows = 64;                  // query rows per CTA
inline constexpr int kSwizzleBlockBytes = 64 * 128;  // [64 rows][64 dims] 16-bit: one swizzle block

// Byte offset of 16-byte chunk c (8 dims, 0..71) of row r in a Q or K tile (block c / 8, 128-byte
// rows, chunk c % 8 XOR-swizzled by r % 8: what the descriptors' 128-byte swizzle reads).
__device__ __forceinline__ uint32_t sw128(int r, int c) {
  return static_cast<uint32_t>((c / 8) * kSwizzleBlockBytes + r * 128 + (((c % 8) ^ (r % 8)) << 4));
}

using sm90::fence_accumulators;

// O's rows times f (f[h]: row row_lo + 8 h), skipped when every f of the warp is exactly 1 (the running
// maxima did not move).
__device__ __forceinline__ void rescale_rows(float (&o)[2][64], const float (&f)[2]) {
  if (__all_sync(0xffffffffu, f[0] == 1.f && f[1] == 1.f)) return;
#pragma unroll
  for (int v = 0; v < 2; ++v)
#pragma unroll
    for (int e = 0; e < 64; ++e) o[v][e] *= f[(e % 4) / 2];
}

// How many leading keys each of this thread's two rows (row_lo, row_lo + 8) may see: the causal
// limit of its query position, at most `limit` (0 for padding rows).
__device__ __forceinline__ void row_key_limits(const DecodeParams& p, int row0, int rows_here, int row_lo, int seq_len,
                                               int limit, int (&lim)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_lo + 8 * h;
    const int s = (row0 + r) / p.h_q;
    lim[h] = r >= rows_here ? 0 : min(p.causal ? min(max(seq_len - p.s_q + 1 + s, 0), seq_len) : seq_len, limit);
  }
}

// The end of request req's piece: row sums l over the quad and both warpgroups (through red,
// [2][64] fp32, free when this is called), then out and lse, or the normalised partials and their
// log2-domain lse when the request is split. m: the rows' exp2-domain maxima (the same in both
// warpgroups); out_scale multiplies the output (fp8's per-tensor scale, else 1). Ends with a barrier:
// the next piece may reuse every shared buffer. sync(): a barrier of the two warpgroups (the CTA's
// __syncthreads, or a named barrier where other warps run beside them).
template <typename T, typename Sync>
__device__ __forceinline__ void finish_piece(const DecodeParams& p, const SchedulePart& part, int req, int row0,
                                             int rows_here, int wg, int row_lo, float* red, const float (&o)[2][64],
                                             const float (&m)[2], const float (&l)[2], float out_scale, Sync sync) {
  const int qd = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (qd == 0) red[wg * kWgmmaRows + row_lo + 8 * h] = sum;
  }
  sync();
  const int num_splits = p.split_info[req * kSplitInfoFields + 0];
  const int64_t slot = partial_slot(p, part, req, num_splits);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_lo + 8 * h;
    if (r >= rows_here || slot < 0 || slot >= p.max_partials) continue;  // (a hand-made plan's bad slot)
    const float total = red[r] + red[kWgmmaRows + r];
    // total == 0: nothing attended (out 0, lse -inf); NaN (NaN in attended rows) propagates.
    const float inv = total == 0.f ? 0.f : out_scale / total;
    const float lse2 = total == 0.f ? -INFINITY : m[h] + log2f(total);
    const int g = row0 + r, sq = g / p.h_q, hq = g % p.h_q;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int d0 = 256 * wg + 128 * v + 2 * qd;
      if (num_splits <= 1) {
        T* dst = static_cast<T*>(p.out) + req * p.stride_out_b + sq * p.stride_out_s + hq * p.stride_out_h + d0;
#pragma unroll
        for (int j = 0; j < 16; ++j)
          *reinterpret_cast<uint32_t*>(dst + 8 * j) = sm80::pack2<T>(o[v][4 * j + 2 * h] * inv, o[v][4 * j + 2 * h + 1] * inv);
      } else {
        float* dst = p.partial_o + (slot * p.num_rows + g) * kKvLoraRank + d0;
#pragma unroll
        for (int j = 0; j < 16; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[v][4 * j + 2 * h] * inv, o[v][4 * j + 2 * h + 1] * inv);
      }
    }
    if (wg == 0 && qd == 0) {
      if (num_splits <= 1) p.lse[req * p.stride_lse_b + hq * p.stride_lse_h + sq * p.stride_lse_s] = lse2 * kLn2;
      else p.partial_lse[slot * p.num_rows + g] = lse2;
    }
  }
  sync();
}

}  // namespace mla::decode::hopper
