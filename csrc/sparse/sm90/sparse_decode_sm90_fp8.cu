// Sparse top-k MLA decode on sm90a: fp8_ds_mla cache, 64-head tiles, three warpgroups.
//
// Same contract and grid as the portable 64-head kernel (csrc/sparse/README.md): one CTA = one
// query token, 64 heads, one split of the top-k list; 64-key tiles through two bf16 K stages.
// Warp-specialised, so that the gather and the conversion of tile t + 1 run while tile t's MMAs do:
//
//   converter (warpgroup 2)  gathers tile t's rows by index straight into registers (16-byte
//               non-coherent loads, 4 threads per row, 32 rows per round), converts e4m3 x the row's
//               fp32 scale to bf16 into stage t % 2 (the rope dims as they are), flags the valid keys
//               and arrives on the stage's `ready` mbarrier. A round's registers are refilled with
//               tile t + 1's rows as soon as they are converted, so the loads have a tile's time to land.
//   S warpgroup (0)  S = Q K^T (36 wgmma m64n64k16, both operands in shared memory), the online
//               softmax, P in bf16 into the stage's rope block (dead once S is done) and the rows' O
//               rescale factors to shared memory (`p_ready`), then O[:, 0:256] += P V (P from
//               registers, V = the stage read MN-major).
//   P V warpgroup (1)  O[:, 256:512] *= factor; O[:, 256:512] += P V (P from shared memory).
// Both MMA warpgroups release a stage on its `free` mbarrier once their wgmma on it have completed;
// the converter waits for that before it writes the stage again.
//
// kPair (h_q 65-128: two head tiles of the same token, launched as a 2-CTA cluster): each CTA's
// converter gathers and converts half of every tile (rows 32 rank ..) and writes it into both CTAs'
// stages, the peer's by st.async, whose bytes complete on the peer's `ready` mbarrier; `free` then
// counts the MMA warpgroups of both CTAs. Every tile is read and converted once for 128 heads.
//
// Shared memory: Q and two K stages, each 9 blocks of [64 rows][64 dims] bf16 in the 128-byte
// swizzle (block 8 = rope), key flags, rescale factors, the S warpgroup's row state for the
// epilogue, 6 mbarriers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/e4m3.cuh"
#include "common/mbarrier.cuh"
#include "common/pdl.cuh"
#include "common/sm80.cuh"
#include "common/sm90/cluster.cuh"
#include "common/sm90/wgmma.cuh"
#include "common/types.h"
#include "sparse/portable/sparse_decode_portable.cuh"  // cta_work, fetch_slot_ahead, load_q_tile, slot_row, kZeroDsMlaRow
#include "sparse/sm90/m64_tile.cuh"                     // online softmax, epilogue
#include "sparse/sparse_decode.h"
#include "sparse/v4_decode.h"

