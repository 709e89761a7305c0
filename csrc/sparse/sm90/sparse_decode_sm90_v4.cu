// DeepSeek-V4 sparse decode on sm90a, fused: fp8_ds_mla pools (584-byte tokens), 64-head tiles, wgmma.
//
// Contract of sparse_decode_mla_v4 (mla_ext/reference.py; csrc/sparse/README.md, "DeepSeek-V4"): query
// token (b, s) attends to the entries of two lists, the main cache's `indices[b, s, :topk]` and the
// extra cache's `extra_indices[b, s, :extra_topk]`, in one softmax; heads are 512 wide (448 NoPE + 64
// RoPE), the value is the whole row. An entry counts when its position is below its list's length and
// its slot is inside its cache.
//
// Grid and plan as the V3 kernels (plan_sparse_decode, split combine): one CTA = one query token, 64
// heads, one split of its tiles; 256 threads = two warpgroups. A token's tiles are the main list's
// counted entries in 64-key tiles, then the extra list's (a tile never mixes the pools). Per tile:
//
//   gather    lanes 0-7 of every warp: one cp.async.bulk of the row's 576-byte data part (an
//             mbarrier counts 64 arrivals and the bytes) and an 8-byte cp.async of its UE8M0 scales;
//             invalid rows zero-filled by their thread. Issued once the tile before has its S MMAs
//             committed, so the copies run under them.
//   dequant   all threads: e4m3 x 2^(scale - 127) -> bf16 (exact) and the bf16 RoPE dims into one
//             [64 keys][512 dims] K tile, 8 blocks of [64][64] in the 128-byte swizzle.
//   S = Q K^T warpgroup g takes dims 256 g .. + 255 (16 wgmma m64n64k16, both operands in shared
//             memory); the two partial S meet through shared memory, so both warpgroups hold the
//             full S and run the same softmax (a row's 64 keys sit in one quad of lanes).
//   O += P V  warpgroup g owns output dims 256 g .. + 255 (2 x 64 fp32 per thread); A = P in bf16
//             from the softmax registers, B = the K tile read MN-major (the value is the key row).
//
// The structure is that of the V3 fp8_ds_mla kernel (sparse_decode_sm90_fp8.cu), with its wgmma
// wrappers (common/sm90/wgmma.cuh) and its S exchange, softmax and epilogue (m64_tile.cuh). V4
// needs no scale accumulators: a scale is a power of two per 64 dims, so the dequantised tile is
// exact in bf16 and S and P V run on it as on a bf16 cache.
#include <cuda_bf16.h>

#include <cmath>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/e4m3.cuh"
#include "common/mbarrier.cuh"
#include "common/pdl.cuh"
#include "common/sm80.cuh"
#include "common/sm90/wgmma.cuh"
#include "common/types.h"
#include "sparse/portable/sparse_decode_portable.cuh"  // fetch_slot_ahead
#include "sparse/sm90/m64_tile.cuh"
#include "sparse/v4_decode.h"

namespace mla {
// (Named, not anonymous: its members are unused in the targets without the kernel body.)
namespace v4_fused {

struct V4Config {
  static constexpr int kM = 64;         // heads per CTA
  static constexpr int kN = 64;         // keys per tile
  static constexpr int kThreads = 256;  // 2 warpgroups
  static constexpr int kBlockBytes = 64 * 128;             // [64 rows][64 dims] bf16, one swizzle block
  static constexpr int kTileBytes = 8 * kBlockBytes;       // 512 dims
  static constexpr int kRawBytes = kN * kV4DataBytes;      // one staging tile of 576-byte data parts
  static constexpr int kScaleBytes = kN * 8;               // their scale parts (7 UE8M0 and a pad byte)
  static constexpr int kRedBytes = 2 * 32 * 128 * 4;       // partial S: [warpgroup][32 values][128 threads] fp32
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kTileBytes;
  static constexpr int kOffRaw = kOffK + kTileBytes;
  static constexpr int kOffScale = kOffRaw + kRawBytes;
  static constexpr int kOffRed = kOffScale + kScaleBytes;
  static constexpr int kOffValid = kOffRed + kRedBytes;    // [2][64] int: tiles alternate (gather of t + 1 during t)
  static constexpr int kOffBar = kOffValid + 2 * kN * 4;   // mbarrier of the staging tile
  // + 1 KiB so that the base can be rounded up to the 1024 bytes the swizzle atoms need
  static constexpr int kSmemBytes = kOffBar + 8 + 1024;
  static_assert(kOffK % 1024 == 0 && kOffRaw % 16 == 0 && kOffScale % 16 == 0 && kOffRed % 16 == 0 && kOffBar % 8 == 0,
                "alignment");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90");
  static constexpr int kNopeChunks = kV4NopeDim / 8;                 // 16-byte chunks (8 bf16 dims) of NoPE: 56
  static constexpr int kRopeChunks = (kV4HeadDim - kV4NopeDim) / 8;  // and of RoPE: 8

