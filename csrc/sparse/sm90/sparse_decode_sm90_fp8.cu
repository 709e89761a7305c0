// Sparse top-k MLA decode on sm90a: fp8_ds_mla cache, 64-head tiles, wgmma.
//
// Same contract and grid as the portable 64-head kernel (csrc/sparse/README.md): one CTA = one
// query token, 64 heads, one split of the top-k list; 256 threads; 64-key tiles gathered into one
// staging buffer (one cp.async.bulk per 656-byte row, lanes 0-7 of every warp, completion counted
// by an mbarrier), then dequantised e4m3 -> fp16 (exact, no scale) into one K tile. What changes is the
// math, which the portable kernel runs as mma.sync with ldmatrix of both operands per warp
// (Nsight Compute: issue-bound around shared loads, ~430 KB of operand reads per tile):
//
//   S = Q K^T   warpgroup g (threads 128 g ..) takes the dims of scale tiles 2g, 2g + 1 and
//               rope dims 32 g .. + 31 for all 64 heads x 64 keys: wgmma m64n64k16 with both
//               operands in shared memory (read once per warpgroup by the hardware). Each
//               scale tile accumulates on its own and is multiplied by its keys' fp32 scale
//               (scales stay out of the operands, as in the portable kernel); rope (bf16) adds
//               unscaled. The two warpgroups' partial S meet through shared memory (each thread
//               reads the other warpgroup's value at its own position), so both then hold the
//               full S and run the same softmax: a row's 64 keys sit in one quad of lanes, the
//               row max needs two shuffles and no barrier.
//   O += P V    warpgroup g owns output columns 256 g .. + 255 (value scale tiles 2g, 2g + 1),
//               O in registers (2 x 64 fp32 per thread). A = P' = P scale[k, vt] / R_vt in fp16
//               straight from the softmax registers (the accumulator layout is the A fragment
//               layout), B = V read from the same fp16 K tile as an MN-major operand. R_vt is
//               the running scale reference of the portable kernel (e4m3::update_scale_ref).
//
// Shared memory: Q and K as 9 blocks of [64 rows][64 dims] in the 128-byte swizzle (blocks 0-7
// kv_c in fp16, block 8 rope in bf16), the staging rows, the partial S of both warpgroups.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/e4m3.cuh"
#include "common/mbarrier.cuh"
#include "common/pdl.cuh"
#include "common/sm80.cuh"
#include "common/sm90/wgmma.cuh"
#include "common/types.h"
#include "sparse/portable/sparse_decode_portable.cuh"  // shared pieces: key_tiles, load_q_tile, slot_row, dequant_ds_mla_rows, ...
#include "sparse/sm90/m64_tile.cuh"                     // partial S exchange, online softmax, epilogue
#include "sparse/sparse_decode.h"

