// Sparse top-k MLA decode, portable path (mma.sync + cp.async; sm80 .. sm100).
//
// One CTA = one query token (b, s), one tile of kM heads, one split of the top-k list.
// grid = (ceil(h_q / kM), num_splits, b * s_q); 256 threads = 8 warps.
// See csrc/sparse/README.md for the warp roles and the bytes each tile reads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "common/cuda_check.h"
#include "common/types.h"
#include "common/sm80.cuh"
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
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffRaw = kOffK + kKBuffers * kKTileBytes;
  static constexpr int kOffP = kOffRaw + kRawBytes;
  static constexpr int kOffRed = kOffP + kPBytes;
  static constexpr int kOffValid = kOffRed + kRedBytes;
  static constexpr int kSmemBytes = kOffValid + kValidBytes;
  static_assert(kOffRaw % 16 == 0 && kOffP % 16 == 0 && kOffRed % 16 == 0);
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
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* s_q = smem + Cfg::kOffQ;
  uint8_t* s_k = smem + Cfg::kOffK;
  uint8_t* s_raw = smem + Cfg::kOffRaw;
  uint8_t* s_p = smem + Cfg::kOffP;
  float* s_red = reinterpret_cast<float*>(smem + Cfg::kOffRed);     // [kColGroups][kM]
  int* s_valid = reinterpret_cast<int*>(smem + Cfg::kOffValid);     // [kValidSlots][kN]

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
  // fp8_ds_mla staging -> bf16 K tile: kv_c e4m3 * its tile's fp32 scale (any finite value), k_pe
  // copied. 40 work items per row: 32 chunks of 16 e4m3, then 8 chunks of k_pe.
  auto dequant_tile = [&](const uint8_t* s_stage) {
    for (int i = tid; i < kN * 40; i += Cfg::kThreads) {
      const int r = i / 40, c = i % 40;
      const uint8_t* raw = s_stage + r * kDsMlaRowBytes;
      if (c < 32) {
        const uint4 v = *reinterpret_cast<const uint4*>(raw + 16 * c);
        const float scale = *reinterpret_cast<const float*>(raw + kDsMlaScaleOffset + 4 * (c / 8));
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        uint32_t packed[8];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
            const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
            packed[2 * w + h] = sm80::pack2<__nv_bfloat16>(f.x * scale, f.y * scale);
          }
        }
        *reinterpret_cast<uint4*>(s_k + swz<kChunks>(r, 2 * c)) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        *reinterpret_cast<uint4*>(s_k + swz<kChunks>(r, 2 * c + 1)) = make_uint4(packed[4], packed[5], packed[6], packed[7]);
      } else {
        const int rc = c - 32;
        *reinterpret_cast<uint4*>(s_k + swz<kChunks>(r, 64 + rc)) =
            *reinterpret_cast<const uint4*>(raw + kDsMlaRopeOffset + 16 * rc);
      }
    }
  };

  // ---- per-warp state: 2 rows per thread (lane / 4 and lane / 4 + 8 of the warp's 16) -----
  float o[Cfg::kOTiles][4];
