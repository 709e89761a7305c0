// Portable split-KV MLA decode kernel (every target): mma.sync m16n8k16, ldmatrix, cp.async pipeline.
//
// One CTA = 8 warps = one part of the schedule x one block of kBlockM query rows (rows are the
// s_q x h_q pairs of a request, row = s * h_q + h). It walks its pieces (request, tile range);
// per 64-key tile:
//   load     every thread gathers 16-byte chunks of one cache row (4 threads per row) through
//            block_table[pos / block_size], row pos % block_size: any page size. Positions past
//            the sequence or whose page id is out of range are zero-filled, never read, and
//            flagged invalid so their scores are masked.
//   convert  (fp8, fp8_ds_mla) the staged raw rows are dequantised (fp32 scale, any finite
//            value) into a 16-bit tile of q's type; bf16 caches are used as loaded.
//   S = QK^T warp w computes the scores of keys 8w..8w+7 for all rows (Q and K from shared
//            memory by ldmatrix, K = 576), masks them (select, not multiply) and scales them into
//            the exp2 domain; row maxima meet in shared memory.
//   softmax  every warp updates the same running max; P (16-bit) goes to shared memory; each
//            thread keeps its own partial row sum (summed once at the end).
//   O += PV  warp w owns output dims 64w..64w+63 for all rows: O lives in registers
//            (kBlockM / 16 x 8 MMA tiles).
// Shared tiles of 576-wide rows are XOR-swizzled by 16-byte chunk (chunk ^ (row % 8)), which
// makes every ldmatrix and 16-byte store conflict-free without padding (72 chunks per row is a
// multiple of 8).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "decode/decode.h"
#include "decode/kernels.h"
#include "decode/split_common.cuh"
#include "common/sm80.cuh"

namespace mla::decode::portable {

using sm80::cp_async16;
using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::ldmatrix_x4;
using sm80::ldmatrix_x4_trans;
using sm80::mma_16816;
using sm80::pack2;
using sm80::smem_addr;

inline constexpr int kSmemBudget = 227 * 1024;  // opt-in maximum per CTA on sm90 and sm100

template <typename T, CacheFormat kFormat, int kBlockM>
struct SplitConfig {
  static_assert(kBlockM == 16 || kBlockM == 32 || kBlockM == 64, "rows per CTA: 16, 32 or 64");
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMTiles = kBlockM / 16;
  static constexpr int kKeysPerWarp = kBlockN / kWarps;        // 8: one n8 MMA tile of scores
  static constexpr int kDimsPerWarp = kKvLoraRank / kWarps;    // 64 output dims
  static_assert(kKeysPerWarp == 8 && kDimsPerWarp == 64);
  static constexpr int kRowBytes = 2 * kLatentDim;             // 1152: a 16-bit 576-wide row
  static constexpr int kRowChunks = kRowBytes / 16;            // 72
  static constexpr bool kConvert = kFormat != CacheFormat::kAuto;
  static constexpr int kRawRowBytes = kFormat == CacheFormat::kAuto  ? kRowBytes
                                      : kFormat == CacheFormat::kFp8 ? kLatentDim
                                                                     : kDsMlaRowBytes;
  static constexpr int kRawChunks = kRawRowBytes / 16;         // 72, 36 or 41
  static_assert(kRawRowBytes % 16 == 0);
  static constexpr int kLoadThreadsPerRow = kThreads / kBlockN;  // 4