  // Byte offset of 16-byte chunk c (8 dims, 0..63) of row r in the Q or K tile: block c / 8, row r
  // of 128 bytes, chunk c % 8 XOR-swizzled by r % 8 (the wgmma descriptors' 128-byte swizzle on
  // 1024-byte aligned blocks).
  __device__ __forceinline__ static uint32_t sw128_off(int r, int c) {
    return static_cast<uint32_t>((c / 8) * kBlockBytes + r * 128 + (((c % 8) ^ (r % 8)) * 16));
  }
};

}  // namespace v4_fused
namespace {
using v4_fused::V4Config;

__global__ void __launch_bounds__(V4Config::kThreads, 1)
    sparse_decode_sm90_v4_kernel(const __grid_constant__ V4FusedParams fp) {
#if MLA_SM90A
  using Cfg = V4Config;
  constexpr int kN = Cfg::kN;
  const SparseDecodeParams& p = fp.sparse;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = sm90::align_to_swizzle_atom(smem_raw);
  uint8_t* s_q = smem + Cfg::kOffQ;
  uint8_t* s_k = smem + Cfg::kOffK;
  uint8_t* s_raw = smem + Cfg::kOffRaw;
  uint8_t* s_scale = smem + Cfg::kOffScale;
  float* s_red = reinterpret_cast<float*>(smem + Cfg::kOffRed);
  int* s_valid = reinterpret_cast<int*>(smem + Cfg::kOffValid);
  const uint32_t bar = sm80::smem_addr(smem + Cfg::kOffBar);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // warpgroup (through a shuffle, so that the compiler knows it is warp-uniform and keeps the
  // wgmma descriptors derived from it in uniform registers), thread and warp within it
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), tid_wg = tid % 128, wq = warp % 4;
  const int qd = lane % 4;
  const int h0 = blockIdx.x * Cfg::kM;
  // A programmatic dependent, as the V3 kernels (common/pdl.cuh).
  pdl_wait_prerequisites();
  pdl_launch_dependents();

  // ---- this CTA's work: query token, split, tiles (as cta_work, over both lists) ---------------
  const int z = blockIdx.z;
  const bool whole = p.num_splits == 1 || z < p.split_from;
  int bs, split = 0;
  int64_t partial_row0 = 0;
  if (whole) {
    bs = z;
  } else {
    const int t = z - p.split_from;
    bs = p.split_from + t / p.num_splits, split = t % p.num_splits;
    partial_row0 = (int64_t(split) * (p.batch * p.s_q - p.split_from) + (bs - p.split_from)) * p.h_q;
  }
  const int b = bs / p.s_q, s = bs % p.s_q;
  int num_keys[2];        // counted entries of each list
  const int32_t* idx_row[2];
#pragma unroll
  for (int sel = 0; sel < 2; ++sel) {
    const V4Pool& pool = fp.pool[sel];
    int n = pool.topk;
    if (n > 0 && pool.lengths != nullptr) n = min(n, max(pool.lengths[b], 0));
    num_keys[sel] = n;
    idx_row[sel] = n > 0 ? pool.indices + b * pool.stride_indices_b + s * pool.stride_indices_s : nullptr;
  }
  const int main_tiles = (num_keys[0] + kN - 1) / kN;
  const int total_tiles = main_tiles + (num_keys[1] + kN - 1) / kN;
  const int tile_begin = whole ? 0 : split * p.tiles_per_split;
  const int num_tiles = whole ? total_tiles : max(0, min(total_tiles, tile_begin + p.tiles_per_split) - tile_begin);