#pragma unroll
  for (int n = 0; n < Cfg::kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max, log2 domain (score * scale * log2 e)
  float l_run[2] = {0.f, 0.f};              // this thread's share of the row sum
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const int a_row = row_group * 16 + (lane % 16);  // ldmatrix row of the A operand (Q or P)
  const int a_chunk = lane / 16;
  const int bar_id = 1 + row_group;                // warps sharing rows sync on their own barrier
  constexpr int kBarThreads = 32 * Cfg::kColGroups;

  // One 64-key tile: S = Q K^T on this warp's keys, online softmax with the row max shared
  // across the column groups, P to shared memory, O += P V on this warp's output columns.
  auto compute_tile = [&](const uint8_t* s_kt, int valid_slot) {
    const uint32_t q_base = sm80::smem_addr(s_q), k_base = sm80::smem_addr(s_kt), p_base = sm80::smem_addr(s_p);
    float sc[Cfg::kSTiles][4];
#pragma unroll
    for (int j = 0; j < Cfg::kSTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
    const int key0 = col_group * Cfg::kKeysPerWarp;
#pragma unroll 4
    for (int kk = 0; kk < kChunks / 2; ++kk) {
      uint32_t a[4];
      sm80::ldmatrix_x4(a, q_base + swz<kChunks>(a_row, 2 * kk + a_chunk));
      if constexpr (Cfg::kSTiles == 1) {
        uint32_t bk[2];
        sm80::ldmatrix_x2(bk, k_base + swz<kChunks>(key0 + lane % 8, 2 * kk + (lane / 8) % 2));
        sm80::mma_16816<__nv_bfloat16>(sc[0], a, bk[0], bk[1]);
      } else {
#pragma unroll
        for (int n16 = 0; n16 < Cfg::kSTiles / 2; ++n16) {
          uint32_t bk[4];
          const int key = key0 + 16 * n16 + (lane / 16) * 8 + lane % 8;
          sm80::ldmatrix_x4(bk, k_base + swz<kChunks>(key, 2 * kk + (lane / 8) % 2));
          sm80::mma_16816<__nv_bfloat16>(sc[2 * n16], a, bk[0], bk[1]);
          sm80::mma_16816<__nv_bfloat16>(sc[2 * n16 + 1], a, bk[2], bk[3]);
        }
      }
    }
    // Mask with selects (never multiply: a masked score must not turn into NaN), scale.
    const int* valid = s_valid + valid_slot * kN;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < Cfg::kSTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 8 * j + 2 * (lane % 4) + (e & 1);
        sc[j][e] = valid[key] ? sc[j][e] * scale_log2 : -INFINITY;
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
      *reinterpret_cast<uint32_t*>(s_p + swz<kN / 8>(r0, key / 8) + in_chunk) = sm80::pack2<__nv_bfloat16>(p0, p1);
      *reinterpret_cast<uint32_t*>(s_p + swz<kN / 8>(r0 + 8, key / 8) + in_chunk) = sm80::pack2<__nv_bfloat16>(p2, p3);
    }
#pragma unroll
    for (int n = 0; n < Cfg::kOTiles; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
    sm80::named_barrier(bar_id, kBarThreads);  // P of all column groups written
    // O += P V: V is the first 512 columns of the same rows, read transposed by ldmatrix.
    const int col0 = col_group * Cfg::kOutCols;
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t a[4];
      sm80::ldmatrix_x4(a, p_base + swz<kN / 8>(a_row, 2 * kk + a_chunk));
      const int key = 16 * kk + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int n16 = 0; n16 < Cfg::kOTiles / 2; ++n16) {
        uint32_t bv[4];
        sm80::ldmatrix_x4_trans(bv, k_base + swz<kChunks>(key, (col0 + 16 * n16) / 8 + lane / 16));
        sm80::mma_16816<__nv_bfloat16>(o[2 * n16], a, bv[0], bv[1]);
        sm80::mma_16816<__nv_bfloat16>(o[2 * n16 + 1], a, bv[2], bv[3]);
      }
    }
  };

  // ---- main loop ------------------------------------------------------------------------
  if (num_tiles > 0) load_q();
  if constexpr (!Cfg::kDsMla) {
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
    // dequantised into the one bf16 K buffer just before its math.
    constexpr int kS = Cfg::kStages;
    constexpr int kKValid = kS;  // validity slot of the K tile
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      if (i < num_tiles) load_tile(tile_begin + i, s_raw + i * Cfg::kRawTileBytes, i);
      sm80::cp_async_commit();
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
  const int col0 = col_group * Cfg::kOutCols + 2 * (lane % 4);
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
    if (p.num_splits == 1) {
      const float f = inv * (p.attn_sink != nullptr ? sink_factor(lse, p.attn_sink[h]) : 1.f);
      auto* out = static_cast<__nv_bfloat16*>(p.out) + ((int64_t(bs) * p.h_q + h) * kKvLoraRank + col0);
#pragma unroll
      for (int n = 0; n < Cfg::kOTiles; ++n) {
        *reinterpret_cast<__nv_bfloat162*>(out + 8 * n) = __floats2bfloat162_rn(o[n][2 * i] * f, o[n][2 * i + 1] * f);
      }
      if (col_group == 0 && lane % 4 == 0) p.lse[(int64_t(b) * p.h_q + h) * p.s_q + s] = lse;
    } else {
      const int64_t row = (int64_t(split) * p.batch * p.s_q + bs) * p.h_q + h;
      float* out = p.partial_out + row * kKvLoraRank + col0;
#pragma unroll
      for (int n = 0; n < Cfg::kOTiles; ++n) {
        *reinterpret_cast<float2*>(out + 8 * n) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
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