  // Shared memory plan (bytes).
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kTileBytes = kBlockN * kRowBytes;       // converted tile (fp8 formats)
  static constexpr int kRawStageBytes = kBlockN * kRawRowBytes;
  static constexpr int kPBytes = kBlockM * kBlockN * 2;
  static constexpr int kRedBytes = kWarps * kBlockM * 4;
  // 16-row tiles split the QK^T reduction dim over 4 warp groups (Q stays in registers); their
  // partial scores [4][16][64] meet here. Row stride 72 floats: conflict-free float2 access.
  static constexpr bool kSplitK = kBlockM == 16;
  static constexpr int kSplitKSteps = kLatentDim / 16 / 4;  // 9 k16 steps per warp group
  static constexpr int kRedSStride = kBlockN + 8;
  static constexpr int kRedSBytes = kSplitK ? 4 * 16 * kRedSStride * 4 : 0;
  static constexpr int kMaxStages = kConvert ? 3 : 2;
  static constexpr int kFlagBytes = (kMaxStages + 1) * kBlockN;  // a byte per key per stage (+ converted tile)
  static constexpr int kFixedBytes =
      kQBytes + (kConvert ? kTileBytes : 0) + kPBytes + kRedBytes + kRedSBytes + kFlagBytes;
  // As many raw stages as fit: bf16 2 (64 keys each), fp8 2-3, fp8_ds_mla 1-3 by kBlockM.
  static constexpr int kStages = std::min(kMaxStages, (kSmemBudget - kFixedBytes) / kRawStageBytes);
  static_assert(kStages >= (kConvert ? 1 : 2), "decode tiles do not fit in shared memory");
  // Tiles whose loads are in flight ahead of the one being computed: a converted format frees
  // its raw stage before computing, so it can keep all stages loading.
  static constexpr int kPrefetch = kConvert ? kStages : kStages - 1;

  static constexpr int kOffQ = 0;
  static constexpr int kOffRaw = kOffQ + kQBytes;
  static constexpr int kOffTile = kOffRaw + kStages * kRawStageBytes;  // used when kConvert
  static constexpr int kOffP = kOffTile + (kConvert ? kTileBytes : 0);
  static constexpr int kOffRed = kOffP + kPBytes;
  static constexpr int kOffRedS = kOffRed + kRedBytes;
  static constexpr int kOffFlags = kOffRedS + kRedSBytes;
  static constexpr int kSmemBytes = kOffFlags + kFlagBytes;
  static_assert(kSmemBytes <= kSmemBudget);
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile with kRowBytes rows.
template <int kRowBytes>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

// 8 e4m3 bytes -> 8 values of T. kScaled: times `scale` in fp32 (any finite scale), then one
// rounding to T; else exact (e4m3 values are representable in bf16 and fp16).
template <typename T, bool kScaled>
__device__ __forceinline__ uint4 dequant8_e4m3(uint2 raw, float scale) {
  uint4 r;
  uint32_t* out = reinterpret_cast<uint32_t*>(&r);
  const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2)));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    if constexpr (!kScaled && std::is_same_v<T, __half>) {
      out[i] = uint32_t(h.x) | (uint32_t(h.y) << 16);
    } else {
      const float2 f = __half22float2(__half2(h));
      out[i] = kScaled ? pack2<T>(f.x * scale, f.y * scale) : pack2<T>(f.x, f.y);
    }
  }
  return r;
}