namespace mla::sparse {

using sm80::smem_addr;

template <class Rows>
struct WsConfig {
  static constexpr int kM = 64;                // heads per CTA
  static constexpr int kN = 64;                // keys per tile
  static constexpr int kMmaThreads = 256;      // the S and the P V warpgroup
  static constexpr int kThreads = kMmaThreads + 128;  // + the converter
  // Registers per thread after setmaxnreg. The warpgroups share what the launch allocated, 168 per
  // thread (384 threads): a setmaxnreg.inc past that total would wait forever.
  static constexpr int kLaunchRegs = 168;
  static constexpr int kRegsS = 216, kRegsPv = 160, kRegsConvert = 128;
  static constexpr int kBlockBytes = 64 * 128;  // [64 rows][64 dims] bf16, one swizzle block
  static constexpr int kBlocks = Rows::kBlocks;  // 64-dim blocks of a row; the last = rope
  static constexpr int kTileBytes = kBlocks * kBlockBytes;
  static constexpr int kStages = 2;
  // kPair: bytes a CTA receives from its peer per tile: 32 rows x kBlocks x 128 bytes + 32 key flags
  static constexpr uint32_t kPeerBytes = 32 * kBlocks * 128 + 32 * 4;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kTileBytes;                 // stage s at kOffK + s kTileBytes
  // P of each stage, where the rope block is part of V (V4); else P overwrites the rope block (V3)
  static constexpr int kOffP = kOffK + kStages * kTileBytes;
  static constexpr int kOffValid = kOffP + (Rows::kPInRope ? 0 : kStages * kBlockBytes);  // [stage][64 keys] int
  static constexpr int kOffFactor = kOffValid + kStages * kN * 4;  // [stage][64 rows] fp32: O rescale
  static constexpr int kOffRowState = kOffFactor + kStages * kM * 4;  // [128 threads] {m, m, l, l}
  static constexpr int kOffBars = kOffRowState + 128 * 16;        // ready[2], free[2], p_ready[2]
  static constexpr int kSmemBytes = kOffBars + 6 * 8;
  static constexpr int kSmemLaunchBytes = kSmemBytes + 1024;  // + base alignment of the swizzle atoms
  static_assert(kRegsS + kRegsPv + kRegsConvert <= 3 * kLaunchRegs && kLaunchRegs * kThreads <= 64 * 1024);
  static_assert(kSmemLaunchBytes <= 227 * 1024, "shared memory budget of sm90");
};

// Byte offset of 16-byte chunk c (8 dims) of row r in a Q or K tile: block c / 8, row r
// of 128 bytes, chunk c % 8 XOR-swizzled by r % 8 (the wgmma descriptors' 128-byte swizzle on
// 1024-byte aligned blocks).
__device__ __forceinline__ uint32_t sw128_off(int r, int c) {
  return static_cast<uint32_t>((c / 8) * (64 * 128) + r * 128 + (((c % 8) ^ (r % 8)) * 16));
}

// 16 bytes of global memory through the non-coherent path, the L2 fetching 256-byte lines (a row's
// 656 bytes are read by 4 threads in 64-byte steps).
__device__ __forceinline__ uint4 ldg_nc_128(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// Where a CTA's rows come from, per cache layout: its tiles, the slot of a tile's row, the raw bytes a
// converter thread loads (part g of 4: e4m3 bytes 16 g + 64 d, rope bytes 32 g .. + 31) and their
// scales. An invalid row is read from a global row of zeros (scale 0): it converts to 0, which P = 0
// needs.
//
// V3 fp8_ds_mla: 656-byte rows (512 e4m3, 4 fp32 scales per 128 dims, 64 bf16 rope), one list.
struct V3Rows {
  using Params = SparseDecodeParams;
  static constexpr int kBlocks = 9;       // 576 dims
  static constexpr int kNopeLoads = 8;    // 512 e4m3 bytes / (4 threads x 16)
  static constexpr bool kPInRope = true;  // V = dims 0-511: P may overwrite the rope block
  struct Raw {
    uint4 nope[kNopeLoads];
    uint4 scales;  // 4 fp32
    uint4 rope[2];
  };
  const SparseDecodeParams& p;
  CtaWork work;
  uint32_t block_size32;
  __device__ __forceinline__ explicit V3Rows(const Params& params)
      : p(params), work(cta_work(params, 64)), block_size32(block_size_u32(params)) {}
  __device__ __forceinline__ const SparseDecodeParams& sparse() const { return p; }
  __device__ __forceinline__ const CtaToken& token() const { return work; }
  __device__ __forceinline__ int num_tiles() const { return work.num_tiles; }
  __device__ __forceinline__ int32_t fetch(int t, int r) const {
    return fetch_slot_ahead(work.idx_row, (work.tile_begin + t) * 64 + r, work.num_keys);
  }
  __device__ __forceinline__ bool load(int /*t*/, int32_t slot, int g, Raw& raw) const {
    const bool ok = slot >= 0 && slot < p.num_slots;
    const uint8_t* row = ok ? slot_row(p, static_cast<const uint8_t*>(p.kv_cache), slot, true, block_size32) : kZeroDsMlaRow;
#pragma unroll
    for (int d = 0; d < kNopeLoads; ++d) raw.nope[d] = ldg_nc_128(row + 64 * d + 16 * g);
    raw.scales = ldg_nc_128(row + kDsMlaScaleOffset);
#pragma unroll
    for (int i = 0; i < 2; ++i) raw.rope[i] = ldg_nc_128(row + kDsMlaRopeOffset + 32 * g + 16 * i);
    return ok;
  }
  // the scale of e4m3 load d (dims 64 d ..: scale tile d / 2)
  __device__ __forceinline__ static float scale(const Raw& raw, int d) {
    const uint32_t w[4] = {raw.scales.x, raw.scales.y, raw.scales.z, raw.scales.w};
    return __uint_as_float(w[d / 2]);
  }
};

// DeepSeek-V4 fp8_ds_mla: two pools of pages of 576-byte tokens (448 e4m3, 64 bf16 rope) followed by
// 8-byte scale parts (7 UE8M0, one per 64 dims); the CTA's 64-key tiles are the main list's, then the
// extra list's (each rounded up to whole tiles), a split's range of them.
struct V4Rows {
  using Params = V4FusedParams;
  static constexpr int kBlocks = 8;        // 512 dims
  static constexpr int kNopeLoads = 7;     // 448 e4m3 bytes / (4 threads x 16)
  static constexpr bool kPInRope = false;  // the value is the whole row
  struct Raw {
    uint4 nope[kNopeLoads];
    uint2 scales;  // 7 UE8M0 + pad
    uint4 rope[2];
  };
  const V4FusedParams& fp;
  CtaToken tok;
  int n_main, n_extra, main_tiles, tile_begin, tiles;
  const int32_t* idx[2];
  __device__ __forceinline__ explicit V4Rows(const Params& params) : fp(params), tok(cta_token(params.sparse)) {
    const SparseDecodeParams& p = fp.sparse;
    auto counted = [&](const V4Pool& pool) {
      int n = pool.topk;
      if (n > 0 && pool.lengths != nullptr) n = min(n, max(pool.lengths[tok.b], 0));
      return n;
    };
    n_main = counted(fp.pool[0]), n_extra = counted(fp.pool[1]);
    main_tiles = (n_main + 63) / 64;
    const int total = main_tiles + (n_extra + 63) / 64;
    tile_begin = tok.whole ? 0 : tok.split * p.tiles_per_split;
    tiles = tok.whole ? total : max(0, min(total, tile_begin + p.tiles_per_split) - tile_begin);
#pragma unroll
    for (int i = 0; i < 2; ++i)
      idx[i] = fp.pool[i].topk > 0 ? fp.pool[i].indices + tok.b * fp.pool[i].stride_indices_b + tok.s * fp.pool[i].stride_indices_s
                                   : nullptr;
  }
  __device__ __forceinline__ const SparseDecodeParams& sparse() const { return fp.sparse; }
  __device__ __forceinline__ const CtaToken& token() const { return tok; }
  __device__ __forceinline__ int num_tiles() const { return tiles; }
  __device__ __forceinline__ bool extra(int t) const { return tile_begin + t >= main_tiles; }
  __device__ __forceinline__ int32_t fetch(int t, int r) const {
    const int i = tile_begin + t;
    if (i < main_tiles) return fetch_slot_ahead(idx[0], 64 * i + r, n_main);
    return fetch_slot_ahead(idx[1], 64 * (i - main_tiles) + r, n_extra);
  }
  __device__ __forceinline__ bool load(int t, int32_t slot, int g, Raw& raw) const {
    const bool x = extra(t);
    const V4Pool& pool = fp.pool[x ? 1 : 0];
    const bool ok = slot >= 0 && slot < pool.num_slots;
    const uint8_t* data = kZeroDsMlaRow;
    const uint8_t* scales = kZeroDsMlaRow + kV4DataBytes;
    if (ok) {
      FastDivmod div = fp.block_div[0];  // (a select, not an indexed parameter read)
      if (x) div = fp.block_div[1];
      const int page = div.div(slot), page_row = div.mod(slot, page);
      const uint8_t* base = static_cast<const uint8_t*>(pool.cache) + int64_t(page) * pool.stride_block_bytes;
      data = base + page_row * kV4DataBytes;
      scales = base + div.divisor * kV4DataBytes + page_row * kV4ScaleBytes;
    }
#pragma unroll
    for (int d = 0; d < kNopeLoads; ++d) raw.nope[d] = ldg_nc_128(data + 64 * d + 16 * g);
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(raw.scales.x), "=r"(raw.scales.y) : "l"(scales));
#pragma unroll
    for (int i = 0; i < 2; ++i) raw.rope[i] = ldg_nc_128(data + kV4NopeDim + 32 * g + 16 * i);
    return ok;
  }
  __device__ __forceinline__ static float scale(const Raw& raw, int d) {
    return e4m3::ue8m0_to_float(((d < 4 ? raw.scales.x : raw.scales.y) >> (8 * (d % 4))) & 0xFFu);
  }
};

template <class Rows, bool kPair>
__device__ __forceinline__ void sparse_decode_sm90_ws(const typename Rows::Params& params) {
#if MLA_SM90A
  using C = WsConfig<Rows>;
  constexpr int kN = C::kN;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = sm90::align_to_swizzle_atom(smem_raw);
  int* const s_valid = reinterpret_cast<int*>(smem + C::kOffValid);
  float* const s_factor = reinterpret_cast<float*>(smem + C::kOffFactor);
  float4* const s_row_state = reinterpret_cast<float4*>(smem + C::kOffRowState);
  const uint32_t q_base = smem_addr(smem + C::kOffQ), k_base = smem_addr(smem + C::kOffK);
  const uint32_t bars = smem_addr(smem + C::kOffBars);
  auto ready_bar = [&](int st) { return bars + 8 * st; };     // converter -> MMA warpgroups (128 arrivals)
  auto free_bar = [&](int st) { return bars + 16 + 8 * st; };  // MMA warpgroups (kPair: of both CTAs) -> converter
  auto p_bar = [&](int st) { return bars + 32 + 8 * st; };     // S warpgroup -> P V warpgroup (128)
  auto stage_of = [&](int st) { return k_base + st * C::kTileBytes; };
  // P of a stage: its rope block (V3) or a block of its own (V4)
  const uint32_t p_base = Rows::kPInRope ? k_base + (C::kBlocks - 1) * C::kBlockBytes : smem_addr(smem + C::kOffP);
  constexpr uint32_t kPStride = Rows::kPInRope ? C::kTileBytes : C::kBlockBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, qd = lane % 4;
  // Warpgroup through a shuffle: warp-uniform for the compiler, so the descriptors stay uniform.
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), tid_wg = tid % 128;
  const int h0 = blockIdx.x * C::kM;
  // kPair: this CTA's rank in the cluster (= blockIdx.x % 2) and the peer's
  const uint32_t rank = kPair ? sm90::cluster_cta_rank() : 0u, peer = rank ^ 1u;
  // A programmatic dependent, as the portable kernels (common/pdl.cuh).
  pdl_wait_prerequisites();
  pdl_launch_dependents();
  const Rows rows(params);
  const SparseDecodeParams& p = rows.sparse();
  const CtaToken& work = rows.token();
  const int num_tiles = rows.num_tiles();

