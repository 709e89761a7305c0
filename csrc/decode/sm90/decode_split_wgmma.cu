// Dense split-KV MLA decode on sm90a for 64-row tiles: S = Q K^T and O += P V on wgmma. The
// portable kernel (portable/decode_split.cuh) runs these compute-bound shapes (more than 32 query
// rows: h_q >= 33, or s_q x h_q > 32) on mma.sync at ~170 TFLOPS (bf16); everything around the math
// is the same: schedule, pieces, masks, partials, epilogue. 16-bit caches that TMA copies (block sizes
// that are multiples of 64, or 8, 16, 32) run decode_split_wgmma_pairs.cu instead (the key tiles in
// turns); this kernel takes the fp8 formats and the 16-bit caches TMA cannot copy.
//
// One CTA = 2 warpgroups = one part of the schedule x 64 query rows (row = s * h_q + h). Per
// 64-key tile:
//   load     16-bit cache: cp.async, 4 threads per cache row through the block table (any block
//            size; invalid pages and positions past the sequence zero-filled and flagged), straight
//            into the wgmma layout: 9 blocks of [64 keys][64 dims] in the 128-byte swizzle; two
//            stages (tile i + 1 loads while tile i computes).
//            fp8 / fp8_ds_mla: raw rows into one staging buffer (where the second stage would be),
//            dequantised into the one K tile as the portable kernel does (dequant_row_to_tile: fp8
//            unscaled, its per-tensor scale on the scores and the output; fp8_ds_mla times the tile
//            scale, rounded to q's type), after which the staging takes tile i + 1.
//            Q likewise, once per piece (padding rows zero).
//   S        warpgroup g: keys 32 g .. + 31 of all 64 rows over the 576 dims, 36 m64n32k16 with A = Q
//            and B = K both K-major in shared memory (split over keys, not dims: no partial sums to
//            exchange, which would not fit next to Q and two K stages).
//   softmax  mask (select), row maxima of the two warpgroups meet in shared memory, exp2-domain
//            online softmax (both warpgroups hold the same rows, so they keep identical m); P in
//            q's type goes to shared memory as one [64 rows][64 keys] swizzled block.
//   O += PV  warpgroup g: output dims 256 g .. + 255, two m64n128k16 per 16 keys with A = P
//            (K-major) and B = V = the stage's first 512 dims read MN-major; O = 128 fp32 per thread.
// Shared memory: Q 72 KB + 2 K stages 144 KB + P 8 KB + maxima / sums + flags = 225 KB.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "common/sm80.cuh"
#include "common/sm90/wgmma.cuh"
#include "decode/decode.h"
#include "decode/kernels.h"
#include "decode/portable/decode_split.cuh"  // dequant_row_to_tile
#include "decode/sm90/split_wgmma_common.cuh"
#include "decode/split_common.cuh"