// One cache row of an fp8 format, staged raw in shared memory at `row`, dequantised into 16-bit
// row r of a tile by the 4 threads of the row (sub = 0..3): raw 16-byte chunks rc = sub + 4 j (16
// e4m3 -> output chunks 2 rc, 2 rc + 1), so every branch and the fp8_ds_mla tile of each chunk
// (rc / 8 = j / 2) are compile-time; loads go out in small batches (registers). fp8: unscaled
// (the per-tensor scale multiplies the scores and the output instead; exact); fp8_ds_mla: times
// its tile's fp32 scale, then k_pe (bf16 in the row). `offset(r, chunk)`: the byte offset of 16-byte
// output chunk `chunk` of row r in the tile (the tile's layout: swizzled rows here, the wgmma
// blocks in sm90/decode_split_wgmma.cu).
template <typename T, CacheFormat kFormat, typename Offset>
__device__ __forceinline__ void dequant_row_to_tile(const uint8_t* row, uint8_t* tile, int r, int sub, Offset offset) {
  constexpr int kRaw16 = (kFormat == CacheFormat::kFp8 ? kLatentDim : kKvLoraRank) / 16 / 4;
  constexpr int kBatch = 3;
  static_assert(kRaw16 % kBatch == 0 || kRaw16 == 8);
  float tile_scale[kDsMlaNumTiles];
  if constexpr (kFormat == CacheFormat::kFp8DsMla) {
#pragma unroll
    for (int t = 0; t < kDsMlaNumTiles; ++t) tile_scale[t] = *reinterpret_cast<const float*>(row + kDsMlaScaleOffset + 4 * t);
  }
#pragma unroll
  for (int j0 = 0; j0 < kRaw16; j0 += kBatch) {
    uint4 raw16[kBatch];
#pragma unroll
    for (int j = j0; j < j0 + kBatch; ++j)
      if (j < kRaw16) raw16[j - j0] = *reinterpret_cast<const uint4*>(row + 16 * (sub + 4 * j));
#pragma unroll
    for (int j = j0; j < j0 + kBatch; ++j) {
      if (j >= kRaw16) break;
      const int rc = sub + 4 * j;
      // fp8: the per-tensor scale is applied to the scores and the output instead (exact).
      const float sc = kFormat == CacheFormat::kFp8DsMla ? tile_scale[j / 2] : 1.f;
      const uint4 v = raw16[j - j0];
      *reinterpret_cast<uint4*>(tile + offset(r, 2 * rc)) =
          dequant8_e4m3<T, kFormat == CacheFormat::kFp8DsMla>(make_uint2(v.x, v.y), sc);
      *reinterpret_cast<uint4*>(tile + offset(r, 2 * rc + 1)) =
          dequant8_e4m3<T, kFormat == CacheFormat::kFp8DsMla>(make_uint2(v.z, v.w), sc);
    }
  }
  if constexpr (kFormat == CacheFormat::kFp8DsMla) {
    // k_pe, stored as bf16: output chunks 64 + sub + 4 j.
#pragma unroll
    for (int j = 0; j < kRopeDim / 8 / 4; ++j) {
      const int c = sub + 4 * j;
      uint4 v = *reinterpret_cast<const uint4*>(row + kDsMlaRopeOffset + 16 * c);
      if constexpr (!std::is_same_v<T, __nv_bfloat16>) {
        uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[e]));
          w[e] = pack2<T>(f.x, f.y);
        }
      }
      *reinterpret_cast<uint4*>(tile + offset(r, kKvLoraRank / 8 + c)) = v;
    }
  }
}