namespace mla::sparse {

// This kernel's bulk row gather: as bulk_ds_mla_row_or_zero_row (portable header) for a valid slot, an
// invalid row zero-filled by its thread with generic stores (the kernel fences the async proxy after every
// tile's dequantisation) and an arrival without bytes. (Through the zero row this kernel measured ~2.5%
// slower at b128 h_q 64 in a same-run A/B with every slot valid, i.e. from the code the compiler made
// of it, not from zero-row copies.)
__device__ __forceinline__ void bulk_ds_mla_row_or_zero_fill(const SparseDecodeParams& p, const uint8_t* cache, int32_t slot,
                                                             bool ok, uint32_t block_size32, uint8_t* dst_row, uint32_t bar) {
  if (ok) {
    mbar_arrive_expect_tx(bar, kDsMlaRowBytes);
    bulk_load(sm80::smem_addr(dst_row), slot_row(p, cache, slot, true, block_size32), kDsMlaRowBytes, bar);
  } else {
#pragma unroll 1
    for (int c = 0; c < kDsMlaRowBytes / 16; ++c) reinterpret_cast<uint4*>(dst_row)[c] = make_uint4(0u, 0u, 0u, 0u);
    mbar_arrive(bar);
  }
}

struct Sm90Fp8Config {
  static constexpr int kM = 64;         // heads per CTA
  static constexpr int kN = 64;         // keys per tile
  static constexpr int kThreads = 256;  // 2 warpgroups
  static constexpr int kBlockBytes = 64 * 128;          // [64 rows][64 dims] 16-bit, one swizzle block
  static constexpr int kTileBytes = 9 * kBlockBytes;    // 576 dims
  static constexpr int kRawBytes = kN * kDsMlaRowBytes;  // one staging tile of 656-byte rows
  static constexpr int kRedBytes = 2 * 32 * 128 * 4;    // partial S: [warpgroup][32 values][128 threads] fp32
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kTileBytes;
  static constexpr int kOffRaw = kOffK + kTileBytes;
  static constexpr int kOffRed = kOffRaw + kRawBytes;
  static constexpr int kOffScale = kOffRed + kRedBytes;  // [4 scale tiles][64 keys] fp32 of the K tile
  static constexpr int kOffValid = kOffScale + 4 * kN * 4;  // [2][64] int: tiles alternate (gather of t + 1 during t)
  static constexpr int kOffRowExp = kOffValid + 2 * kN * 4;  // [64] int: q row exponents
  static constexpr int kOffBar = kOffRowExp + kM * 4;         // mbarrier of the staging tile (bulk gather)
  // + 1 KiB so that the base can be rounded up to the 1024 bytes the swizzle atoms need
  static constexpr int kSmemBytes = kOffBar + 8 + 1024;
  static_assert(kOffK % 1024 == 0 && kOffRaw % 16 == 0 && kOffRed % 16 == 0 && kOffBar % 8 == 0, "alignment");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90");
};

// Byte offset of 16-byte chunk c (8 dims, 0..71) of row r in a Q or K tile: block c / 8, row r
// of 128 bytes, chunk c % 8 XOR-swizzled by r % 8 (what the wgmma descriptors' 128-byte swizzle
// expects on 1024-byte aligned blocks).
__device__ __forceinline__ uint32_t sw128_off(int r, int c) {
  return static_cast<uint32_t>((c / 8) * Sm90Fp8Config::kBlockBytes + r * 128 + (((c % 8) ^ (r % 8)) * 16));
}

// Rows gathered by one cp.async.bulk per row (64 threads issue, an mbarrier counts the bytes)
// instead of 41 16-byte cp.async per row spread over 8 threads: Nsight Compute showed the cp.async
// issue (LSU queue full: mio stalls, and the register reuse after it) as ~25% of the stall samples;
// measured 621.5 vs 650.9 us (b128 s_q2 h_q128, same run). The compiler serialises a warp's copies
// (the copy takes uniform-register operands): from threads 0-63 before the S MMAs they delayed
// warpgroup 0's S (~20% of the stall samples); now 8 per warp, issued while the first S MMAs run
// (606 / 617 -> 578 / 595 us).
__global__ void __launch_bounds__(Sm90Fp8Config::kThreads, 1)
    sparse_decode_sm90_fp8_kernel(const __grid_constant__ SparseDecodeParams p) {
#if MLA_SM90A
  using Cfg = Sm90Fp8Config;
  constexpr int kN = Cfg::kN;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = sm90::align_to_swizzle_atom(smem_raw);
  uint8_t* s_q = smem + Cfg::kOffQ;
  uint8_t* s_k = smem + Cfg::kOffK;
  uint8_t* s_raw = smem + Cfg::kOffRaw;
  float* s_red = reinterpret_cast<float*>(smem + Cfg::kOffRed);
  float* s_scale = reinterpret_cast<float*>(smem + Cfg::kOffScale);
  int* s_valid = reinterpret_cast<int*>(smem + Cfg::kOffValid);
  int* s_row_exp = reinterpret_cast<int*>(smem + Cfg::kOffRowExp);
  const uint32_t bar = sm80::smem_addr(smem + Cfg::kOffBar);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // warpgroup (through a shuffle, so that the compiler knows it is warp-uniform and keeps the
  // wgmma descriptors derived from it in uniform registers), thread and warp within it
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), tid_wg = tid % 128, wq = warp % 4;
  const int qd = lane % 4;
  const int h0 = blockIdx.x * Cfg::kM;
  // A programmatic dependent, as the portable kernels (common/pdl.cuh).
  pdl_wait_prerequisites();
  pdl_launch_dependents();
  const CtaWork work = cta_work(p, kN);
  const int bs = work.bs, b = work.b, s = work.s;
  const bool whole = work.whole;
  const int num_keys = work.num_keys, tile_begin = work.tile_begin, num_tiles = work.num_tiles;
  const uint8_t* cache = static_cast<const uint8_t*>(p.kv_cache);

