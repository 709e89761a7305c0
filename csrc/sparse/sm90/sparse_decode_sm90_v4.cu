// DeepSeek-V4 sparse decode on sm90a, fused: fp8_ds_mla pools (584-byte tokens), 64-head tiles, wgmma.
//
// Contract of sparse_decode_mla_v4 (mla_ext/reference.py; csrc/sparse/README.md, "DeepSeek-V4"): query
// token (b, s) attends to the entries of two lists, the main cache's `indices[b, s, :topk]` and the
// extra cache's `extra_indices[b, s, :extra_topk]`, in one softmax; heads are 512 wide (448 NoPE + 64
// RoPE), the value is the whole row. An entry counts when its position is below its list's length and
// its slot is inside its cache.
//
// Grid and plan as the V3 kernels (plan_sparse_decode, split combine): one CTA = one query token, 64
// heads, one split of its 64-key tiles (the main list's, then the extra list's); 256 threads = two
// warpgroups, all of them doing every role. The CTA runs its keys in steps of 32 (a step never mixes
// the pools) through two K tiles, so that the conversion of step j + 1 runs under the P V MMAs of
// step j:
//
//   S_j = Q K_j^T      warpgroup g takes dims 256 g .. + 255 (16 wgmma m64n32k16, Q and K from shared
//                      memory); the partial S meet through shared memory (m64_tile.cuh), both
//                      warpgroups run the same online softmax.
//   O += P_j V_j       issued, not waited for: warpgroup g owns output dims 256 g .. + 255 (2 x 2
//                      wgmma m64n128k16, P in bf16 from registers, V = the K tile read MN-major).
//   dequant j + 1      8 threads per key row: e4m3 -> fp16 (cvt) -> bf16 bits times 2^(scale - 15)
//                      (exact) and the bf16 RoPE dims, from staging buffer (j + 1) % 2 into K tile
//                      (j + 1) % 2; invalid rows written as zeros (P = 0 times V must be 0).
//   gather j + 3       thread 8 r of row r (4 per warp): one cp.async.bulk of the token's 576-byte data
//                      part into the staging buffer just freed (mbarrier: 32 arrivals and the bytes),
//                      one 8-byte cp.async of its scales; its slot for the next step read ahead.
//   wait P V, barrier
//
// The structure, wgmma wrappers (common/sm90/wgmma.cuh), S exchange, softmax and epilogue are those of
// the V3 fp8_ds_mla kernel (sparse_decode_sm90_fp8.cu). V4 needs no scale accumulators: a scale is a
// power of two per 64 dims, so the dequantised tile is exact in bf16 and S and P V run on it as on a
// bf16 cache.
#include <cuda_bf16.h>