namespace mla::decode::hopper {

using portable::dequant_row_to_tile;
using sm80::cp_async16;
using sm80::pack2;
using sm80::smem_addr;

struct WgmmaSplitConfig {
  static constexpr int kRows = kWgmmaRows;
  static constexpr int kThreads = 256;    // 2 warpgroups
  static constexpr int kStages = 2;
  static constexpr int kBlockBytes = kSwizzleBlockBytes;
  static constexpr int kTileBytes = 9 * kBlockBytes;    // 576 dims
  static constexpr int kRowChunks = 2 * kLatentDim / 16;  // 72 16-byte chunks per row
  static constexpr int kLoadThreadsPerRow = kThreads / kBlockN;  // 4
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kTileBytes;
  static constexpr int kOffP = kOffK + kStages * kTileBytes;  // [64 rows][64 keys]: one block
  static constexpr int kOffRed = kOffP + kBlockBytes;         // [2 warpgroups][64 rows] fp32
  static constexpr int kOffFlags = kOffRed + 2 * kRows * 4;   // [stage][64 keys] bytes
  static constexpr int kSmemBytes = kOffFlags + kStages * kBlockN;
  static constexpr int kSmemLaunchBytes = kSmemBytes + 1024;  // + base alignment of the swizzle atoms
  static_assert(kBlockN == 64 && kLoadThreadsPerRow * kBlockN == kThreads);
  static_assert(kSmemLaunchBytes <= 227 * 1024, "shared memory budget of sm90");
};

// With two stages (16-bit caches) the copies of tile i + 1 go out after tile i's row-maxima barrier:
// the previous tile's P V MMAs (which read that stage and P) are not waited for at the end of their
// tile but run on into this one, and that barrier is the first point where both warpgroups have seen
// them finish (their S wait covers them).
template <typename T, CacheFormat kFormat>
__global__ void __launch_bounds__(WgmmaSplitConfig::kThreads, 1) decode_split_wgmma_kernel(const __grid_constant__ DecodeParams p) {
#if MLA_SM90A
  using C = WgmmaSplitConfig;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kConvert = kFormat != CacheFormat::kAuto;
  constexpr int kRawRowBytes = kFormat == CacheFormat::kAuto ? 2 * kLatentDim : kFormat == CacheFormat::kFp8 ? kLatentDim : kDsMlaRowBytes;
  constexpr int kRawChunks = kRawRowBytes / 16;  // 72, 36 or 41
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = sm90::align_to_swizzle_atom(smem_raw);
  float* const red = reinterpret_cast<float*>(smem + C::kOffRed);
  uint8_t* const flags = smem + C::kOffFlags;
  const uint32_t q_base = smem_addr(smem + C::kOffQ), k_base = smem_addr(smem + C::kOffK);
  const uint32_t p_base = smem_addr(smem + C::kOffP);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, qd = lane % 4;
  // Warpgroup through a shuffle: warp-uniform for the compiler, so the descriptors stay uniform.
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  // This thread's accumulator rows (S and O alike): 16 (warp % 4) + lane / 4 + 8 h.
  const int row_lo = 16 * (warp % 4) + lane / 4;
  // Launched as a dependent too (common/pdl.cuh): wait until what the kernels before wrote (the
  // plan among it) is visible, then let the combine launch, which reads the plan before it waits.
  pdl_wait_prerequisites();
  pdl_launch_dependents();
  const SchedulePart part = schedule_part(p);
  const int row0 = blockIdx.y * C::kRows;
  const int rows_here = min(C::kRows, p.num_rows - row0);
  // fp8: K and V are used unscaled (exact in 16 bits); the per-tensor scale multiplies the scores
  // (folded into the exp2-domain scale) and the output.
  const float out_scale = kFormat == CacheFormat::kFp8 ? *p.scale : 1.f;
  const float score_scale = p.softmax_scale_log2 * out_scale;

  const sm90::SmemDesc q_desc = sm90::kmajor_sw128(q_base), k_desc = sm90::kmajor_sw128(k_base);
  const sm90::SmemDesc p_desc = sm90::kmajor_sw128(p_base);
  // V = a K stage's first 512 dims as an MN-major operand: 64-dim blocks 8 KiB apart, 8-key groups 1 KiB apart.
  const sm90::SmemDesc v_desc = sm90::mnmajor_sw128(k_base, C::kBlockBytes, 1024);

  for (int req = part.begin_req; req <= part.end_req; ++req) {
    const Piece piece = part_piece(p, part, req);
    const int seq_len = piece.seq_len, kv_len = piece.kv_len, tile_begin = piece.tile_begin, num_tiles = piece.num_tiles;
    const int32_t* bt = piece.bt;

    int lim[2];  // keys each of this thread's two rows may see
    row_key_limits(p, row0, rows_here, row_lo, seq_len, seq_len, lim);

    // Tile t (relative to the request) into stage `stage` by cp.async: thread -> row tid / 4, invalid
    // rows zero-filled.
    auto load_tile = [&](int t, int stage) {
      const int r = tid / C::kLoadThreadsPerRow, sub = tid % C::kLoadThreadsPerRow;
      const uint8_t* row = cache_row(p, bt, t * kBlockN + r, kv_len);
      const bool ok = row != nullptr;
      const uint8_t* src = ok ? row : static_cast<const uint8_t*>(p.kv_cache);  // any valid address
      if (sub == 0) flags[stage * kBlockN + r] = ok;
      const uint32_t dst = k_base + stage * C::kTileBytes;  // kConvert: the staging buffer (stage 1)
#pragma unroll
      for (int c = sub; c < kRawChunks; c += C::kLoadThreadsPerRow)
        cp_async16(dst + (kConvert ? r * kRawRowBytes + 16 * c : sw128(r, c)), src + 16 * c, ok);
    };
    constexpr int kLoadStage0 = kConvert ? 1 : 0;  // where the first tile of a piece goes

    if (num_tiles > 0) {
      load_q_rows<T, C::kRows, C::kThreads>(p, req, row0, rows_here, tid, q_base, [](int r, int c) { return sw128(r, c); });
      load_tile(tile_begin, kLoadStage0);
      sm80::cp_async_commit();
    }

    float o[2][64];  // output dims 256 wg + 128 v + 8 j + 2 qd + (e % 2), rows row_lo + 8 (e / 2): o[v][4 j + e]
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int v = 0; v < 2; ++v)
#pragma unroll
      for (int e = 0; e < 64; ++e) o[v][e] = 0.f;

    for (int i = 0; i < num_tiles; ++i) {
      // The K tile computed on (kConvert: always stage 0, the staging buffer is stage 1; flags of the
      // converted tile in slot 0 too).
      const int stage = kConvert ? 0 : i % C::kStages;
      const uint32_t k_off = stage * C::kTileBytes;
      sm80::cp_async_wait<0>();
      if constexpr (kConvert) {
        __syncthreads();  // tile i's raw rows landed for everyone; everyone is done with tile i - 1
        const int r = tid / C::kLoadThreadsPerRow, sub = tid % C::kLoadThreadsPerRow;
        dequant_row_to_tile<T, kFormat>(smem + C::kOffK + C::kTileBytes + r * kRawRowBytes, smem + C::kOffK, r, sub,
                                        [](int rr, int c) { return sw128(rr, c); });
        if (tid < kBlockN) flags[tid] = flags[kBlockN + tid];  // the staging's flags are rewritten below
      }
      fence_proxy_async_smem();  // cp.async data (generic proxy) -> wgmma's async proxy
      // Tile i landed for everyone. Two stages: P V of tile i - 1 may still run (it reads the other
      // stage and P); kConvert: it has finished, and the staging buffer is free.
      __syncthreads();
      if constexpr (kConvert) {
        if (i + 1 < num_tiles) load_tile(tile_begin + i + 1, 1);
        sm80::cp_async_commit();
      }

      // ---- S for keys 32 wg .. + 31: s[4 j + e] = row row_lo + 8 (e / 2), key 32 wg + 8 j + 2 qd + e % 2.
      float s[16];
      sm90::wgmma_fence();
#pragma unroll
      for (int b = 0; b < 9; ++b)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const uint64_t da = q_desc.at(b * C::kBlockBytes + 32 * ks);
          const uint64_t db = k_desc.at(k_off + b * C::kBlockBytes + 32 * 128 * wg + 32 * ks);
          if constexpr (kBf16) sm90::wgmma_m64n32k16_bf16(s, da, db, b + ks > 0);
          else sm90::wgmma_m64n32k16_f16(s, da, db, b + ks > 0);
        }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();  // S of tile i, and before it this warpgroup's P V of tile i - 1
      fence_accumulators(s);
      fence_accumulators(o);

      // ---- mask (select: a masked score never becomes NaN), exp2-domain scale, row maxima.
      const int key_lo = 32 * wg + 2 * qd;                       // + 8 j + e % 2
      const int pos_lo = (tile_begin + i) * kBlockN + key_lo;    // its position in the sequence
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const bool ok = flags[stage * kBlockN + key_lo + 8 * j + c] != 0;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float& v = s[4 * j + 2 * h + c];
            v = (ok && pos_lo + 8 * j + c < lim[h]) ? v * score_scale : -INFINITY;
            mx[h] = fmaxf(mx[h], v);
          }
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        if (qd == 0) red[wg * C::kRows + row_lo + 8 * h] = mx[h];
      }
      __syncthreads();  // (also: both warpgroups' P V of tile i - 1 are done, its stage and P are free)
      if constexpr (!kConvert) {  // tile i + 1 into that stage
        if (i + 1 < num_tiles) load_tile(tile_begin + i + 1, stage ^ 1);
        sm80::cp_async_commit();
      }

      // ---- online softmax: P = exp2(s - m) in T to shared memory, O *= exp2(m_old - m).
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_lo + 8 * h;
        const float m_new = fmaxf(m[h], fmaxf(red[r], red[C::kRows + r]));
        const float base = m_new == -INFINITY ? 0.f : m_new;  // rows with nothing seen yet stay at 0
        alpha[h] = m_new == m[h] ? 1.f : sm80::fast_exp2(m[h] - base);  // exactly 1: the rescale is skipped
        m[h] = m_new;
        l[h] *= alpha[h];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float p0 = sm80::fast_exp2(s[4 * j + 2 * h] - base), p1 = sm80::fast_exp2(s[4 * j + 2 * h + 1] - base);
          l[h] += p0 + p1;
          const int key = key_lo + 8 * j;  // chunk key / 8 = 4 wg + j of row r
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_base + r * 128 + (((4 * wg + j) ^ (r % 8)) << 4) + 2 * (key % 8)),
                       "r"(pack2<T>(p0, p1)));
        }
      }
      rescale_rows(o, alpha);
      fence_proxy_async_smem();  // P's st.shared -> wgmma
      __syncthreads();                 // P of both warpgroups written

      // ---- O[:, 256 wg ..] += P V: keys 16 ks .. + 15, dims 256 wg + 128 v .. + 127 (blocks 4 wg + 2 v, + 1).
      fence_accumulators(o);
      sm90::wgmma_fence();