  if (tid == 0) {
    for (int st = 0; st < C::kStages; ++st) {
      mbar_init(ready_bar(st), 128);
      mbar_init(free_bar(st), kPair ? 4 : 2);  // one arrival per MMA warpgroup (and CTA)
      mbar_init(p_bar(st), 128);
    }
    mbar_init_fence();
  }
  if (wg < 2 && num_tiles > 0)
    load_q_tile<C::kM, C::kMmaThreads, C::kBlocks * 8>(p, work.b, work.s, h0, tid, smem + C::kOffQ, [](int r, int c) { return sw128_off(r, c); });
  sm80::cp_async_commit();
  sm80::cp_async_wait<0>();
  fence_proxy_async_smem();  // Q's cp.async writes -> wgmma
  // (the last barrier of all three warpgroups; kPair: the peer's mbarriers are initialised past it)
  if constexpr (kPair) sm90::cluster_sync();
  else __syncthreads();

  if (wg == 2) {
    // ---- converter ---------------------------------------------------------------------------
    // Thread (warp w, lane l): row 32 q + 8 w + l % 8 of a tile in round q (kPair: q = rank, one
    // round), e4m3 bytes 16 (l / 8) + 64 d: dims 64 d + 16 (l / 8) .., output chunks 2 (l / 8) and + 1
    // of block d, whose swizzled places (chunk ^ row % 8) differ across the 8 rows of a store: no bank
    // conflicts. Rope: bytes 32 (l / 8) .. + 31 -> chunks 2 (l / 8), + 1 of the last block.
    sm90::setmaxnreg_dec<C::kRegsConvert>();
    const int w = warp % 4, g = lane / 8, j = lane % 8;
    constexpr int kRounds = kPair ? 1 : 2;
    typename Rows::Raw raw[kRounds];
    bool ok[kRounds];
    int32_t slot[kRounds];
#pragma unroll
    for (int q = 0; q < kRounds; ++q) slot[q] = -1, ok[q] = false;
    auto row_in_tile = [&](int q) { return 32 * (kPair ? static_cast<int>(rank) : q) + 8 * w + j; };
    auto fetch = [&](int t, int q) { return t < num_tiles ? rows.fetch(t, row_in_tile(q)) : -1; };
    auto convert = [&](int q, int st) {
      const int r = row_in_tile(q);
      const uint32_t row_at = stage_of(st) + r * 128;
      const uint32_t lo_at = ((2 * g) ^ j) << 4, hi_at = ((2 * g + 1) ^ j) << 4;
      // kPair: the same bytes into the peer's stage, counted on its ready mbarrier
      const uint32_t peer_delta = kPair ? sm90::peer_smem_addr(row_at, peer) - row_at : 0u;
      const uint32_t peer_ready = kPair ? sm90::peer_smem_addr(ready_bar(st), peer) : 0u;
      auto put = [&](uint32_t at, const uint4& v) {
        sm80::sts128(at, v);
        if constexpr (kPair) sm90::st_async_128(at + peer_delta, v, peer_ready);
      };
#pragma unroll
      for (int d = 0; d < Rows::kNopeLoads; ++d) {
        const uint4 v = raw[q].nope[d];
        const float sc = Rows::scale(raw[q], d);
        put(row_at + d * C::kBlockBytes + lo_at, e4m3::x8_scaled_to_bf16x8(make_uint2(v.x, v.y), sc));
        put(row_at + d * C::kBlockBytes + hi_at, e4m3::x8_scaled_to_bf16x8(make_uint2(v.z, v.w), sc));
      }
      put(row_at + (C::kBlocks - 1) * C::kBlockBytes + lo_at, raw[q].rope[0]);
      put(row_at + (C::kBlocks - 1) * C::kBlockBytes + hi_at, raw[q].rope[1]);
      if (g == 0) {
        s_valid[st * kN + r] = ok[q];
        if constexpr (kPair) {
          const uint32_t flag_at = smem_addr(s_valid + st * kN + r);
          sm90::st_async_32(sm90::peer_smem_addr(flag_at, peer), ok[q] ? 1u : 0u, peer_ready);
        }
      }
    };
    if (num_tiles > 0) {
#pragma unroll
      for (int q = 0; q < kRounds; ++q) {
        ok[q] = rows.load(0, fetch(0, q), g, raw[q]);
        slot[q] = fetch(1, q);
      }
    }
    for (int t = 0; t < num_tiles; ++t) {
      const int st = t % 2;
      // the stage's tile t - 2 is done (kPair: in both CTAs); a fresh barrier passes
      mbar_wait(free_bar(st), ((t / 2) & 1) ^ 1);
#pragma unroll
      for (int q = 0; q < kRounds; ++q) {
        convert(q, st);
        if (t + 1 < num_tiles) {
          ok[q] = rows.load(t + 1, slot[q], g, raw[q]);  // tile t + 1's row, into the registers just converted
          slot[q] = fetch(t + 2, q);
        }
      }
      fence_proxy_async_smem();  // st.shared -> the MMA warpgroups' wgmma
      // kPair: one thread also announces the peer's half (st.async bytes may land before or after)
      if (kPair && tid_wg == 0) mbar_arrive_expect_tx(ready_bar(st), C::kPeerBytes);
      else mbar_arrive(ready_bar(st));
    }
  } else {
    // ---- MMA warpgroups ----------------------------------------------------------------------------
    // Accumulator layout (m64nN, S and O): element 4 i + e of a thread is row r_lo + 8 (e / 2), column
    // 8 i + 2 qd + e % 2.
    const int r_lo = 16 * (warp % 4) + lane / 4;
    float m_run[2] = {-INFINITY, -INFINITY};  // running max, log2 domain
    float l_run[2] = {0.f, 0.f};              // this thread's share of the row sum
    float o[2][64];                           // O of dims 256 wg .. + 255 (m64n256: two m64n128 halves)
#pragma unroll
    for (int v = 0; v < 2; ++v)
#pragma unroll
      for (int i = 0; i < 64; ++i) o[v][i] = 0.f;
    auto rescale_o = [&](float c0, float c1) {
      if (__all_sync(0xffffffffu, c0 == 1.f && c1 == 1.f)) return;
#pragma unroll
      for (int v = 0; v < 2; ++v)
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          o[v][4 * i + 0] *= c0;
          o[v][4 * i + 1] *= c0;
          o[v][4 * i + 2] *= c1;
          o[v][4 * i + 3] *= c1;
        }
    };
    // A stage's wgmma of this warpgroup have completed: one thread arrives on its free mbarrier (kPair:
    // one on the peer's too, whose converter writes half of this CTA's stage).
    auto release = [&](int st) {
      if (tid_wg == 0) mbar_arrive(free_bar(st));
      if (kPair && tid_wg == 32) sm90::mbar_arrive_cluster(sm90::peer_smem_addr(free_bar(st), peer));
    };
    // V = a stage's dims 0-511 (V3: all but the rope block; V4: the whole row) as an MN-major operand: 64-dim blocks 8 KiB apart, 8-key groups 1 KiB
    // apart; this warpgroup's half from block 4 wg.
    const sm90::SmemDesc v_desc = sm90::mnmajor_sw128(k_base + 4 * wg * C::kBlockBytes, C::kBlockBytes, 1024);