#include <cmath>
#include <type_traits>

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
  static constexpr int kStep = 32;      // keys per step
  static constexpr int kThreads = 256;  // 2 warpgroups
  static constexpr int kRowThreads = kThreads / kStep;  // threads per key row in the dequantisation: 8
  static constexpr int kQBlockBytes = kM * 128;          // [64 heads][64 dims] bf16, one swizzle block
  static constexpr int kKBlockBytes = kStep * 128;       // [32 keys][64 dims]
  static constexpr int kQBytes = 8 * kQBlockBytes;       // 512 dims
  static constexpr int kKBytes = 8 * kKBlockBytes;
  static constexpr int kRawBytes = kStep * kV4DataBytes;  // a staging buffer of 576-byte data parts
  static constexpr int kScaleBytes = kStep * 8;           // their scale parts (7 UE8M0 and a pad byte)
  static constexpr int kRedBytes = 2 * 4 * 128 * 16;      // partial S: [warpgroup][4 float4][128 threads]
  static constexpr int kOffQ = 0;
  static constexpr int kKTiles = 2;                       // step k's K tile: k % 2
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffRaw = kOffK + kKTiles * kKBytes;  // 2 staging buffers: step k's at k % 2
  static constexpr int kOffScale = kOffRaw + 2 * kRawBytes;
  static constexpr int kOffRed = kOffScale + 2 * kScaleBytes;
  static constexpr int kOffValid = kOffRed + kRedBytes;   // [4][32] int: step k's at k % 4 (written 3 steps ahead)
  static constexpr int kOffBar = kOffValid + 4 * kStep * 4;  // 2 mbarriers, one per staging buffer
  // + 1 KiB so that the base can be rounded up to the 1024 bytes the swizzle atoms need
  static constexpr int kSmemBytes = kOffBar + 16 + 1024;
  static_assert(kOffK % 1024 == 0 && kKBytes % 1024 == 0 && kOffRaw % 16 == 0 && kOffScale % 16 == 0 &&
                    kOffRed % 16 == 0 && kOffBar % 8 == 0,
                "alignment");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90");
  static_assert(kRowThreads == 8 && kV4NopeDim == 28 * 16 && kV4HeadDim - kV4NopeDim == 64,
                "dequantisation: 8 threads per row, 28 chunks of 16 NoPE dims, 8 of RoPE bytes");
};

}  // namespace v4_fused
namespace {
using v4_fused::V4Config;

__global__ void __launch_bounds__(V4Config::kThreads, 1)
    sparse_decode_sm90_v4_kernel(const __grid_constant__ V4FusedParams fp) {
#if MLA_SM90A
  using Cfg = V4Config;
  constexpr int kStep = Cfg::kStep;
  const SparseDecodeParams& p = fp.sparse;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = sm90::align_to_swizzle_atom(smem_raw);
  uint8_t* s_q = smem + Cfg::kOffQ;
  float* s_red = reinterpret_cast<float*>(smem + Cfg::kOffRed);
  int* s_valid = reinterpret_cast<int*>(smem + Cfg::kOffValid);
  const uint32_t bar0 = sm80::smem_addr(smem + Cfg::kOffBar);
  auto k_tile = [&](int buf) { return smem + Cfg::kOffK + buf * Cfg::kKBytes; };
  auto raw_buf = [&](int buf) { return smem + Cfg::kOffRaw + buf * Cfg::kRawBytes; };
  auto scale_buf = [&](int buf) { return smem + Cfg::kOffScale + buf * Cfg::kScaleBytes; };

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // warpgroup (through a shuffle, so that the compiler knows it is warp-uniform and keeps the
  // wgmma descriptors derived from it in uniform registers), thread and warp within it
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), tid_wg = tid % 128, wq = warp % 4;
  const int qd = lane % 4;
  const int h0 = blockIdx.x * Cfg::kM;
  // A programmatic dependent, as the V3 kernels (common/pdl.cuh).
  pdl_wait_prerequisites();
  pdl_launch_dependents();

  // ---- this CTA's work: query token, split, and its keys of both lists ------------------------
  const sparse::CtaToken token = sparse::cta_token(p);
  const int bs = token.bs, b = token.b, s = token.s, split = token.split;
  const bool whole = token.whole;
  // Counted entries of each list; the plan splits both lists' 64-key tiles (main first).
  auto counted = [&](const V4Pool& pool) {
    int n = pool.topk;
    if (n > 0 && pool.lengths != nullptr) n = min(n, max(pool.lengths[b], 0));
    return n;
  };
  const int n_main = counted(fp.pool[0]), n_extra = counted(fp.pool[1]);
  const int main_tiles = (n_main + 63) / 64;
  const int total_tiles = main_tiles + (n_extra + 63) / 64;
  const int tile_begin = whole ? 0 : split * p.tiles_per_split;
  const int tile_end = whole ? total_tiles : min(total_tiles, tile_begin + p.tiles_per_split);
  // Keys [key0, end) of each list, and their steps: those of the main list first.
  const int key0_main = 64 * min(tile_begin, main_tiles), end_main = min(n_main, 64 * min(tile_end, main_tiles));
  const int key0_extra = 64 * max(tile_begin - main_tiles, 0), end_extra = min(n_extra, 64 * max(tile_end - main_tiles, 0));
  const int steps_main = max(end_main - key0_main, 0) / kStep + (max(end_main - key0_main, 0) % kStep != 0);
  const int steps_extra = max(end_extra - key0_extra, 0) / kStep + (max(end_extra - key0_extra, 0) % kStep != 0);
  const int num_steps = steps_main + steps_extra;