template <typename T, CacheFormat kFormat, int kBlockM>
__global__ void __launch_bounds__(256, 1) decode_split_kernel(const __grid_constant__ DecodeParams p) {
  using C = SplitConfig<T, kFormat, kBlockM>;
  constexpr int kMT = C::kMTiles;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const flags = smem + C::kOffFlags;
  float* const red = reinterpret_cast<float*>(smem + C::kOffRed);
  float* const red_s = reinterpret_cast<float*>(smem + C::kOffRedS);  // split-K partial scores
  uint32_t qf[C::kSplitK ? C::kSplitKSteps : 1][4];                    // split-K: Q slice (A fragments)
  const uint32_t q_base = smem_addr(smem + C::kOffQ);
  const uint32_t raw_base = smem_addr(smem + C::kOffRaw);
  const uint32_t p_base = smem_addr(smem + C::kOffP);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Launched as a dependent too (common/pdl.cuh): wait until what the kernels before wrote (the
  // plan among it) is visible, then let the combine launch, which reads the plan before it waits.
  pdl_wait_prerequisites();
  pdl_launch_dependents();
  const SchedulePart part = schedule_part(p);
  const int row0 = blockIdx.y * kBlockM;                   // first query row of this CTA
  const int rows_here = min(kBlockM, p.num_rows - row0);
  // fp8: K and V are used unscaled (exact in 16 bits); the per-tensor scale multiplies the
  // scores (folded into the exp2-domain scale) and the output.
  float score_scale = p.softmax_scale_log2, out_scale = 1.f;
  if constexpr (kFormat == CacheFormat::kFp8) {
    out_scale = *p.scale;
    score_scale *= out_scale;
  }

  for (int req = part.begin_req; req <= part.end_req; ++req) {
    const Piece piece = part_piece(p, part, req);
    const int seq_len = piece.seq_len, kv_len = piece.kv_len, tile_begin = piece.tile_begin, num_tiles = piece.num_tiles;
    const int32_t* bt = piece.bt;

    // How many leading keys each of this thread's accumulator rows may see (0 for padding rows).
    int lim[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = mt * 16 + lane / 4 + 8 * i;
        int l = 0;
        if (r < rows_here) {
          const int s = (row0 + r) / p.h_q;
          l = p.causal ? min(max(seq_len - p.s_q + 1 + s, 0), seq_len) : seq_len;
        }
        lim[mt][i] = l;
      }
    }

    // Issue the cp.async loads of tile t (relative to the request) into raw stage `stage`.
    auto load_tile = [&](int t, int stage) {
      const int r = tid / C::kLoadThreadsPerRow, sub = tid % C::kLoadThreadsPerRow;
      const int key = t * kBlockN + r;
      const uint8_t* row = cache_row(p, bt, key, kv_len);
      const bool ok = row != nullptr;
      const uint8_t* src = ok ? row : static_cast<const uint8_t*>(p.kv_cache);  // any valid address
      if (sub == 0) flags[stage * kBlockN + r] = ok;
      const uint32_t dst = raw_base + stage * C::kRawStageBytes;
#pragma unroll
      for (int c = sub; c < C::kRawChunks; c += C::kLoadThreadsPerRow) {
        const uint32_t off = C::kConvert ? r * C::kRawRowBytes + 16 * c : swz<C::kRowBytes>(r, c);
        cp_async16(dst + off, src + 16 * c, ok);
      }
    };

    if (num_tiles > 0) {
      // Q rows of this block (padding rows zero-filled), in the first group.
      load_q_rows<T, kBlockM, C::kThreads>(p, req, row0, rows_here, tid, q_base, [](int r, int c) { return swz<C::kRowBytes>(r, c); });
#pragma unroll
      for (int s = 0; s < C::kPrefetch; ++s) {
        if (s < num_tiles) load_tile(tile_begin + s, s);
        cp_async_commit();
      }
    }

    float o[kMT][8][4];
    float m[kMT][2], l[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) m[mt][i] = -INFINITY, l[mt][i] = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.f;
    }

    for (int i = 0; i < num_tiles; ++i) {
      const int stage = i % C::kStages;
      cp_async_wait<C::kPrefetch - 1>();
      __syncthreads();  // tile i landed for everyone; everyone is done with tile i - 1
      uint32_t kv_base;
      int flag_slot;
      if constexpr (C::kConvert) {
        // Dequantise raw stage -> 16-bit swizzled tile (thread t: row t / 4), then reuse the raw stage
        // for the next load.
        const int r = tid / C::kLoadThreadsPerRow, sub = tid % C::kLoadThreadsPerRow;
        static_assert(C::kLoadThreadsPerRow == 4, "dequant_row_to_tile: 4 threads per row");
        dequant_row_to_tile<T, kFormat>(smem + C::kOffRaw + stage * C::kRawStageBytes + r * C::kRawRowBytes,
                                        smem + C::kOffTile, r, sub, [](int rr, int c) { return swz<C::kRowBytes>(rr, c); });
        if (tid < kBlockN) flags[C::kStages * kBlockN + tid] = flags[stage * kBlockN + tid];
        __syncthreads();
        if (i + C::kPrefetch < num_tiles) load_tile(tile_begin + i + C::kPrefetch, stage);
        cp_async_commit();
        kv_base = smem_addr(smem + C::kOffTile);
        flag_slot = C::kStages;
      } else {
        if (i + C::kPrefetch < num_tiles) load_tile(tile_begin + i + C::kPrefetch, (i + C::kPrefetch) % C::kStages);
        cp_async_commit();
        kv_base = raw_base + stage * C::kRawStageBytes;
        flag_slot = stage;
      }

      // ---- S = Q K^T for keys 8 warp .. 8 warp + 7 (B fragments straight from the K rows).
      float sc[kMT][4];
      if constexpr (C::kSplitK) {
        // 16 rows: warp (g = w % 4, kh = w / 4) multiplies its register-resident Q slice (dims
        // 144 g .. 144 g + 143) with keys 32 kh .. 32 kh + 31; the four partial sums meet in
        // shared memory. Q is read from shared memory once per piece instead of 8x per tile.
        const int g = warp % 4, kh = warp / 4;
        if (i == 0) {
#pragma unroll
          for (int ks = 0; ks < C::kSplitKSteps; ++ks)
            ldmatrix_x4(qf[ks], q_base + swz<C::kRowBytes>(lane % 16, g * 2 * C::kSplitKSteps + 2 * ks + lane / 16));
        }
        float part[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) part[nt][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < C::kSplitKSteps; ++ks) {
          const int chunk = g * 2 * C::kSplitKSteps + 2 * ks + (lane / 8) % 2;
#pragma unroll
          for (int np = 0; np < 2; ++np) {  // two n8 tiles per ldmatrix: keys +0..7 and +8..15
            const int key_row = 32 * kh + 16 * np + 8 * (lane / 16) + lane % 8;
            uint32_t kb[4];
            ldmatrix_x4(kb, kv_base + swz<C::kRowBytes>(key_row, chunk));
            mma_16816<T>(part[2 * np], qf[ks], kb[0], kb[1]);
            mma_16816<T>(part[2 * np + 1], qf[ks], kb[2], kb[3]);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int key = 32 * kh + 8 * nt + 2 * (lane % 4);
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(red_s + (g * 16 + lane / 4 + 8 * h) * C::kRedSStride + key) =
                make_float2(part[nt][2 * h], part[nt][2 * h + 1]);
        }
        __syncthreads();
        // Back to "warp w owns keys 8 w .. 8 w + 7" for the softmax below.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float2 acc = make_float2(0.f, 0.f);
#pragma unroll
          for (int gg = 0; gg < 4; ++gg) {
            const float2 v = *reinterpret_cast<const float2*>(red_s + (gg * 16 + lane / 4 + 8 * h) * C::kRedSStride +
                                                              8 * warp + 2 * (lane % 4));
            acc.x += v.x;
            acc.y += v.y;
          }
          sc[0][2 * h] = acc.x;
          sc[0][2 * h + 1] = acc.y;
        }
      } else {
        // Independent accumulators per m-tile (summed after the loop): shorter MMA chains.
        constexpr int kAcc = kMT == 2 ? 2 : 1;
        float sacc[kMT][kAcc][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int a = 0; a < kAcc; ++a)
#pragma unroll
            for (int e = 0; e < 4; ++e) sacc[mt][a][e] = 0.f;
        const int key_row = warp * 8 + lane % 8;
#pragma unroll
        for (int kc = 0; kc < C::kRowChunks; kc += 4) {  // 32 dims = two k16 steps
          uint32_t kb[4];
          ldmatrix_x4(kb, kv_base + swz<C::kRowBytes>(key_row, kc + lane / 8));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            const int qr = mt * 16 + lane % 16;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              uint32_t qa[4];
              ldmatrix_x4(qa, q_base + swz<C::kRowBytes>(qr, kc + 2 * half + lane / 16));
              mma_16816<T>(sacc[mt][(kc / 2 + half) % kAcc], qa, kb[2 * half], kb[2 * half + 1]);
            }
          }
        }
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v = sacc[mt][0][e];
#pragma unroll
            for (int a = 1; a < kAcc; ++a) v += sacc[mt][a][e];
            sc[mt][e] = v;
          }
      }

      // ---- mask (select) + scale into the exp2 domain, row max across the 8 warps.
      const int kcol = warp * 8 + 2 * (lane % 4);  // this thread's two keys in the tile
      const int key0 = (tile_begin + i) * kBlockN + kcol;
      const bool ok0 = flags[flag_slot * kBlockN + kcol] != 0;
      const bool ok1 = flags[flag_slot * kBlockN + kcol + 1] != 0;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& a = sc[mt][2 * h];
          float& b = sc[mt][2 * h + 1];
          a = (ok0 && key0 < lim[mt][h]) ? a * score_scale : -INFINITY;
          b = (ok1 && key0 + 1 < lim[mt][h]) ? b * score_scale : -INFINITY;
          float mx = fmaxf(a, b);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          if (lane % 4 == 0) red[warp * kBlockM + mt * 16 + lane / 4 + 8 * h] = mx;
        }
      }
      __syncthreads();

      // ---- online softmax: P = exp2(s - m) to shared memory; rescale O by exp2(m_old - m).
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = mt * 16 + lane / 4 + 8 * h;
          float tile_max = red[r];