    if (wg == 0) {
      sm90::setmaxnreg_inc<C::kRegsS>();
      const float row_scale[2] = {p.softmax_scale * 1.4426950408889634f, p.softmax_scale * 1.4426950408889634f};
      const sm90::SmemDesc q_desc = sm90::kmajor_sw128(q_base), k_desc = sm90::kmajor_sw128(k_base);
      for (int t = 0; t < num_tiles; ++t) {
        const int st = t % 2;
        const uint32_t parity = (t / 2) & 1;
        mbar_wait(ready_bar(st), parity);
        // kPair: the peer's half came by st.async, not by an async-proxy copy; order it before wgmma here
        // (the P V warpgroup reads the stage after p_ready, past this warpgroup's fence for P)
        if constexpr (kPair) fence_proxy_async_smem();
        float sc[32];
        sm90::wgmma_fence();
#pragma unroll
        for (int blk = 0; blk < C::kBlocks; ++blk)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const uint32_t off = blk * C::kBlockBytes + 32 * kk;
            sm90::wgmma_m64n64k16_bf16(sc, q_desc.at(off), k_desc.at(st * C::kTileBytes + off), blk > 0 || kk > 0);
          }
        sm90::wgmma_commit();
        if (t > 0) {
          sm90::wgmma_wait<1>();  // P V of tile t - 1
          sm90::fence_accumulators(o);
          release(st ^ 1);
        }
        sm90::wgmma_wait<0>();
        sm90::fence_accumulators(sc);
        float corr[2];
        m64::online_softmax(sc, s_valid + st * kN, qd, row_scale, m_run, l_run, corr);
        // P (bf16) as the P V warpgroup's K-major A operand: row r, keys 8 i .. + 7 = chunk i, swizzled;
        // the rows' factors beside it.
        const uint32_t p_at = p_base + st * kPStride;
        uint32_t pa[4][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t lo = sm80::pack2<__nv_bfloat16>(sc[4 * i + 0], sc[4 * i + 1]);
          const uint32_t hi = sm80::pack2<__nv_bfloat16>(sc[4 * i + 2], sc[4 * i + 3]);
          pa[i / 2][2 * (i % 2) + 0] = lo;
          pa[i / 2][2 * (i % 2) + 1] = hi;
          const int r_hi = r_lo + 8;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_at + r_lo * 128 + ((i ^ (r_lo % 8)) << 4) + 4 * qd), "r"(lo) : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_at + r_hi * 128 + ((i ^ (r_hi % 8)) << 4) + 4 * qd), "r"(hi) : "memory");
        }
        if (qd == 0) {
          s_factor[st * C::kM + r_lo] = corr[0];
          s_factor[st * C::kM + r_lo + 8] = corr[1];
        }
        fence_proxy_async_smem();  // P's st.shared -> the P V warpgroup's wgmma
        mbar_arrive(p_bar(st));
        rescale_o(corr[0], corr[1]);
        sm90::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) sm90::wgmma_m64n256k16_rs_mn<true>(o, pa[ks], v_desc.at(st * C::kTileBytes + ks * 16 * 128));
        sm90::wgmma_commit();
      }
      sm90::wgmma_wait<0>();
      sm90::fence_accumulators(o);
      s_row_state[tid_wg] = make_float4(m_run[0], m_run[1], l_run[0], l_run[1]);
    } else {
      sm90::setmaxnreg_dec<C::kRegsPv>();
      const sm90::SmemDesc p_desc = sm90::kmajor_sw128(p_base);
      for (int t = 0; t < num_tiles; ++t) {
        const int st = t % 2;
        mbar_wait(p_bar(st), (t / 2) & 1);
        rescale_o(s_factor[st * C::kM + r_lo], s_factor[st * C::kM + r_lo + 8]);
        sm90::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          sm90::wgmma_m64n256k16_ss_mn<true>(o, p_desc.at(st * kPStride + 32 * ks), v_desc.at(st * C::kTileBytes + ks * 16 * 128));
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        sm90::fence_accumulators(o);
        release(st);
      }
    }
    // ---- epilogue: the S warpgroup's row state to the P V warpgroup; each writes its 256 dims ----
    sm80::named_barrier(1, C::kMmaThreads);
    if (wg == 1) {
      const float4 rs = s_row_state[tid_wg];
      m_run[0] = rs.x, m_run[1] = rs.y, l_run[0] = rs.z, l_run[1] = rs.w;
    }
    const float unit[2] = {1.f, 1.f};
    m64::store_rows(p, work.whole, work.bs, work.b, work.s, work.partial_row0, h0, r_lo, wg, qd, m_run, l_run, o, unit);
  }
  if constexpr (kPair) sm90::cluster_sync();  // no CTA exits while its peer may still write to it