#pragma unroll
      for (int v = 0; v < 2; ++v)
#pragma unroll
        for (int ks = 0; ks < kBlockN / 16; ++ks)
          sm90::wgmma_m64n128k16_ss_mn<kBf16>(o[v], p_desc.at(32 * ks), v_desc.at(k_off + (4 * wg + 2 * v) * C::kBlockBytes + 16 * 128 * ks));
      sm90::wgmma_commit();
      // Two stages: no wait here; these MMAs run on through the next tile's first barrier and S issue
      // (S waits for them). kConvert: its one K tile is rewritten after the next barrier.
      if constexpr (kConvert) {
        sm90::wgmma_wait<0>();
        fence_accumulators(o);
      }
    }
    sm80::cp_async_wait<0>();
    if constexpr (!kConvert) {
      sm90::wgmma_wait<0>();  // the last tile's P V
      fence_accumulators(o);
    }

    finish_piece<T>(p, part, req, row0, rows_here, wg, row_lo, red, o, m, l, out_scale, [] { __syncthreads(); });
  }
#else
  __trap();  // launched on sm90 only
#endif
}

template <typename T, CacheFormat kFormat>
void launch_decode_split_wgmma(const DecodeParams& p) {
  using C = WgmmaSplitConfig;
  launch_split_kernel(&decode_split_wgmma_kernel<T, kFormat>, C::kThreads, C::kSmemLaunchBytes, "sm90 wgmma decode kernel", p);
}

template void launch_decode_split_wgmma<__nv_bfloat16, CacheFormat::kAuto>(const DecodeParams&);
template void launch_decode_split_wgmma<__half, CacheFormat::kAuto>(const DecodeParams&);
template void launch_decode_split_wgmma<__nv_bfloat16, CacheFormat::kFp8>(const DecodeParams&);
template void launch_decode_split_wgmma<__half, CacheFormat::kFp8>(const DecodeParams&);
template void launch_decode_split_wgmma<__nv_bfloat16, CacheFormat::kFp8DsMla>(const DecodeParams&);
template void launch_decode_split_wgmma<__half, CacheFormat::kFp8DsMla>(const DecodeParams&);

}  // namespace mla::decode::hopper
