// Sparse top-k MLA decode, portable path (mma.sync + cp.async; sm80 .. sm100).
//
// One CTA = one query token (b, s), one tile of kM heads, one split of the top-k list.
// grid = (ceil(h_q / kM), num_splits, b * s_q); 256 threads = 8 warps.
// See csrc/sparse/README.md for the warp roles and the bytes each tile reads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/e4m3.cuh"
#include "common/sm80.cuh"
#include "common/types.h"
#include "sparse/sparse_decode.h"

namespace mla::sparse {

template <int kM_, CacheFormat kFormat_, int kStages_>
struct PortableConfig {
  static constexpr int kM = kM_;                     // query heads per CTA: 16, 32 or 64
  static constexpr CacheFormat kFormat = kFormat_;
  static constexpr bool kDsMla = kFormat == CacheFormat::kFp8DsMla;
  static_assert(kM == 16 || kM == 32 || kM == 64, "head tile must be 16, 32 or 64 rows");
  static_assert(kFormat == CacheFormat::kAuto || kDsMla, "sparse decode reads auto (bf16) or fp8_ds_mla caches");

  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kN = 64;                      // keys (gathered rows) per tile
  // Warp (row_group, col_group): rows [16 row_group, +16) of the head tile. QK^T splits the tile's
  // keys over the column groups; PV splits the 512 output columns over them, so O stays at
  // 16 x 512/col_groups fp32 per warp (128 registers for kM = 64) and no MMA is done twice.
  static constexpr int kRowGroups = kM / 16;
  static constexpr int kColGroups = kWarps / kRowGroups;  // 8, 4, 2
  static constexpr int kKeysPerWarp = kN / kColGroups;    // 8, 16, 32
  static constexpr int kSTiles = kKeysPerWarp / 8;        // n8 tiles of S per warp
  static constexpr int kOutCols = kKvLoraRank / kColGroups;  // 64, 128, 256
  static constexpr int kOTiles = kOutCols / 8;
  // QK^T runs 4 / kSTiles independent accumulator chains (16-head tiles have one n8 tile per warp,
  // and 36 MMAs in one dependent chain would leave the tensor cores waiting on their latency).
  static constexpr int kChains = 4 / kSTiles;
  // fp8_ds_mla: the 128-wide scale tiles this warp's output columns span (2 for 64-head tiles).
  static constexpr int kVTiles = kDsMla && kOutCols >= 128 ? kOutCols / 128 : 1;
  static constexpr int kOTilesPerV = kOTiles / kVTiles;
  // 16-bit type of the MMA operands: bf16 rows, or fp16 for fp8_ds_mla (e4m3 is exact in fp16 and
  // the tile scales stay out of the operands; k_pe is bf16 in both formats).
  using KvT = std::conditional_t<kDsMla, __half, __nv_bfloat16>;

  // bf16 rows of 576 = 72 chunks of 16 bytes. Rows are 1152 bytes (a multiple of 128), so
  // chunk c of row r is stored at c ^ (r % 8): the 8 rows one ldmatrix reads hit 8 different
  // bank groups. 72 = 9 * 8, so the XOR stays inside the row.
  static constexpr int kChunks = kLatentDim / 8;
  static constexpr int kRawChunks = kDsMlaRowBytes / 16;  // 41 (fp8_ds_mla rows are 16-byte multiples)
  // Tiles in flight: bf16 K buffers (the rows land in the K tile itself), or fp8_ds_mla staging
  // buffers (dequantised into one bf16 K tile). More stages keep more gathered bytes in flight,
  // which is what the memory-bound small head tiles need.
  static constexpr int kStages = kStages_;
  static_assert(kStages >= 1 && kStages <= 3 && (kDsMla || kStages <= 2));
  static constexpr int kKBuffers = kDsMla ? 1 : kStages;
  // Key-validity slots: bf16 alternates two tiles; fp8_ds_mla has one per staging buffer plus
  // the copy that belongs to the K tile being computed.
  static constexpr int kValidSlots = kDsMla ? kStages + 1 : 2;