#pragma unroll
          for (int w = 1; w < C::kWarps; ++w) tile_max = fmaxf(tile_max, red[w * kBlockM + r]);
          const float m_new = fmaxf(m[mt][h], tile_max);
          const float base = m_new == -INFINITY ? 0.f : m_new;  // rows with nothing seen yet stay at 0
          const float alpha = exp2f(m[mt][h] - base);
          const float p0 = exp2f(sc[mt][2 * h] - base), p1 = exp2f(sc[mt][2 * h + 1] - base);
          l[mt][h] = l[mt][h] * alpha + p0 + p1;
          m[mt][h] = m_new;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_base + r * (kBlockN * 2) + ((warp ^ (r & 7)) << 4) + 4 * (lane % 4)),
                       "r"(pack2<T>(p0, p1)));
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) o[mt][nt][2 * h] *= alpha, o[mt][nt][2 * h + 1] *= alpha;
        }
      }
      __syncthreads();

      // ---- O[:, 64 warp .. +63] += P V (V = first 512 dims of the same rows, ldmatrix.trans).
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const int r = mt * 16 + lane % 16;
          ldmatrix_x4(pa[mt], p_base + r * (kBlockN * 2) + (((2 * ks + lane / 16) ^ (r & 7)) << 4));
        }
        const int vr = 16 * ks + lane % 8 + 8 * ((lane / 8) % 2);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, kv_base + swz<C::kRowBytes>(vr, 8 * warp + 2 * np + lane / 16));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(o[mt][2 * np], pa[mt], vb[0], vb[1]);
            mma_16816<T>(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
    cp_async_wait<0>();

    // ---- finish the piece: total row sums across the quad and the 8 warps, then write.
    // (red was last read before the previous __syncthreads, so it can be reused at once.)
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float s = l[mt][h];
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (lane % 4 == 0) red[warp * kBlockM + mt * 16 + lane / 4 + 8 * h] = s;
      }
    }
    __syncthreads();
    const int num_splits = p.split_info[req * kSplitInfoFields + 0];
    const int64_t slot = partial_slot(p, part, req, num_splits);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mt * 16 + lane / 4 + 8 * h;
        if (r >= rows_here || slot < 0 || slot >= p.max_partials) continue;  // (a hand-made plan's bad slot)
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < C::kWarps; ++w) total += red[w * kBlockM + r];
        // total == 0: nothing attended (out 0, lse -inf); NaN (NaN in attended rows) propagates.
        const float inv = total == 0.f ? 0.f : out_scale / total;
        const float lse2 = total == 0.f ? -INFINITY : m[mt][h] + log2f(total);
        const int g = row0 + r, s = g / p.h_q, hq = g % p.h_q;
        const int d0 = warp * C::kDimsPerWarp + 2 * (lane % 4);
        if (num_splits <= 1) {
          T* dst = static_cast<T*>(p.out) + req * p.stride_out_b + s * p.stride_out_s + hq * p.stride_out_h + d0;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            *reinterpret_cast<uint32_t*>(dst + 8 * nt) = pack2<T>(o[mt][nt][2 * h] * inv, o[mt][nt][2 * h + 1] * inv);
          if (warp == 0 && lane % 4 == 0) p.lse[req * p.stride_lse_b + hq * p.stride_lse_h + s * p.stride_lse_s] = lse2 * kLn2;
        } else {
          float* dst = p.partial_o + (slot * p.num_rows + g) * kKvLoraRank + d0;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(o[mt][nt][2 * h] * inv, o[mt][nt][2 * h + 1] * inv);
          if (warp == 0 && lane % 4 == 0) p.partial_lse[slot * p.num_rows + g] = lse2;
        }
      }
    }
    __syncthreads();  // the next piece reuses every shared buffer
  }
}

template <typename T, CacheFormat kFormat, int kBlockM>
void launch_decode_split(const DecodeParams& p) {
  using C = SplitConfig<T, kFormat, kBlockM>;
  launch_split_kernel(&decode_split_kernel<T, kFormat, kBlockM>, C::kThreads, C::kSmemBytes, "portable decode kernel", p);
}

}  // namespace mla::decode::portable