  // ---- gather: thread 8 r issues row r of a step ---------------------------------------------
  const int row = tid / Cfg::kRowThreads, rq = tid % Cfg::kRowThreads;  // dequantisation: row, part
  const bool row_lane = rq == 0;
  auto index_row = [&](const V4Pool& pool, int n) {
    return n > 0 ? pool.indices + b * pool.stride_indices_b + s * pool.stride_indices_s : nullptr;
  };
  const int32_t* idx_main = index_row(fp.pool[0], n_main);
  const int32_t* idx_extra = index_row(fp.pool[1], n_extra);
  // Step k's list (0 main, 1 extra) and this row's key in it; the key counts when below `end`.
  auto step_key = [&](int k, bool& extra, int& end) {
    extra = k >= steps_main;
    end = extra ? end_extra : end_main;
    return (extra ? key0_extra + kStep * (k - steps_main) : key0_main + kStep * k) + row;
  };
  auto fetch_slot = [&](int k) {
    if (k >= num_steps) return int32_t(-1);
    bool extra;
    int end;
    const int key = step_key(k, extra, end);
    return sparse::fetch_slot_ahead(extra ? idx_extra : idx_main, key, end);
  };
  int32_t next_slot = row_lane ? fetch_slot(0) : -1;
  // Step k into staging buffer k % 2 (k < num_steps; in order k = 0, 1, 2, ...): its validity to
  // s_valid[k % 4], the data part by a bulk copy, the scale part by cp.async (the caller commits).
  auto gather = [&](int k) {
    if (!row_lane) return;
    const int buf = k & 1;
    const uint32_t bar = bar0 + 8 * buf;
    bool extra;
    int end;
    const int key = step_key(k, extra, end);
    const int32_t slot = next_slot;
    const int64_t num_slots = extra ? fp.pool[1].num_slots : fp.pool[0].num_slots;
    const bool ok = key < end && slot >= 0 && slot < num_slots;
    s_valid[(k & 3) * kStep + row] = ok;
    if (ok) {
      // Pages are block_size rows of 576 bytes, then block_size scale parts of 8 bytes.
      FastDivmod div = fp.block_div[0];  // (a select, not an indexed parameter read)
      if (extra) div = fp.block_div[1];
      const int page = div.div(slot), page_row = div.mod(slot, page);
      const uint8_t* base = static_cast<const uint8_t*>(extra ? fp.pool[1].cache : fp.pool[0].cache) +
                            int64_t(page) * (extra ? fp.pool[1].stride_block_bytes : fp.pool[0].stride_block_bytes);
      mbar_arrive_expect_tx(bar, kV4DataBytes);
      bulk_load(sm80::smem_addr(raw_buf(buf) + row * kV4DataBytes), base + page_row * kV4DataBytes, kV4DataBytes, bar);
      sm80::cp_async_ca<8>(sm80::smem_addr(scale_buf(buf) + row * 8), base + div.divisor * kV4DataBytes + page_row * 8);
    } else {
      mbar_arrive(bar);
    }
    next_slot = fetch_slot(k + 1);
  };