  // Shared-memory plan (bytes).
  static constexpr int kQBytes = kM * kChunks * 16;
  static constexpr int kKTileBytes = kN * kChunks * 16;
  static constexpr int kRawTileBytes = kN * kDsMlaRowBytes;
  static constexpr int kRawBytes = kDsMla ? kStages * kRawTileBytes : 0;  // fp8_ds_mla staging
  static constexpr int kPBytes = kM * kN * 2;                        // bf16 probabilities
  static constexpr int kRedBytes = kColGroups * kM * 4;              // per-warp row max / row sum
  static constexpr int kValidBytes = kValidSlots * kN * 4;           // per-key validity
  static constexpr int kKScaleBytes = kDsMla ? kN * 16 : 0;          // fp8_ds_mla: the K tile's 4 fp32 scales per key
  static constexpr int kRowExpBytes = kDsMla ? kM * 4 : 0;           // fp8_ds_mla: q row exponents (int)
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffRaw = kOffK + kKBuffers * kKTileBytes;
  static constexpr int kOffP = kOffRaw + kRawBytes;
  static constexpr int kOffRed = kOffP + kPBytes;
  static constexpr int kOffValid = kOffRed + kRedBytes;
  static constexpr int kOffKScale = kOffValid + kValidBytes;
  static constexpr int kOffRowExp = kOffKScale + kKScaleBytes;
  static constexpr int kSmemBytes = kOffRowExp + kRowExpBytes;
  static_assert(kOffRaw % 16 == 0 && kOffP % 16 == 0 && kOffRed % 16 == 0 && kOffKScale % 16 == 0);
};

// Byte offset of 16-byte chunk c of row r in a swizzled tile with kRowChunks chunks per row.
template <int kRowChunks>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>((r * kRowChunks + (c ^ (r & 7))) * 16);
}