  // ---- loaders ------------------------------------------------------------------------------
  auto load_q = [&]() { load_q_tile<Cfg::kM, Cfg::kThreads>(p, b, s, h0, tid, s_q, [](int r, int c) { return sw128_off(r, c); }); };
  // Row gather into the staging tile; invalid keys are zero-filled and never read. Each thread's
  // slots of the next tile are fetched after its copies (fetch_slot_ahead). Lane l < 8 of warp w
  // copies row 8 w + l (a warp issues its bulk copies one lane after the other, ~90 cycles apart:
  // 8 rows per warp fit in the S MMAs of the current tile, during which they are issued).
  constexpr int kBulkLanes = kN / (Cfg::kThreads / 32);
  static_assert(kBulkLanes * (Cfg::kThreads / 32) == kN, "bulk rows: the same number per warp");
  const bool bulk_lane = lane < kBulkLanes;
  const int load_row = kBulkLanes * warp + lane;
  auto fetch_slot = [&](int tile) { return fetch_slot_ahead(work.idx_row, tile * kN + load_row, num_keys); };
  int32_t next_slot = bulk_lane ? fetch_slot(tile_begin) : -1;
  const uint32_t block_size32 = block_size_u32(p);
  auto load_tile = [&](int tile, int valid_slot) {
    // Row load_row whole; an invalid row is zero-filled here (the dequantised tile must stay
    // finite: P = 0 times V must be 0). Every row's lane arrives once (the barrier counts 64
    // arrivals); valid rows add their bytes as transactions.
    if (bulk_lane) {
      const int32_t slot = next_slot;
      const bool ok = slot >= 0 && slot < p.num_slots;
      s_valid[valid_slot * kN + load_row] = ok;
      // (no fence here: every thread fences the async proxy after the tile's dequantisation)
      bulk_ds_mla_row_or_zero_fill(p, cache, slot, ok, block_size32, s_raw + load_row * kDsMlaRowBytes, bar);
      next_slot = fetch_slot(tile + 1);
    }
  };
  // Staging -> K tile (dequant_ds_mla_rows, in the wgmma layout); the 4 scales per key go to
  // s_scale[tile][key] (keys of one tile adjacent: the accumulator layout reads them in pairs).
  auto dequant_tile = [&]() {
    dequant_ds_mla_rows<kN, Cfg::kThreads / 32, Cfg::kThreads>(s_raw, s_k, warp, lane, tid, [](int r, int c) { return sw128_off(r, c); });
    if (tid < kN) {
      const float4 sc = *reinterpret_cast<const float4*>(s_raw + tid * kDsMlaRowBytes + kDsMlaScaleOffset);
      s_scale[0 * kN + tid] = sc.x;
      s_scale[1 * kN + tid] = sc.y;
      s_scale[2 * kN + tid] = sc.z;
      s_scale[3 * kN + tid] = sc.w;
    }
  };

  // ---- per-thread state --------------------------------------------------------------------
  // Accumulator layout (m64nN, both S and O): element 4 i + e of a thread is row
  // 16 wq + lane / 4 + 8 (e / 2), column 8 i + 2 qd + e % 2. A thread's two rows:
  const int r_lo = 16 * wq + lane / 4;
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float row_scale[2] = {scale_log2, scale_log2};  // times 2^e of the row (q normalisation)
  float m_run[2] = {-INFINITY, -INFINITY};        // running max, log2 domain
  float l_run[2] = {0.f, 0.f};                    // this thread's share of the row sum
  float o[2][64];                                 // O of value scale tiles 2 wg, 2 wg + 1 (128 columns each)
#pragma unroll
  for (int v = 0; v < 2; ++v)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[v][i] = 0.f;
  float v_ref[2] = {0.f, 0.f}, v_inv[2] = {0.f, 0.f};  // R_vt and 1 / R_vt of the two value tiles

  // Descriptor bases (constant high word, one add per MMA): Q and K K-major; V = the K tile's
  // first 512 dims as an MN-major operand (64-dim blocks 8 KiB apart, 8-key groups 1 KiB apart).
  const sm90::SmemDesc q_desc = sm90::kmajor_sw128(sm80::smem_addr(s_q)), k_desc = sm90::kmajor_sw128(sm80::smem_addr(s_k));
  const sm90::SmemDesc v_desc = sm90::mnmajor_sw128(sm80::smem_addr(s_k), Cfg::kBlockBytes, 1024);