  // ---- dequantisation: staging buffer k % 2 -> K tile k % 2 ------------------------------------
  // Thread (row, rq) converts the 16-dim chunks rq, rq + 8, rq + 16 (and rq + 24 for rq < 4; the
  // others copy RoPE bytes 32 (rq - 4) .. + 31): chunk c is NoPE dims 16 c .. + 15 of scale tile
  // c / 4, i.e. 16-byte units 2 (c % 4), + 1 of swizzle block c / 4. Threads rq >= 4 convert and
  // store their two halves in the other order, so that a quarter warp (one row) writes the 8
  // distinct 16-byte positions of a 128-byte line at once. An invalid row converts with factor 0
  // (the shifted bits are never inf or NaN) and copies zeros.
  const int r8 = row % 8, flip = rq / 4;
  auto dequant = [&](int k) {
    const bool ok = s_valid[(k & 3) * kStep + row] != 0;
    const uint8_t* src = raw_buf(k & 1) + row * kV4DataBytes;
    uint8_t* dst = k_tile(k % Cfg::kKTiles) + row * 128;
    const uint2 scales = *reinterpret_cast<const uint2*>(scale_buf(k & 1) + row * 8);
    auto scale_byte = [&](int t) { return (t < 4 ? scales.x >> (8 * t) : scales.y >> (8 * (t - 4))) & 0xFFu; };
    // Scales above 2^15 (bytes 143 .. 254) need two bf16 multiplies; rare, so a warp takes that
    // path only when one of its rows has one.
    bool split_scale = false;
#pragma unroll
    for (int t = 0; t < 7; ++t) split_scale |= scale_byte(t) >= 143u && scale_byte(t) != 0xFFu;
    auto convert = [&](auto split_tag) {
      constexpr bool kSplit = decltype(split_tag)::value;
      auto chunk = [&](int c) {
        const int t = c / 4, u = 2 * (c % 4);  // scale tile (= swizzle block), first 16-byte unit
        uint32_t f1, f2 = 0;
        if constexpr (kSplit) {
          const uint32_t sb = scale_byte(t);
          if (sb >= 143u && sb != 0xFFu) e4m3::ue8m0_split_factors(sb, f1, f2);
          else f1 = e4m3::ue8m0_to_bf16x2_factor(sb), f2 = 0x3f803f80u;  // 1.0
        } else {
          f1 = e4m3::ue8m0_to_bf16x2_factor(scale_byte(t));
        }
        if (!ok) f1 = 0u;
        // halves in the order of this thread's stores: flip = 1 takes the second half first
        const uint2 w0 = *reinterpret_cast<const uint2*>(src + 16 * c + 8 * flip);
        const uint2 w1 = *reinterpret_cast<const uint2*>(src + 16 * c + 8 * (1 - flip));
        const uint4 v0 = e4m3::x8_to_bf16x8_by_shift<kSplit>(w0, f1, f2), v1 = e4m3::x8_to_bf16x8_by_shift<kSplit>(w1, f1, f2);
        uint8_t* blk = dst + t * Cfg::kKBlockBytes;
        *reinterpret_cast<uint4*>(blk + (((u + flip) ^ r8) * 16)) = v0;
        *reinterpret_cast<uint4*>(blk + (((u + 1 - flip) ^ r8) * 16)) = v1;
      };
#pragma unroll
      for (int i = 0; i < 3; ++i) chunk(rq + 8 * i);
      if (rq < 4) {
        chunk(rq + 24);
      } else {
        // RoPE: bf16 bytes 448 + 32 (rq - 4) .. + 31 = 16-byte units 2 (rq - 4), + 1 of block 7.
        const int u = 2 * (rq - 4);
        uint4 v0 = *reinterpret_cast<const uint4*>(src + kV4NopeDim + 16 * u);
        uint4 v1 = *reinterpret_cast<const uint4*>(src + kV4NopeDim + 16 * (u + 1));
        if (!ok) v0 = v1 = make_uint4(0u, 0u, 0u, 0u);
        uint8_t* blk = dst + 7 * Cfg::kKBlockBytes;
        *reinterpret_cast<uint4*>(blk + ((u ^ r8) * 16)) = v0;
        *reinterpret_cast<uint4*>(blk + (((u + 1) ^ r8) * 16)) = v1;
      }
    };
    if (__any_sync(0xffffffffu, ok && split_scale)) convert(std::true_type{});
    else convert(std::false_type{});
  };

  // Q: 64 heads x 64 chunks by cp.async; heads past h_q zero-filled (their rows are never written).
  // Chunk c of head r: block c / 8, row r, 16-byte unit c % 8 swizzled by r % 8.
  auto load_q = [&]() {
    sparse::load_q_tile<Cfg::kM, Cfg::kThreads, kV4HeadDim / 8>(p, b, s, h0, tid, s_q, [](int r, int c) {
      return (c / 8) * Cfg::kQBlockBytes + r * 128 + (((c % 8) ^ (r % 8)) * 16);
    });
  };

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

  // Descriptor bases: Q and K K-major; V = the K tile as an MN-major operand (64-dim blocks 4 KiB
  // apart, 8-key groups 1 KiB apart).
  const sm90::SmemDesc q_desc = sm90::kmajor_sw128(sm80::smem_addr(s_q));
  const sm90::SmemDesc k_desc = sm90::kmajor_sw128(sm80::smem_addr(k_tile(0)));
  const sm90::SmemDesc v_desc = sm90::mnmajor_sw128(sm80::smem_addr(k_tile(0)), Cfg::kKBlockBytes, 1024);