__device__ __forceinline__ float sink_factor(float lse, float sink) {
  // e^lse / (e^lse + e^sink) = 1 / (1 + e^(sink - lse)); +inf sink -> 0, -inf sink -> 1.
  if (lse == -INFINITY) return 0.f;
  return 1.f / (1.f + expf(sink - lse));
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    sparse_decode_portable_kernel(const __grid_constant__ SparseDecodeParams p) {
  constexpr int kM = Cfg::kM, kN = Cfg::kN, kChunks = Cfg::kChunks;
  using KvT = typename Cfg::KvT;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* s_q = smem + Cfg::kOffQ;
  uint8_t* s_k = smem + Cfg::kOffK;
  uint8_t* s_raw = smem + Cfg::kOffRaw;
  uint8_t* s_p = smem + Cfg::kOffP;
  float* s_red = reinterpret_cast<float*>(smem + Cfg::kOffRed);         // [kColGroups][kM]
  int* s_valid = reinterpret_cast<int*>(smem + Cfg::kOffValid);         // [kValidSlots][kN]
  float* s_kscale = reinterpret_cast<float*>(smem + Cfg::kOffKScale);   // [kN][4] (fp8_ds_mla)
  int* s_row_exp = reinterpret_cast<int*>(smem + Cfg::kOffRowExp);      // [kM] (fp8_ds_mla)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int row_group = warp / Cfg::kColGroups, col_group = warp % Cfg::kColGroups;
  const int h0 = blockIdx.x * kM;
  const int split = blockIdx.y;
  const int bs = blockIdx.z, b = bs / p.s_q, s = bs % p.s_q;

  // Keys this CTA covers: [key_begin, key_end) of the top-k list; entries past topk_length
  // are invalid, so whole tiles past it are skipped.
  int num_keys = p.topk;
  if (p.topk_length != nullptr) num_keys = min(num_keys, max(p.topk_length[b], 0));
  const int total_tiles = (num_keys + kN - 1) / kN;
  const int tile_begin = split * p.tiles_per_split;
  const int num_tiles = max(0, min(total_tiles, tile_begin + p.tiles_per_split) - tile_begin);
  const int32_t* idx_row = p.indices + b * p.stride_indices_b + s * p.stride_indices_s;
  const uint8_t* cache = static_cast<const uint8_t*>(p.kv_cache);

  // ---- loaders (all 256 threads) --------------------------------------------------------
  // Q tile: kM heads x 72 chunks; heads past h_q are zero-filled, never read.
  auto load_q = [&]() {
    const auto* q = static_cast<const __nv_bfloat16*>(p.q) + b * p.stride_q_b + s * p.stride_q_s;
    for (int i = tid; i < kM * kChunks; i += Cfg::kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = h0 + r < p.h_q;
      const void* src = ok ? static_cast<const void*>(q + (h0 + r) * p.stride_q_h + 8 * c) : p.q;
      sm80::cp_async16(sm80::smem_addr(s_q + swz<kChunks>(r, c)), src, ok);
    }
  };
  // fp8_ds_mla: q rows in place to q' = q 2^-e_r, fp16 for kv_c (the e4m3 operand type) and bf16
  // for q_pe; e_r puts max |q_r| in [2^14, 2^15), so q' equals q but for values 2^-28 below the
  // row's largest (fp16 subnormals). 2^e_r goes into the row's softmax scale. Warp w takes rows
  // w, w + 8, ...: the row's lanes find its exponent and convert it, no barrier in between.
  auto prepare_q_fp16 = [&]() {
    for (int r = warp; r < kM; r += Cfg::kWarps) {
      uint4 v[3];
      float mx = 0.f;
#pragma unroll
      for (int j = 0; j < 3; ++j) {
        const int c = lane + 32 * j;
        if (c < kChunks) {
          v[j] = *reinterpret_cast<const uint4*>(s_q + swz<kChunks>(r, c));
          const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 f = __bfloat1622float2(h[k]);
            mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
          }
        }
      }
#pragma unroll
      for (int d = 16; d >= 1; d /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
      int e = 0;
      if (mx > 0.f && mx <= 3.0e38f) {
        frexpf(mx, &e);
        e = max(e - 15, -120);  // mx 2^-e in [2^14, 2^15); 2^-e stays a normal float
      }
      const float f = e4m3::pow2(-e);
#pragma unroll
      for (int j = 0; j < 3; ++j) {
        const int c = lane + 32 * j;
        if (c < kChunks) {
          const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
          uint32_t w[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 x = __bfloat1622float2(h[k]);
            w[k] = c < kKvLoraRank / 8 ? sm80::pack2<__half>(x.x * f, x.y * f) : sm80::pack2<__nv_bfloat16>(x.x * f, x.y * f);
          }
          *reinterpret_cast<uint4*>(s_q + swz<kChunks>(r, c)) = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
      if (lane == 0) s_row_exp[r] = e;
    }
  };
  // One tile of gathered rows: 4 threads per row, each issues its row's chunks part, part + 4, ...
  // so one thread computes one row address and keeps ~10-18 16-byte copies in flight.
  // Invalid keys (negative, past the cache, past topk_length) are zero-filled and never read.
  // Tiles are loaded in order; each thread's slot for the next tile is fetched one load ahead,
  // so the index read never stalls the issue of the row copies.
  const int load_row = tid / 4;
  auto fetch_slot = [&](int tile) -> int32_t {
    const int key = tile * kN + load_row;
    return key < num_keys ? idx_row[key] : -1;
  };
  int32_t next_slot = fetch_slot(tile_begin);
  auto load_tile = [&](int tile, uint8_t* dst, int valid_slot) {
    const int r = load_row, part = tid % 4;
    const int64_t slot = next_slot;
    next_slot = fetch_slot(tile + 1);
    const bool ok = slot >= 0 && slot < p.num_slots;
    if (part == 0) s_valid[valid_slot * kN + r] = ok;
    const uint8_t* row = ok ? cache + (slot / p.block_size) * p.stride_cache_block_bytes +
                                  (slot % p.block_size) * p.stride_cache_token_bytes
                            : cache;
    if constexpr (!Cfg::kDsMla) {
#pragma unroll
      for (int j = 0; j < kChunks / 4; ++j) {
        const int c = part + 4 * j;
        sm80::cp_async16(sm80::smem_addr(dst + swz<kChunks>(r, c)), row + 16 * c, ok);
      }
    } else {
#pragma unroll
      for (int j = 0; j < (Cfg::kRawChunks + 3) / 4; ++j) {
        const int c = part + 4 * j;
        if (c < Cfg::kRawChunks) {
          sm80::cp_async16(sm80::smem_addr(dst + r * kDsMlaRowBytes + 16 * c), row + 16 * c, ok);
        }
      }
    }
  };
  // fp8_ds_mla staging -> K tile: kv_c e4m3 -> fp16 (exact, one cvt per two values, no scale),
  // k_pe copied (bf16); the 4 tile scales per key go to s_kscale and are applied to the partial
  // scores and to P (see compute_tile). 40 work items per row: 32 chunks of 16 e4m3, then 8
  // chunks of k_pe.
  auto dequant_tile = [&](const uint8_t* s_stage) {
    for (int i = tid; i < kN * 40; i += Cfg::kThreads) {
      const int r = i / 40, c = i % 40;
      const uint8_t* raw = s_stage + r * kDsMlaRowBytes;
      if (c < 32) {
        const uint4 v = *reinterpret_cast<const uint4*>(raw + 16 * c);
        uint32_t h[8];
        e4m3::x4_to_f16x2x2(v.x, h[0], h[1]);
        e4m3::x4_to_f16x2x2(v.y, h[2], h[3]);
        e4m3::x4_to_f16x2x2(v.z, h[4], h[5]);
        e4m3::x4_to_f16x2x2(v.w, h[6], h[7]);
        *reinterpret_cast<uint4*>(s_k + swz<kChunks>(r, 2 * c)) = make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4*>(s_k + swz<kChunks>(r, 2 * c + 1)) = make_uint4(h[4], h[5], h[6], h[7]);
      } else {
        const int rc = c - 32;
        *reinterpret_cast<uint4*>(s_k + swz<kChunks>(r, 64 + rc)) =
            *reinterpret_cast<const uint4*>(raw + kDsMlaRopeOffset + 16 * rc);
      }
    }
    if (tid < kN) {
      reinterpret_cast<float4*>(s_kscale)[tid] = *reinterpret_cast<const float4*>(s_stage + tid * kDsMlaRowBytes + kDsMlaScaleOffset);
    }
  };

  // ---- per-warp state: 2 rows per thread (lane / 4 and lane / 4 + 8 of the warp's 16) -----
  float o[Cfg::kOTiles][4];
#pragma unroll
  for (int n = 0; n < Cfg::kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max, log2 domain (score * scale * log2 e)
  float l_run[2] = {0.f, 0.f};              // this thread's share of the row sum
  // fp8_ds_mla: R_v = running max |scale| of the v-th 128-wide tile of this warp's output columns;
  // O holds sum_k P[k] scale[k] / R_v * v8[k], rescaled when R_v grows (like the softmax max).
  float v_ref[Cfg::kVTiles];
#pragma unroll
  for (int v = 0; v < Cfg::kVTiles; ++v) v_ref[v] = 0.f;
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float row_scale[2] = {scale_log2, scale_log2};  // fp8_ds_mla: times 2^e of the row
  const int a_row = row_group * 16 + (lane % 16);  // ldmatrix row of the A operand (Q or P)
  const int a_chunk = lane / 16;
  const int bar_id = 1 + row_group;                // warps sharing rows sync on their own barrier
  constexpr int kBarThreads = 32 * Cfg::kColGroups;
  const int col0 = col_group * Cfg::kOutCols;      // this warp's first output column
  const int vt0 = col0 / 128;                      // fp8_ds_mla: its first scale tile

  // One 64-key tile: S = Q K^T on this warp's keys, online softmax with the row max shared
  // across the column groups, P to shared memory, O += P V on this warp's output columns.
  auto compute_tile = [&](const uint8_t* s_kt, int valid_slot) {
    const uint32_t q_base = sm80::smem_addr(s_q), k_base = sm80::smem_addr(s_kt), p_base = sm80::smem_addr(s_p);
    const int key0 = col_group * Cfg::kKeysPerWarp;
    // One 16-dim k-step (chunks 2 kk, 2 kk + 1) of acc += Q K^T in operand type T.
    auto qk_step = [&](auto type_tag, float (&acc)[Cfg::kSTiles][4], int kk) {
      using T = decltype(type_tag);
      uint32_t a[4];
      sm80::ldmatrix_x4(a, q_base + swz<kChunks>(a_row, 2 * kk + a_chunk));
      if constexpr (Cfg::kSTiles == 1) {
        uint32_t bk[2];
        sm80::ldmatrix_x2(bk, k_base + swz<kChunks>(key0 + lane % 8, 2 * kk + (lane / 8) % 2));
        sm80::mma_16816<T>(acc[0], a, bk[0], bk[1]);
      } else {
#pragma unroll
        for (int n16 = 0; n16 < Cfg::kSTiles / 2; ++n16) {
          uint32_t bk[4];
          const int key = key0 + 16 * n16 + (lane / 16) * 8 + lane % 8;
          sm80::ldmatrix_x4(bk, k_base + swz<kChunks>(key, 2 * kk + (lane / 8) % 2));
          sm80::mma_16816<T>(acc[2 * n16], a, bk[0], bk[1]);
          sm80::mma_16816<T>(acc[2 * n16 + 1], a, bk[2], bk[3]);
        }
      }
    };
    float sc[Cfg::kSTiles][4];
#pragma unroll
    for (int j = 0; j < Cfg::kSTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
    constexpr int kC = Cfg::kChains;
    if constexpr (!Cfg::kDsMla) {
      // 36 bf16 k-steps over kC independent accumulators.
      float acc[kC][Cfg::kSTiles][4];
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int j = 0; j < Cfg::kSTiles; ++j) acc[c][j][0] = acc[c][j][1] = acc[c][j][2] = acc[c][j][3] = 0.f;
#pragma unroll 2
      for (int kk = 0; kk < kChunks / 2; kk += kC) {
#pragma unroll
        for (int c = 0; c < kC; ++c) qk_step(__nv_bfloat16{}, acc[c], kk + c);
      }
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int j = 0; j < Cfg::kSTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[j][e] += acc[c][j][e];
    } else {
      // kv_c: 4 scale tiles of 128 dims (8 fp16 k-steps each), kC tiles at a time in independent
      // accumulators; each partial times its key's fp32 tile scale. Then k_pe (4 bf16 k-steps,
      // unscaled) accumulates on top.
#pragma unroll
      for (int t0 = 0; t0 < 4; t0 += kC) {
        float acc[kC][Cfg::kSTiles][4];
#pragma unroll
        for (int c = 0; c < kC; ++c)
#pragma unroll
          for (int j = 0; j < Cfg::kSTiles; ++j) acc[c][j][0] = acc[c][j][1] = acc[c][j][2] = acc[c][j][3] = 0.f;
#pragma unroll 2
        for (int st = 0; st < 8; ++st) {
#pragma unroll
          for (int c = 0; c < kC; ++c) qk_step(__half{}, acc[c], 8 * (t0 + c) + st);
        }
#pragma unroll
        for (int c = 0; c < kC; ++c) {
#pragma unroll
          for (int j = 0; j < Cfg::kSTiles; ++j) {
            const int key = key0 + 8 * j + 2 * (lane % 4);
            const float s0 = s_kscale[4 * key + t0 + c], s1 = s_kscale[4 * (key + 1) + t0 + c];
            sc[j][0] = fmaf(acc[c][j][0], s0, sc[j][0]);
            sc[j][1] = fmaf(acc[c][j][1], s1, sc[j][1]);
            sc[j][2] = fmaf(acc[c][j][2], s0, sc[j][2]);
            sc[j][3] = fmaf(acc[c][j][3], s1, sc[j][3]);
          }
        }
      }
#pragma unroll
      for (int kk = kKvLoraRank / 16; kk < kChunks / 2; ++kk) qk_step(__nv_bfloat16{}, sc, kk);
    }
    // Mask with selects (never multiply: a masked score must not turn into NaN), scale.
    const int* valid = s_valid + valid_slot * kN;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < Cfg::kSTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 8 * j + 2 * (lane % 4) + (e & 1);
        sc[j][e] = valid[key] ? sc[j][e] * row_scale[e / 2] : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], sc[j][e]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    }
    const int r0 = row_group * 16 + lane / 4;
    if (lane % 4 == 0) {
      s_red[col_group * kM + r0] = mx[0];
      s_red[col_group * kM + r0 + 8] = mx[1];
    }
    // fp8_ds_mla: R_v of this warp's scale tiles (no shared data written: overlaps the barrier).
    float v_rescale[Cfg::kVTiles], v_inv[Cfg::kVTiles];
#pragma unroll
    for (int v = 0; v < Cfg::kVTiles; ++v) {
      v_rescale[v] = 1.f;
      v_inv[v] = 1.f;
      if constexpr (Cfg::kDsMla) {
        float tmax = fmaxf(fabsf(s_kscale[4 * lane + vt0 + v]), fabsf(s_kscale[4 * (lane + 32) + vt0 + v]));
#pragma unroll
        for (int d = 16; d >= 1; d /= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, d));
        const float r_new = fmaxf(v_ref[v], tmax);
        v_rescale[v] = v_ref[v] > 0.f ? v_ref[v] / r_new : 1.f;
        v_inv[v] = r_new > 0.f ? 1.f / r_new : 0.f;
        v_ref[v] = r_new;
      }
    }
    sm80::named_barrier(bar_id, kBarThreads);
    float m_use[2], corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int g = 0; g < Cfg::kColGroups; ++g) tile_max = fmaxf(tile_max, s_red[g * kM + r0 + 8 * i]);
      const float m_new = fmaxf(m_run[i], tile_max);
      m_use[i] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: exp2(-inf - 0) = 0
      corr[i] = exp2f(m_run[i] - m_use[i]);
      m_run[i] = m_new;
      l_run[i] *= corr[i];
    }
#pragma unroll
    for (int j = 0; j < Cfg::kSTiles; ++j) {
      const float p0 = exp2f(sc[j][0] - m_use[0]), p1 = exp2f(sc[j][1] - m_use[0]);
      const float p2 = exp2f(sc[j][2] - m_use[1]), p3 = exp2f(sc[j][3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int key = key0 + 8 * j + 2 * (lane % 4);
      const uint32_t in_chunk = (key % 8) * 2;
      *reinterpret_cast<uint32_t*>(s_p + swz<kN / 8>(r0, key / 8) + in_chunk) = sm80::pack2<KvT>(p0, p1);
      *reinterpret_cast<uint32_t*>(s_p + swz<kN / 8>(r0 + 8, key / 8) + in_chunk) = sm80::pack2<KvT>(p2, p3);
    }
    // Most tiles change neither the row maxima nor R: skip the multiplies then.
    bool unit = corr[0] == 1.f && corr[1] == 1.f;
#pragma unroll
    for (int v = 0; v < Cfg::kVTiles; ++v) unit = unit && v_rescale[v] == 1.f;
    if (!__all_sync(0xffffffffu, unit)) {
#pragma unroll
      for (int n = 0; n < Cfg::kOTiles; ++n) {
        const float vr = v_rescale[n / Cfg::kOTilesPerV];
        o[n][0] *= corr[0] * vr;
        o[n][1] *= corr[0] * vr;
        o[n][2] *= corr[1] * vr;
        o[n][3] *= corr[1] * vr;
      }
    }
    sm80::named_barrier(bar_id, kBarThreads);  // P of all column groups written
    // O += P V: V is the first 512 columns of the same rows, read transposed by ldmatrix.
    // fp8_ds_mla: A = P' = P scale[k, tile] / R in fp16 (|P'| <= 1), per scale tile.
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t a[Cfg::kVTiles][4];
      sm80::ldmatrix_x4(a[0], p_base + swz<kN / 8>(a_row, 2 * kk + a_chunk));
      if constexpr (Cfg::kDsMla) {
        const uint32_t pa[4] = {a[0][0], a[0][1], a[0][2], a[0][3]};
        const int k = 16 * kk + 2 * (lane % 4);  // a[.][0/1]: keys k, k + 1; a[.][2/3]: keys k + 8, k + 9
#pragma unroll
        for (int v = 0; v < Cfg::kVTiles; ++v) {
          const float* ks = s_kscale + 4 * k + vt0 + v;
          const __half2 s01 = __floats2half2_rn(ks[0] * v_inv[v], ks[4] * v_inv[v]);
          const __half2 s89 = __floats2half2_rn(ks[32] * v_inv[v], ks[36] * v_inv[v]);
          a[v][0] = e4m3::hmul2_bits(pa[0], s01);
          a[v][1] = e4m3::hmul2_bits(pa[1], s01);
          a[v][2] = e4m3::hmul2_bits(pa[2], s89);
          a[v][3] = e4m3::hmul2_bits(pa[3], s89);
        }
      }
      const int key = 16 * kk + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int n16 = 0; n16 < Cfg::kOTiles / 2; ++n16) {
        uint32_t bv[4];
        const int v = (2 * n16) / Cfg::kOTilesPerV;
        sm80::ldmatrix_x4_trans(bv, k_base + swz<kChunks>(key, (col0 + 16 * n16) / 8 + lane / 16));
        sm80::mma_16816<KvT>(o[2 * n16], a[v], bv[0], bv[1]);
        sm80::mma_16816<KvT>(o[2 * n16 + 1], a[v], bv[2], bv[3]);
      }
    }
  };

  // ---- main loop ------------------------------------------------------------------------
  if constexpr (!Cfg::kDsMla) {
    if (num_tiles > 0) load_q();
    // bf16 rows go straight into the K buffers; kStages - 1 tiles are in flight during compute.
    constexpr int kS = Cfg::kStages;
#pragma unroll
    for (int i = 0; i < kS - 1; ++i) {
      if (i < num_tiles) load_tile(tile_begin + i, s_k + i * Cfg::kKTileBytes, i & 1);
      sm80::cp_async_commit();
    }
    for (int t = 0; t < num_tiles; ++t) {
      const int next = t + kS - 1;
      if (next < num_tiles) load_tile(tile_begin + next, s_k + (next % kS) * Cfg::kKTileBytes, next & 1);
      sm80::cp_async_commit();
      sm80::cp_async_wait<kS - 1>();
      __syncthreads();  // tile t visible to all warps
      compute_tile(s_k + (t % kS) * Cfg::kKTileBytes, t & 1);
      __syncthreads();  // everyone done with buffer t % kS before it is refilled
    }
  } else {
    // fp8_ds_mla: kStages tiles land in staging buffers while earlier tiles compute; each is
    // converted into the one fp16 K buffer just before its math. Q has its own cp.async group:
    // it is converted to fp16 while the first tiles are still in flight.
    constexpr int kS = Cfg::kStages;
    constexpr int kKValid = kS;  // validity slot of the K tile
    if (num_tiles > 0) load_q();
    sm80::cp_async_commit();
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      if (i < num_tiles) load_tile(tile_begin + i, s_raw + i * Cfg::kRawTileBytes, i);
      sm80::cp_async_commit();
    }
    if (num_tiles > 0) {
      sm80::cp_async_wait<kS>();  // this thread's Q chunks
      __syncthreads();            // everyone's
      prepare_q_fp16();
      __syncthreads();
      const int r0 = row_group * 16 + lane / 4;
      row_scale[0] = ldexpf(scale_log2, s_row_exp[r0]);
      row_scale[1] = ldexpf(scale_log2, s_row_exp[r0 + 8]);
    }
    for (int t = 0; t < num_tiles; ++t) {
      const int stage = t % kS;
      sm80::cp_async_wait<kS - 1>();
      __syncthreads();  // staging `stage` holds tile t; tile t - 1's math is done, K is free
      dequant_tile(s_raw + stage * Cfg::kRawTileBytes);
      if (tid < kN) s_valid[kKValid * kN + tid] = s_valid[stage * kN + tid];
      __syncthreads();  // K holds tile t; staging `stage` is free
      if (t + kS < num_tiles) load_tile(tile_begin + t + kS, s_raw + stage * Cfg::kRawTileBytes, stage);
      sm80::cp_async_commit();
      compute_tile(s_k, kKValid);
    }
  }

  // ---- epilogue -------------------------------------------------------------------------
  // Row sums: the 4 lanes of a row, then the column groups (same max, so plain sums).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
  }
  const int r0 = row_group * 16 + lane / 4;
  if (lane % 4 == 0) {
    s_red[col_group * kM + r0] = l_run[0];
    s_red[col_group * kM + r0 + 8] = l_run[1];
  }
  sm80::named_barrier(bar_id, kBarThreads);
  const int out_col0 = col0 + 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int h = h0 + r0 + 8 * i;
    float l_total = 0.f;