#endif
}

__global__ void __launch_bounds__(WsConfig<V3Rows>::kThreads, 1)
    sparse_decode_sm90_fp8_kernel(const __grid_constant__ SparseDecodeParams p) {
  sparse_decode_sm90_ws<V3Rows, false>(p);
}
// h_q 65-128: the token's two head tiles as one cluster (grid x = 2)
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(WsConfig<V3Rows>::kThreads, 1)
    sparse_decode_sm90_fp8_pair_kernel(const __grid_constant__ SparseDecodeParams p) {
  sparse_decode_sm90_ws<V3Rows, true>(p);
}
__global__ void __launch_bounds__(WsConfig<V4Rows>::kThreads, 1)
    sparse_decode_sm90_v4_kernel(const __grid_constant__ V4FusedParams p) {
  sparse_decode_sm90_ws<V4Rows, false>(p);
}
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(WsConfig<V4Rows>::kThreads, 1)
    sparse_decode_sm90_v4_pair_kernel(const __grid_constant__ V4FusedParams p) {
  sparse_decode_sm90_ws<V4Rows, true>(p);
}

int sm90_fp8_m64_smem_bytes() { return WsConfig<V3Rows>::kSmemLaunchBytes; }

// The kernel for h_q heads (two head tiles: the cluster), its shared memory opted in on this device.
template <class Rows, typename Params>
void launch_ws(const SparseDecodeParams& p, const Params& params, void (*single)(Params), void (*pair)(Params)) {
  using Cfg = WsConfig<Rows>;
  const int head_tiles = (p.h_q + Cfg::kM - 1) / Cfg::kM;
  auto kernel = head_tiles == 2 ? pair : single;
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  opt_in_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemLaunchBytes, device);
  launch_dependent(kernel, dim3(head_tiles, 1, sparse_grid_z(p)), dim3(Cfg::kThreads), Cfg::kSmemLaunchBytes, p.stream, params);
}

void launch_sparse_decode_sm90_fp8_m64(const SparseDecodeParams& p) {
  launch_ws<V3Rows>(p, p, sparse_decode_sm90_fp8_kernel, sparse_decode_sm90_fp8_pair_kernel);
}

int sm90_v4_smem_bytes() { return WsConfig<V4Rows>::kSmemLaunchBytes; }

void launch_sparse_decode_sm90_v4(const V4FusedParams& fp) {
  launch_ws<V4Rows>(fp.sparse, fp, sparse_decode_sm90_v4_kernel, sparse_decode_sm90_v4_pair_kernel);
}

}  // namespace mla::sparse