  // ---- prologue: Q, steps 0-2 gathered, step 0 converted ---------------------------------------
  if (tid == 0) {
    mbar_init(bar0, kStep);
    mbar_init(bar0 + 8, kStep);
    mbar_init_fence();
  }
  __syncthreads();
  // cp.async groups (every thread commits the same sequence, empty or not): Q, then one per gather
  // slot, so that "step k's scales landed" is always cp_async_wait<1> (step k + 1's may be pending).
  if (num_steps > 0) load_q();
  sm80::cp_async_commit();
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (k < num_steps) gather(k);
    sm80::cp_async_commit();
  }
  // Step k (< num_steps) from its staging buffer into K tile k % 2 (the tile free), then step
  // k + 2 into the staging buffer that frees.
  auto convert_step = [&](int k) {
    sm80::cp_async_wait<1>();  // step k's scales (this thread's); before step 0 also Q
    mbar_wait(bar0 + 8 * (k & 1), (k >> 1) & 1);
    __syncwarp();  // a row's scales, copied by its first thread, to the row's 8 threads
    dequant(k);
    fence_proxy_async_smem();  // K (and Q) generic stores -> wgmma; staging reads -> bulk copies
    __syncwarp();              // a row is read by its own warp only: its buffer may be refilled
    if (k + 2 < num_steps) gather(k + 2);
    sm80::cp_async_commit();
  };
  if (num_steps > 0) {
    convert_step(0);
    __syncthreads();
  }

  // ---- main loop: one step of 32 keys --------------------------------------------------------
  for (int j = 0; j < num_steps; ++j) {
    const int kt = j % Cfg::kKTiles;
    // S = Q K^T over this warpgroup's 256 dims
    float sc[16];
    {
      const sm90::SmemDesc qg = q_desc.plus(4 * wg * Cfg::kQBlockBytes);
      const sm90::SmemDesc kg = k_desc.plus(kt * Cfg::kKBytes + 4 * wg * Cfg::kKBlockBytes);
      sm90::wgmma_fence();
#pragma unroll
      for (int st = 0; st < 16; ++st) {
        const uint32_t within = 32 * (st % 4);
        sm90::wgmma_m64n32k16_bf16(sc, qg.at((st / 4) * Cfg::kQBlockBytes + within), kg.at((st / 4) * Cfg::kKBlockBytes + within), st > 0);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_accumulators(sc);
    }
    sparse::m64::sum_partial_s(sc, s_red, wg, tid_wg);
    float corr[2];
    sparse::m64::online_softmax(sc, s_valid + (j & 3) * kStep, qd, row_scale, m_run, l_run, corr);
    // P in bf16 as the A fragments of 2 k-steps of 16 keys (the accumulator layout is the A
    // fragment layout), O rescaled only when a row maximum moved, then 2 x 2 wgmma.
    uint32_t pa[2][4];
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
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
      const sm90::SmemDesc vv = v_desc.plus(kt * Cfg::kKBytes + 2 * (2 * wg + v) * Cfg::kKBlockBytes);
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) sm90::wgmma_m64n128k16_rs_mn<true>(o[v], pa[ks], vv.at(ks * 16 * 128));
    }
    sm90::wgmma_commit();
    // Under the P V MMAs: step j + 1 into the other K tile (free: step j - 1's P V were waited for
    // before the last barrier), then step j + 3 into the staging buffer that frees.
    if (j + 1 < num_steps) convert_step(j + 1);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(o);
    __syncthreads();  // K tile j + 1 complete; both warpgroups done with K tile j and the partial S
  }

  // ---- epilogue: normalised, sink, to out / partials ------------------------------------------
  const float no_v_scale[2] = {1.f, 1.f};
  sparse::m64::store_rows(p, whole, bs, b, s, token.partial_row0, h0, r_lo, wg, qd, m_run, l_run, o, no_v_scale);
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
  V4FusedParams params = fp;
  for (int i = 0; i < 2; ++i) {
    MLA_HOST_CHECK(fp.pool[i].topk == 0 || (fp.pool[i].block_size >= 1 && fp.pool[i].num_slots < (int64_t{1} << 31)),
                   "cache pages of 1 .. 2^31 - 1 tokens");
    params.block_div[i] = FastDivmod(static_cast<int32_t>(fp.pool[i].topk > 0 ? fp.pool[i].block_size : 1));
  }
  auto kernel = sparse_decode_sm90_v4_kernel;
  opt_in_smem(reinterpret_cast<const void*>(kernel), V4Config::kSmemBytes, device);
  launch_dependent(kernel, dim3((p.h_q + V4Config::kM - 1) / V4Config::kM, 1, sparse_grid_z(p)), dim3(V4Config::kThreads),
                   V4Config::kSmemBytes, p.stream, params);
  if (p.num_splits > 1) run_sparse_combine(p, device_info(device).num_sms);
}

}  // namespace mla