  // ---- loaders ------------------------------------------------------------------------------
  // Q: 64 heads x 64 chunks by cp.async; heads past h_q zero-filled (their rows are never written).
  auto load_q = [&]() {
    const auto* q = static_cast<const __nv_bfloat16*>(p.q) + b * p.stride_q_b + s * p.stride_q_s;
    for (int i = tid; i < Cfg::kM * 64; i += Cfg::kThreads) {
      const int r = i / 64, c = i % 64;
      const bool ok = h0 + r < p.h_q;
      const void* src = ok ? static_cast<const void*>(q + (h0 + r) * p.stride_q_h + 8 * c) : p.q;
      sm80::cp_async16(sm80::smem_addr(s_q + Cfg::sw128_off(r, c)), src, ok);
    }
  };
  // Row gather: lane l < 8 of warp w copies row 8 w + l (a warp issues its bulk copies one lane after
  // the other). Each lane's slot of the next tile is fetched after its copies (fetch_slot_ahead).
  constexpr int kBulkLanes = kN / (Cfg::kThreads / 32);
  const bool bulk_lane = lane < kBulkLanes;
  const int load_row = kBulkLanes * warp + lane;
  int next_pool = 0;
  auto fetch_slot = [&](int tile) {
    next_pool = tile >= main_tiles;
    const int key = (tile - (next_pool ? main_tiles : 0)) * kN + load_row;
    return sparse::fetch_slot_ahead(idx_row[next_pool], key, num_keys[next_pool]);
  };
  int32_t next_slot = bulk_lane ? fetch_slot(tile_begin) : -1;
  auto load_tile = [&](int tile, int valid_slot) {
    if (bulk_lane) {
      const V4Pool& pool = fp.pool[next_pool];
      const int32_t slot = next_slot;
      const bool ok = slot >= 0 && slot < pool.num_slots;
      s_valid[valid_slot * kN + load_row] = ok;
      uint8_t* dst = s_raw + load_row * kV4DataBytes;
      uint8_t* dst_scale = s_scale + load_row * 8;
      if (ok) {
        // Pages are block_size rows of 576 bytes, then block_size scale parts of 8 bytes.
        const int64_t page = slot / pool.block_size, row = slot % pool.block_size;
        const uint8_t* base = static_cast<const uint8_t*>(pool.cache) + page * pool.stride_block_bytes;
        mbar_arrive_expect_tx(bar, kV4DataBytes);
        bulk_load(sm80::smem_addr(dst), base + row * kV4DataBytes, kV4DataBytes, bar);
        sm80::cp_async_ca<8>(sm80::smem_addr(dst_scale), base + pool.block_size * kV4DataBytes + row * 8);
      } else {
        // Zeros: the dequantised row must stay finite (P = 0 times V must be 0).
#pragma unroll 1
        for (int c = 0; c < kV4DataBytes / 16; ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint2*>(dst_scale) = make_uint2(0u, 0u);
        mbar_arrive(bar);
      }
      sm80::cp_async_commit();
      next_slot = fetch_slot(tile + 1);
    }
  };
  // Staging -> K tile: 64 rows x 56 NoPE chunks (14 per thread), then the RoPE dims as they are.
  auto dequant_tile = [&]() {
#pragma unroll 2
    for (int i = 0; i < kN * Cfg::kNopeChunks / Cfg::kThreads; ++i) {
      const int j = tid + Cfg::kThreads * i, r = j / Cfg::kNopeChunks, c = j % Cfg::kNopeChunks;
      const uint2 w = *reinterpret_cast<const uint2*>(s_raw + r * kV4DataBytes + 8 * c);
      const float scale = e4m3::ue8m0_to_float(s_scale[r * 8 + c / 8]);
      *reinterpret_cast<uint4*>(s_k + Cfg::sw128_off(r, c)) = e4m3::x8_scaled_to_bf16x8(w, scale);
    }
#pragma unroll
    for (int i = 0; i < kN * Cfg::kRopeChunks / Cfg::kThreads; ++i) {
      const int j = tid + Cfg::kThreads * i, r = j / Cfg::kRopeChunks, c = j % Cfg::kRopeChunks;
      *reinterpret_cast<uint4*>(s_k + Cfg::sw128_off(r, Cfg::kNopeChunks + c)) =
          *reinterpret_cast<const uint4*>(s_raw + r * kV4DataBytes + kV4NopeDim + 16 * c);
    }
  };
  static_assert(kN * Cfg::kNopeChunks % Cfg::kThreads == 0 && kN * Cfg::kRopeChunks % Cfg::kThreads == 0, "dequant: equal shares");

  // ---- per-thread state --------------------------------------------------------------------
  // Accumulator layout (m64nN, both S and O): element 4 i + e of a thread is row
  // 16 wq + lane / 4 + 8 (e / 2), column 8 i + 2 qd + e % 2. A thread's two rows:
  const int r_lo = 16 * wq + lane / 4;
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const float row_scale[2] = {scale_log2, scale_log2};
  float m_run[2] = {-INFINITY, -INFINITY};  // running max, log2 domain
  float l_run[2] = {0.f, 0.f};              // this thread's share of the row sum
  float o[2][64];                           // O of dims 256 wg + 128 v .. + 127
#pragma unroll
  for (int v = 0; v < 2; ++v)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[v][i] = 0.f;

  // Descriptor bases: Q and K K-major; V = the K tile as an MN-major operand (64-dim blocks 8 KiB
  // apart, 8-key groups 1 KiB apart).
  const sm90::SmemDesc q_desc = sm90::kmajor_sw128(sm80::smem_addr(s_q)), k_desc = sm90::kmajor_sw128(sm80::smem_addr(s_k));
  const sm90::SmemDesc v_desc = sm90::mnmajor_sw128(sm80::smem_addr(s_k), Cfg::kBlockBytes, 1024);

  // One 64-key tile (K tile and validity slot `vs` ready; all threads). issue_next() runs once the
  // S MMAs are committed: the next tile's copies go out while they run.
  auto compute_tile = [&](int vs, auto&& issue_next) {
    float sc[32];
    const sm90::SmemDesc qg = q_desc.plus(4 * wg * Cfg::kBlockBytes), kg = k_desc.plus(4 * wg * Cfg::kBlockBytes);
    sm90::wgmma_fence();
#pragma unroll
    for (int st = 0; st < 16; ++st) {
      const uint32_t off = (st / 4) * Cfg::kBlockBytes + 32 * (st % 4);
      sm90::wgmma_m64n64k16_bf16(sc, qg.at(off), kg.at(off), st > 0);
    }
    sm90::wgmma_commit();
    issue_next();
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(sc);
    sparse::m64::sum_partial_s(sc, s_red, wg, tid_wg);
    float corr[2];
    sparse::m64::online_softmax(sc, s_valid + vs * kN, qd, row_scale, m_run, l_run, corr);
    // P in bf16 as the A fragments of 4 k-steps of 16 keys (the accumulator layout is the A
    // fragment layout), O rescaled only when a row maximum moved, then 2 x 4 wgmma.
    uint32_t pa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 2 * ks + half;  // n8 tile of S = keys 8 i .. + 7
        pa[ks][2 * half + 0] = sm80::pack2<__nv_bfloat16>(sc[4 * i + 0], sc[4 * i + 1]);
        pa[ks][2 * half + 1] = sm80::pack2<__nv_bfloat16>(sc[4 * i + 2], sc[4 * i + 3]);
      }
    }
    if (!__all_sync(0xffffffffu, corr[0] == 1.f && corr[1] == 1.f)) {
#pragma unroll
      for (int v = 0; v < 2; ++v)
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          o[v][4 * i + 0] *= corr[0];
          o[v][4 * i + 1] *= corr[0];
          o[v][4 * i + 2] *= corr[1];
          o[v][4 * i + 3] *= corr[1];
        }
    }
    sm90::fence_accumulators(o);
    sm90::wgmma_fence();
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      // V: keys 16 ks .. + 15 (rows of the K tile), dims 128 vt .. + 127 = blocks 2 vt, 2 vt + 1.
      const sm90::SmemDesc vv = v_desc.plus(2 * (2 * wg + v) * Cfg::kBlockBytes);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) sm90::wgmma_m64n128k16_rs_mn<true>(o[v], pa[ks], vv.at(ks * 16 * 128));
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();  // the K tile is rewritten after the next barrier
    sm90::fence_accumulators(o);
  };

  // ---- main loop ----------------------------------------------------------------------------
  // One staging buffer: tile t + 1's rows are in flight while tile t computes.
  if (tid == 0) {
    mbar_init(bar, kN);
    mbar_init_fence();
  }
  __syncthreads();
  if (num_tiles > 0) {
    load_q();
    sm80::cp_async_commit();
    load_tile(tile_begin, 0);
  }
  for (int t = 0; t < num_tiles; ++t) {
    sm80::cp_async_wait<0>();  // this thread's scale parts (and, first, Q chunks)
    mbar_wait(bar, t & 1);     // tile t's data parts (phase t of the barrier)
    __syncthreads();           // staging holds tile t; everyone is done with K of tile t - 1
    dequant_tile();
    fence_proxy_async_smem();  // the generic stores of K (and cp.async's Q) -> wgmma's async proxy
    __syncthreads();           // K holds tile t; staging is free
    const bool load_next = t + 1 < num_tiles;
    compute_tile(t & 1, [&] {
      if (load_next) load_tile(tile_begin + t + 1, (t + 1) & 1);
    });
  }

  // ---- epilogue: normalised, sink, to out / partials ------------------------------------------
  const float no_v_scale[2] = {1.f, 1.f};
  sparse::m64::store_rows(p, whole, bs, b, s, partial_row0, h0, r_lo, wg, qd, m_run, l_run, o, no_v_scale);