#pragma unroll
    for (int g = 0; g < Cfg::kColGroups; ++g) l_total += s_red[g * kM + r0 + 8 * i];
    if (h >= p.h_q) continue;
    const bool any = l_total > 0.f;
    const float inv = any ? 1.f / l_total : 0.f;
    const float lse = any ? (m_run[i] + log2f(l_total)) * 0.6931471805599453f : -INFINITY;
    // Per output tile: 1 / l, times R_v (fp8_ds_mla), times the sink factor (unsplit only).
    float f[Cfg::kVTiles];
    const float sink = p.num_splits == 1 && p.attn_sink != nullptr ? sink_factor(lse, p.attn_sink[h]) : 1.f;
#pragma unroll
    for (int v = 0; v < Cfg::kVTiles; ++v) f[v] = inv * sink * (Cfg::kDsMla ? v_ref[v] : 1.f);
    if (p.num_splits == 1) {
      auto* out = static_cast<__nv_bfloat16*>(p.out) + ((int64_t(bs) * p.h_q + h) * kKvLoraRank + out_col0);
#pragma unroll
      for (int n = 0; n < Cfg::kOTiles; ++n) {
        const float fn = f[n / Cfg::kOTilesPerV];
        *reinterpret_cast<__nv_bfloat162*>(out + 8 * n) = __floats2bfloat162_rn(o[n][2 * i] * fn, o[n][2 * i + 1] * fn);
      }
      if (col_group == 0 && lane % 4 == 0) p.lse[(int64_t(b) * p.h_q + h) * p.s_q + s] = lse;
    } else {
      const int64_t row = (int64_t(split) * p.batch * p.s_q + bs) * p.h_q + h;
      float* out = p.partial_out + row * kKvLoraRank + out_col0;
#pragma unroll
      for (int n = 0; n < Cfg::kOTiles; ++n) {
        const float fn = f[n / Cfg::kOTilesPerV];
        *reinterpret_cast<float2*>(out + 8 * n) = make_float2(o[n][2 * i] * fn, o[n][2 * i + 1] * fn);
      }
      if (col_group == 0 && lane % 4 == 0) p.partial_lse[row] = lse;
    }
  }
}


template <int kM, CacheFormat kFormat, int kStages>
void launch_sparse_decode_portable(const SparseDecodeParams& p) {
  using Cfg = PortableConfig<kM, kFormat, kStages>;
  auto kernel = sparse_decode_portable_kernel<Cfg>;
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const dim3 grid((p.h_q + kM - 1) / kM, p.num_splits, p.batch * p.s_q);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

template <int kM, CacheFormat kFormat, int kStages>
constexpr int portable_smem_bytes() {
  return PortableConfig<kM, kFormat, kStages>::kSmemBytes;
}

}  // namespace mla::sparse