  // One 64-key tile (K tile, s_scale and validity slot `vs` ready; all threads). issue_next() runs
  // once the first S MMAs are committed: the next tile's bulk copies go out while they run.
  auto compute_tile = [&](int vs, auto&& issue_next) {
    // S partial of this warpgroup's dims: scale tiles tA = 2 wg and tB = 2 wg + 1 (dims 128 t ..
    // + 127 = blocks 2t, 2t + 1), each multiplied by its keys' scales, plus rope dims 32 wg .. + 31
    // (bf16, unscaled).
    float sc[32], acc[32];
    const int tA = 2 * wg, tB = 2 * wg + 1;
    auto issue_tile = [&](float (&d)[32], int t) {
      const sm90::SmemDesc qt = q_desc.plus(2 * t * Cfg::kBlockBytes), kt = k_desc.plus(2 * t * Cfg::kBlockBytes);
#pragma unroll
      for (int st = 0; st < 8; ++st) {
        const uint32_t off = (st / 4) * Cfg::kBlockBytes + 32 * (st % 4);
        sm90::wgmma_m64n64k16_f16(d, qt.at(off), kt.at(off), st > 0);
      }
    };
    auto issue_rope = [&]() {
      const uint32_t base = 8 * Cfg::kBlockBytes + 64 * wg;  // rope dims 32 wg .. + 31
      const sm90::SmemDesc qr = q_desc.plus(base), kr = k_desc.plus(base);
#pragma unroll
      for (int j = 0; j < 2; ++j) sm90::wgmma_m64n64k16_bf16(sc, qr.at(32 * j), kr.at(32 * j), j > 0);
    };
    // Scales of tile t for the keys of n8 tile i of this thread (keys 8 i + 2 qd, + 1).
    auto key_scales = [&](int t, int i) { return *reinterpret_cast<const float2*>(s_scale + t * kN + 8 * i + 2 * qd); };
    sm90::wgmma_fence();
    // rope first, straight into sc; then each scale tile into acc, drained and folded in.
    issue_rope();
#pragma unroll
    for (int tt = 0; tt < 2; ++tt) {
      const int t = tt == 0 ? tA : tB;
      if (tt > 0) sm90::wgmma_fence();
      issue_tile(acc, t);
      sm90::wgmma_commit();
      if (tt == 0) issue_next();
      sm90::wgmma_wait<0>();
      sm90::fence_accumulators(sc);
      sm90::fence_accumulators(acc);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float2 ks = key_scales(t, i);
        sc[4 * i + 0] = fmaf(acc[4 * i + 0], ks.x, sc[4 * i + 0]);
        sc[4 * i + 1] = fmaf(acc[4 * i + 1], ks.y, sc[4 * i + 1]);
        sc[4 * i + 2] = fmaf(acc[4 * i + 2], ks.x, sc[4 * i + 2]);
        sc[4 * i + 3] = fmaf(acc[4 * i + 3], ks.y, sc[4 * i + 3]);
      }
    }
    // Full S (m64::sum_partial_s), then the online softmax. (Unscaled scores with one fma(s, rs, -m)
    // per key saved 32 FMULs, but the exact product s rs sits up to an ulp of m away from m, 16 at
    // |m| ~ 2^27: the max key's P came out anywhere in 2^-16 .. 2^8, which overflowed P' in fp16 or
    // left it subnormal, and the output then differed from the spec's: cosine difference 0.2.)
    m64::sum_partial_s(sc, s_red, wg, tid_wg);
    float corr[2];
    m64::online_softmax(sc, s_valid + vs * kN, qd, row_scale, m_run, l_run, corr);
    // Per value tile: R update (warp vote), O rescale (skipped when nothing changed), P' in fp16,
    // 4 wgmma k-steps of 16 keys. The second tile's P' is built while the first's wgmma run.
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int vt = 2 * wg + v;
      float v_rescale;
      e4m3::update_scale_ref(s_scale[vt * kN + lane], s_scale[vt * kN + lane + 32], v_ref[v], v_rescale, v_inv[v]);
      const float c0 = corr[0] * v_rescale, c1 = corr[1] * v_rescale;
      if (!__all_sync(0xffffffffu, c0 == 1.f && c1 == 1.f)) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          o[v][4 * i + 0] *= c0;
          o[v][4 * i + 1] *= c0;
          o[v][4 * i + 2] *= c1;
          o[v][4 * i + 3] *= c1;
        }
      }
      uint32_t pa[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 2 * ks + half;  // n8 tile of S = keys 8 i .. + 7
          const float2 f = *reinterpret_cast<const float2*>(s_scale + vt * kN + 8 * i + 2 * qd);
          const float f0 = f.x * v_inv[v], f1 = f.y * v_inv[v];
          pa[ks][2 * half + 0] = sm80::pack2<__half>(sc[4 * i + 0] * f0, sc[4 * i + 1] * f1);
          pa[ks][2 * half + 1] = sm80::pack2<__half>(sc[4 * i + 2] * f0, sc[4 * i + 3] * f1);
        }
      }
      sm90::fence_accumulators(o[v]);
      sm90::wgmma_fence();
      const sm90::SmemDesc vv = v_desc.plus(2 * vt * Cfg::kBlockBytes);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        // V: keys 16 ks .. + 15 (rows of the K tile), columns 128 vt .. + 127 = blocks 2 vt, 2 vt + 1.
        sm90::wgmma_m64n128k16_rs_mn<false>(o[v], pa[ks], vv.at(ks * 16 * 128));
      }
      sm90::wgmma_commit();
    }
    sm90::wgmma_wait<0>();  // K and s_scale are rewritten after the next barrier
    sm90::fence_accumulators(o);
  };

  // ---- main loop ----------------------------------------------------------------------------
  // One staging buffer: tile t + 1's rows are in flight while tile t computes.
  if (tid == 0) {
    mbar_init(bar, kN);
    mbar_init_fence();
  }
  __syncthreads();
  if (num_tiles > 0) load_q();
  sm80::cp_async_commit();
  if (num_tiles > 0) load_tile(tile_begin, 0);
  sm80::cp_async_commit();
  if (num_tiles > 0) {
    sm80::cp_async_wait<1>();  // this thread's Q chunks
    __syncthreads();
    normalise_q_rows<Cfg::kM, Cfg::kThreads / 32>(s_q, s_row_exp, warp, lane, [](int r, int c) { return sw128_off(r, c); });
    __syncthreads();
    row_scale[0] = ldexpf(scale_log2, s_row_exp[r_lo]);
    row_scale[1] = ldexpf(scale_log2, s_row_exp[r_lo + 8]);
  }
  for (int t = 0; t < num_tiles; ++t) {
    mbar_wait(bar, t & 1);  // tile t's rows (phase t of the barrier)
    __syncthreads();  // staging holds tile t; everyone is done with K of tile t - 1
    dequant_tile();
    fence_proxy_async_smem();  // the generic stores of K (and of q') -> wgmma's async proxy
    __syncthreads();                 // K holds tile t; staging is free
    // Tile t + 1's rows into the staging buffer: bulk copies from inside compute_tile, after its
    // first S MMAs are committed (issued before them, the copies held back the issuing warps'
    // warpgroup, and the other one waited for it at the S exchange).
    const bool load_next = t + 1 < num_tiles;
    compute_tile(t & 1, [&] {
      if (load_next) load_tile(tile_begin + t + 1, (t + 1) & 1);
    });
  }

  // ---- epilogue: O times R_vt, normalised, sink, to out / partials ----------------------------
  m64::store_rows(p, whole, bs, b, s, work.partial_row0, h0, r_lo, wg, qd, m_run, l_run, o, v_ref);
#endif
}

int sm90_fp8_m64_smem_bytes() { return Sm90Fp8Config::kSmemBytes; }

void launch_sparse_decode_sm90_fp8_m64(const SparseDecodeParams& p) {
  using Cfg = Sm90Fp8Config;
  auto kernel = sparse_decode_sm90_fp8_kernel;
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  opt_in_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, device);
  launch_dependent(kernel, dim3((p.h_q + Cfg::kM - 1) / Cfg::kM, 1, sparse_grid_z(p)), dim3(Cfg::kThreads),
                   Cfg::kSmemBytes, p.stream, p);
}

}  // namespace mla::sparse