#endif
}

}  // namespace

bool v4_fused_supported(int device, int h_q) {
  const DeviceInfo& info = device_info(device);
  return info.sm_version == 90 && !force_portable() && h_q > 32 && V4Config::kSmemBytes <= info.max_smem_per_block;
}

void run_sparse_decode_v4_fused(const V4FusedParams& fp, int device) {
  const SparseDecodeParams& p = fp.sparse;
  MLA_HOST_CHECK(p.num_splits >= 1 && p.tiles_per_split >= 1, "plan_sparse_decode() must run first");
  MLA_HOST_CHECK(p.num_splits == 1 || (p.partial_out != nullptr && p.partial_lse != nullptr),
                 "a split plan needs partial_out and partial_lse");
  if (p.batch == 0 || p.s_q == 0 || p.h_q == 0) return;
  MLA_HOST_CHECK(int64_t(p.batch) * p.s_q <= 65535, "sparse decode supports b * s_q <= 65535 query tokens per call");
  auto kernel = sparse_decode_sm90_v4_kernel;
  opt_in_smem(reinterpret_cast<const void*>(kernel), V4Config::kSmemBytes, device);
  launch_dependent(kernel, dim3((p.h_q + V4Config::kM - 1) / V4Config::kM, 1, sparse_grid_z(p)), dim3(V4Config::kThreads),
                   V4Config::kSmemBytes, p.stream, fp);
  if (p.num_splits > 1) run_sparse_combine(p, device_info(device).num_sms);
}

}  // namespace mla
