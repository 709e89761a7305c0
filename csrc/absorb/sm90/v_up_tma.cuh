// v_up on sm90a with a TMA producer warp and wgmma consumer warpgroups: the head's whole weight
// resident, [BM, 64] pieces of x streaming through kStages shared-memory stages that are loaded by
// cp.async.bulk.tensor and handed over with mbarriers (no CTA-wide barrier in the main loop).
// README.md (one level up) has the picture.
//
// Grid = (m_splits, H): one wave, m_splits = min(tiles, max(1, num_SMs / H)); CTA (z, h) owns head
// h and the BM-row tiles z, z + m_splits, ... Threads: BM / 64 consumer warpgroups (warpgroup g
// computes rows [64 g, 64 g + 64) of a tile over all N = 128 columns), then one producer warp.
//   producer (one lane): bf16 weights as 8 TMA loads of [128 n, 64 k] tiles, each on its own
//     barrier, tile kc with the first tile's piece kc (schedules below); for every piece, wait
//     until the piece `ahead` before it has been consumed (which frees its stage), announce the
//     bytes on the stage's "full" barrier and issue the TMA load of x[tile rows, h, 64 k].
//     Schedules (TmaVUpSchedule, absorb_gemm.h): kDefault requests the rest of the weight right
//     behind the first kStages pieces (all before the first wait; what small T waits for);
//     kPaced keeps the first tile to 4 pieces (weight + x) ahead, the weight riding with them.
//   consumers: e4m3 weights are first dequantised into the weight tiles by the consumer threads
//     (never to global memory) while the producer already streams x; then per piece: wait "full",
//     4 wgmma m64n128k16 (both operands from shared memory), keep one wgmma group in flight and
//     release the previous piece's stage ("empty", one arrival per consumer warp); after a tile's
//     8th piece the accumulators go straight to global memory: a 4 x 4 transpose of bf16 pairs
//     inside each quad of lanes gives every lane 16 contiguous bytes, so each row is written in
//     whole 32-byte sectors and no shared-memory staging takes room from the stages.
// Why: the cp.async kernel (v_up_wgmma.cuh) keeps 3 pieces (48 KiB) in flight per SM behind a
// __syncthreads per piece; here (BM = 128) 6 pieces (96 KiB) are in flight, each refilled as soon
// as it is consumed, and the loads cost one instruction per piece instead of 4 per thread. 64-row
// tiles (one consumer warpgroup, 12 stages of 8 KiB) give a few heads' short inputs more CTAs.
// Measured and not kept (H200, README.md): N split over 2 CTAs (BN = 64; 1 CTA per SM with 10
// stages, or 2 per SM with 4), and bf16 weights by cp.async from the consumers instead of TMA:
// each lost at most sizes to the shapes here or to the other kernels; at H = 128, T = 256 the k
// pieces walked from h % 8 on (so that the heads' requests spread over the DRAM pages) and L2
// evict_first policies on the loads were 0.1-0.7 us slower.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "absorb/absorb.h"
#include "absorb/absorb_common.cuh"
#include "absorb/absorb_gemm.h"
#include "common/sm90/tma.cuh"
#include "common/sm90/wgmma.cuh"
#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/sm80.cuh"

namespace mla::absorb {

template <bool kFp8_, int kConsumers_>
struct TmaVUpConfig {
  static constexpr bool kFp8 = kFp8_;
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups, 64 rows each
  static constexpr int BM = 64 * kConsumers, N = kVHeadDim, K = kKvLoraRank, BK = 64;
  static constexpr int kChunks = K / BK;                  // 8 pieces per tile
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
  static constexpr int kWChunkBytes = N * BK * 2;         // one [128 n, 64 k] weight tile: 16 KiB
  static constexpr int kWBytes = kChunks * kWChunkBytes;  // 128 KiB, resident
  static constexpr int kABytes = BM * BK * 2;             // one stage: [BM, 64] bf16
  static constexpr int kStages = 96 * 1024 / kABytes;     // the rest of 227 KiB: 6 or 12 stages
  static constexpr int kAOffset = kWBytes;
  // barriers: full[kStages], empty[kStages], then w_full[kChunks] (bf16 weight tiles)
  static constexpr int kBarOffset = kAOffset + kStages * kABytes;
  // + 1 KiB so that the base can be rounded up to the 1024 bytes the swizzle atoms need
  static constexpr int kSmemBytes = kBarOffset + (2 * kStages + kChunks) * 8 + 1024;
  static_assert(kConsumers == 1 || kConsumers == 2);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90");
};

// The kernel's parameters: the tensor maps must live in kernel parameter space (__grid_constant__).
struct TmaVUpParams {
  CUtensorMap x_map;  // x as [T][H][512] bf16, box [BM][1][64]
  CUtensorMap w_map;  // bf16 weights as [H * 128][512], box [128][64] (unused for e4m3)
  AbsorbParams p;
  // The resident-weight kernel's producer schedule (TmaVUpSchedule, set by the launcher; the
  // streamed-weight kernel ignores it):
  int first_ahead = 0;  // bf16 weights: pieces of the first tile in flight ahead of the consumers
  int later_ahead = 0;  // pieces of later tiles (and of all tiles with e4m3 weights) in flight
  int pace_weight = 0;  // 1: bf16 weight tile kc goes out with the first tile's piece kc only;
                        // 0: the rest of the weight right behind the first first_ahead pieces
};

// Lane q of a quad holds bf16 pairs a[i] = columns 8 (4 j + i) + 2 q, +1 of one row (i = 0..3);
// afterwards out[s] = columns 8 (4 j + q) + 2 s, +1: the 16 contiguous bytes of chunk 4 j + q.
__device__ __forceinline__ void quad_transpose(const uint32_t (&a)[4], uint32_t (&out)[4], int q) {
  out[0] = a[0], out[1] = a[1], out[2] = a[2], out[3] = a[3];  // r = 0: out[q] = a[q]
  uint32_t mine = q == 0 ? a[0] : q == 1 ? a[1] : q == 2 ? a[2] : a[3];
#pragma unroll
  for (int r = 1; r < 4; ++r) {
    const int partner = q ^ r;  // it needs my a[partner]; I need its a[q]
    const uint32_t send = partner == 0 ? a[0] : partner == 1 ? a[1] : partner == 2 ? a[2] : a[3];
    const uint32_t got = __shfl_xor_sync(0xffffffffu, send, r);
    if (partner == 0) out[0] = got;
    if (partner == 1) out[1] = got;
    if (partner == 2) out[2] = got;
    if (partner == 3) out[3] = got;
  }
  if (q == 0) out[0] = mine;
  if (q == 1) out[1] = mine;
  if (q == 2) out[2] = mine;
  if (q == 3) out[3] = mine;
}

// Epilogue of one warpgroup's m64nBN fp32 accumulators (BN = 32, 64, 128; rows row0 .. row0 + 63
// of c, those below num_tokens, columns 0 .. BN - 1 of c_head): bf16 pairs, a 4 x 4 transpose inside each quad of lanes, then one 16-byte
// store per lane and 8 columns, so each row is written in whole 32-byte sectors. The SASS must
// show STG.E.128 only (a helper version of this once compiled to 4-byte stores: check with
// cuobjdump -sass after changes).
template <int BN = 128>
__device__ __forceinline__ void store_acc_m64n128(const float (&acc)[BN / 2], __nv_bfloat16* c_head, int64_t row0,
                                                  int64_t num_tokens, int64_t stride_c_token, int tid_wg) {
  const int lane = tid_wg % 32, q = lane % 4, row_in_wg = (tid_wg / 32) * 16 + lane / 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t t = row0 + row_in_wg + 8 * half;
    __nv_bfloat16* row = c_head + t * stride_c_token;
#pragma unroll
    for (int j = 0; j < BN / 32; ++j) {
      uint32_t pairs[4], chunk[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        pairs[e] = sm80::pack2<__nv_bfloat16>(acc[4 * (4 * j + e) + 2 * half], acc[4 * (4 * j + e) + 2 * half + 1]);
      quad_transpose(pairs, chunk, q);
      if (t < num_tokens) *reinterpret_cast<uint4*>(row + 8 * (4 * j + q)) = make_uint4(chunk[0], chunk[1], chunk[2], chunk[3]);
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) v_up_tma_kernel(const __grid_constant__ TmaVUpParams args) {
#if MLA_SM90A
  using namespace sm80;
  using namespace sm90;
  constexpr int BM = Cfg::BM, N = Cfg::N, BK = Cfg::BK, kChunks = Cfg::kChunks, kStages = Cfg::kStages;
  const AbsorbParams& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_to_swizzle_atom(smem_raw);
  const uint32_t smem_w = smem_addr(smem);          // 8 x [128 n][8 chunks], swizzled
  const uint32_t smem_a = smem_w + Cfg::kAOffset;   // kStages x [BM rows][8 chunks], swizzled
  const uint32_t full_bar = smem_w + Cfg::kBarOffset, empty_bar = full_bar + kStages * 8;
  const uint32_t w_bar = empty_bar + kStages * 8;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.y;
  const int m_split = blockIdx.x, m_splits = gridDim.x;
  const int64_t num_tokens = p.num_tokens;
  const int num_tiles = static_cast<int>((num_tokens + BM - 1) / BM);
  const int my_tiles = m_split < num_tiles ? (num_tiles - 1 - m_split) / m_splits + 1 : 0;
  const int total_steps = my_tiles * kChunks;  // pieces, for the producer

  if (warp == 4 * Cfg::kConsumers && lane == 0) {
    prefetch_tensor_map(&args.x_map);
    if (!Cfg::kFp8) prefetch_tensor_map(&args.w_map);
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);                      // the producer's arrive + the TMA bytes
      mbar_init(empty_bar + 8 * s, 4 * Cfg::kConsumers);  // one arrival per consumer warp
    }
    for (int kc = 0; kc < kChunks; ++kc) mbar_init(w_bar + 8 * kc, 1);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == 4 * Cfg::kConsumers) {
    // ---- producer warp: one lane issues every load
    if (lane == 0 && total_steps > 0) {
      auto load_w = [&](int kc) {
        mbar_arrive_expect_tx(w_bar + 8 * kc, Cfg::kWChunkBytes);
        tma_load_2d(smem_w + kc * Cfg::kWChunkBytes, &args.w_map, w_bar + 8 * kc, kc * BK, h * N);
      };
      int w_next = 0;   // the next bf16 weight tile to load
      int waited = -1;  // pieces up to this one are known to be consumed
#pragma unroll 1
      for (int step = 0; step < total_steps; ++step) {
        const int stage = step % kStages, kc = step % kChunks;
        const int tile = m_split + (step / kChunks) * m_splits;
        // Piece `step` goes out once piece step - ahead has been consumed. ahead <= kStages, so
        // its stage is free then too, and the awaited phase of that piece's "empty" barrier
        // cannot have been overtaken by a later one (which would make the parity wait hang).
        const int ahead = !Cfg::kFp8 && step < kChunks ? args.first_ahead : args.later_ahead;
        if (step - ahead > waited) {
          waited = step - ahead;
          mbar_wait(empty_bar + 8 * (waited % kStages), (waited / kStages) & 1);
        }
        if (!Cfg::kFp8 && w_next == step && w_next < kChunks) load_w(w_next++);  // with its piece
        mbar_arrive_expect_tx(full_bar + 8 * stage, Cfg::kABytes);
        tma_load_3d(smem_a + stage * Cfg::kABytes, &args.x_map, full_bar + 8 * stage, kc * BK, h, tile * BM);
        // unpaced: the rest of the weight right behind the first round of pieces, all requested
        // before the first wait (what small T waits for)
        if (!Cfg::kFp8 && !args.pace_weight && (step + 1 == ahead || step + 1 == total_steps))
          while (w_next < kChunks) load_w(w_next++);
      }
    }
    return;
  }

  // ---- consumer warpgroups
  const int wg = warp / 4, tid_wg = tid % 128;
  if constexpr (Cfg::kFp8) {
    dequant_w_uv_sw128<Cfg::kConsumerThreads>(smem, static_cast<const uint8_t*>(p.w) + int64_t(h) * N * Cfg::K,
                                              p.w_scale + h * kNumLatentBlocks, tid);
    fence_proxy_async_smem();  // st.shared weights -> visible to wgmma, then across the consumers
    named_barrier(1, Cfg::kConsumerThreads);
  }

  auto* c_head = static_cast<__nv_bfloat16*>(p.c) + h * p.stride_c_head;
  float acc[N / 2];
  for (int i = 0; i < my_tiles; ++i) {
    fence_accumulators(acc);
    // The 8 pieces of a tile unrolled: straight-line code lets the compiler see that the
    // accumulators are read only after the final wait (else it inserts waits of its own).
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      const int step = i * kChunks + kc, stage = step % kStages;
      if (!Cfg::kFp8 && i == 0) mbar_wait(w_bar + 8 * kc, 0);
      mbar_wait(full_bar + 8 * stage, (step / kStages) & 1);
      const uint32_t a_stage = smem_a + stage * Cfg::kABytes + wg * (64 * 128);
      const uint32_t w_tile = smem_w + kc * Cfg::kWChunkBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma_m64n128k16_bf16(acc, kmajor_sw128_desc(a_stage + kk * 32), kmajor_sw128_desc(w_tile + kk * 32), kc > 0 || kk > 0);
      wgmma_commit();
      // every group but this one is done: the previous piece's stage can be refilled
      wgmma_wait<1>();
      if (kc > 0 && lane == 0) mbar_arrive(empty_bar + 8 * ((step - 1) % kStages));
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (lane == 0) mbar_arrive(empty_bar + 8 * ((i * kChunks + kChunks - 1) % kStages));

    const int64_t tile = m_split + static_cast<int64_t>(i) * m_splits;
    store_acc_m64n128(acc, c_head, tile * BM + wg * 64, num_tokens, p.stride_c_token, tid_wg);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // wgmma and TMA as used here exist on sm_90a only; the host never launches this elsewhere
#endif
}

// The tensor maps of both TMA kernels: x as [T][H][512] with the caller's strides, box
// [kBM rows][1 head][64 k]; bf16 weights as [H * 128][512], box [kBN n][64 k]. Returns false
// where the driver refuses one (strides TMA cannot express).
template <int kBM, int kBN = kVHeadDim>
bool make_v_up_tensor_maps(const AbsorbParams& p, bool fp8, CUtensorMap* x_map, CUtensorMap* w_map) {
  constexpr int K = kKvLoraRank, N = kVHeadDim, BK = 64;
  // Strides of size-1 dims are arbitrary in torch; give the tensor map valid ones.
  const int64_t stride_head = p.num_heads > 1 ? p.stride_a_head : K;
  const int64_t stride_token = p.num_tokens > 1 ? p.stride_a_token : stride_head * p.num_heads;
  const uint64_t x_dims[3] = {uint64_t(K), uint64_t(p.num_heads), uint64_t(p.num_tokens)};
  const uint64_t x_strides[2] = {uint64_t(stride_head) * 2, uint64_t(stride_token) * 2};
  const uint32_t x_box[3] = {uint32_t(BK), 1, uint32_t(kBM)};
  if (stride_head <= 0 || stride_token <= 0) return false;
  if (!sm90::make_bf16_tensor_map(x_map, p.a, 3, x_dims, x_strides, x_box, /*cached=*/false)) return false;
  if (!fp8) {
    const uint64_t w_dims[2] = {uint64_t(K), uint64_t(p.num_heads) * N};
    const uint64_t w_strides[1] = {uint64_t(K) * 2};
    const uint32_t w_box[2] = {uint32_t(BK), uint32_t(kBN)};
    if (!sm90::make_bf16_tensor_map(w_map, p.w, 2, w_dims, w_strides, w_box, /*cached=*/true)) return false;
  }
  return true;
}

// Returns false (launching nothing) where the driver refuses a tensor map, e.g. for strides TMA
// cannot express; the caller then runs another kernel.
template <class Cfg>
bool launch_v_up_tma(const AbsorbParams& p, TmaVUpSchedule schedule) {
  TmaVUpParams args{};
  args.p = p;
  // kPaced (absorb_gemm.h has the why): the first tile's weight tiles go out with its pieces, at
  // most 4 pieces ahead; kDefault: the whole weight with the first round of pieces.
  const bool paced = schedule == TmaVUpSchedule::kPaced;
  args.pace_weight = paced;
  args.first_ahead = paced ? 4 : Cfg::kStages;  // both <= kStages, as the producer needs
  args.later_ahead = Cfg::kStages;
  if (!make_v_up_tensor_maps<Cfg::BM>(p, Cfg::kFp8, &args.x_map, &args.w_map)) return false;
  auto kernel = v_up_tma_kernel<Cfg>;
  opt_in_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, p.device);
  const int64_t num_tiles = (p.num_tokens + Cfg::BM - 1) / Cfg::BM;
  // One wave: as many M splits as leave no SM idle, each CTA loading its head's weights once.
  int64_t m_splits = device_info(p.device).num_sms / p.num_heads;
  m_splits = m_splits < 1 ? 1 : (m_splits > num_tiles ? num_tiles : m_splits);
  MLA_HOST_CHECK(p.num_heads <= 65535, "num_heads must be <= 65535 (grid.y)");
  MLA_HOST_CHECK(p.num_tokens <= (int64_t(1) << 31) - Cfg::BM, "v_up: T too large for the TMA kernel's coordinates");
  const dim3 grid(static_cast<unsigned>(m_splits), static_cast<unsigned>(p.num_heads));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, p.stream>>>(args);
  MLA_CHECK_LAUNCH();
  return true;
}

template <bool kFp8, int kBM>
bool run_v_up_tma(const AbsorbParams& p, TmaVUpSchedule schedule) {
  return launch_v_up_tma<TmaVUpConfig<kFp8, kBM / 64>>(p, schedule);
}

// ---- v_up with the weights streamed next to x (bf16 weights; absorb.cu: T = 17-256 at H < 96,
// T = 33-64 at H >= 96, while the tiles of all heads fit in one wave) ---------------------------
//
// Grid = (ceil(T / BM), 128 / BN, H): CTA (m, nb, h) computes output columns [nb BN, nb BN + BN)
// of head h for BM-row tile m (the kernel also loops over tiles m, m + gridDim.x, ..., which the
// launcher does not use), BM = 64 kConsumers (instantiated: 64, one consumer warpgroup), over the
// 8 k pieces of 64. Each stage holds one piece of the weight ([BN n, 64 k]) and one of x ([BM,
// 64]), both loaded by TMA onto one "full" barrier; with 64-row tiles all 8 stages fit, so the
// CTA's whole working set (BN + 64 rows of 1 KiB) is requested at once. Consumers: wgmma
// m64nBNk16 as in v_up_tma_kernel, epilogue straight from the accumulators (store_acc_m64n128).
// Why: the resident-weight kernels give each CTA all 128 columns of a head (128 KiB of weight
// before its first tile completes), which leaves few heads' small T on few SMs; ksplit spreads
// them but loads by cp.async (24-32 16-byte copies per thread). Here a head's columns spread over
// 128 / BN CTAs (H = 16, T = 128: 128 CTAs of 32 columns, 96 KiB each, the split torch.bmm's
// cuBLAS kernel uses there) and one thread issues 16 TMA loads. Measured and not kept (H200,
// README.md): 128-row tiles, several tiles per CTA with the weight pieces re-streamed from L2
// (looped, one wave), and the weight multicast over clusters of 2 CTAs (persistent, as cuBLAS
// does at H = 128, T = 256): each slower than the resident-weight kernels at T >= 128.
template <int kConsumers_, int kBN>
struct TmaStreamVUpConfig {
  static constexpr bool kFp8 = false;
  static constexpr int kConsumers = kConsumers_;
  static constexpr int BM = 64 * kConsumers, BN = kBN, K = kKvLoraRank, BK = 64;
  static constexpr int kChunks = K / BK;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = kConsumerThreads + 32;
  static constexpr int kWBytes = BN * BK * 2;                  // a stage's weight piece
  static constexpr int kXBytes = BM * BK * 2;                  // ... and x piece, after it
  static constexpr int kStageBytes = kWBytes + kXBytes;        // multiple of 1024
  static constexpr int kStagesFit = 200 * 1024 / kStageBytes;
  static constexpr int kStages = kStagesFit > kChunks ? kChunks : kStagesFit;  // a tile needs at most 8
  static constexpr int kBarOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;
  static_assert(kConsumers == 1 || kConsumers == 2);
  static_assert(BN == 32 || BN == 64 || BN == 128);
  static_assert(kStages >= 2 && kStageBytes % 1024 == 0);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of sm90");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) v_up_tma_stream_kernel(const __grid_constant__ TmaVUpParams args) {
#if MLA_SM90A
  using namespace sm80;
  using namespace sm90;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kChunks = Cfg::kChunks, kStages = Cfg::kStages;
  const AbsorbParams& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_to_swizzle_atom(smem_raw);
  const uint32_t smem_s = smem_addr(smem);  // kStages x ([BN n][8 chunks] weight, [BM][8 chunks] x)
  const uint32_t full_bar = smem_s + Cfg::kBarOffset, empty_bar = full_bar + kStages * 8;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m_split = blockIdx.x, m_splits = gridDim.x, nb = blockIdx.y, h = blockIdx.z;
  const int num_tiles = static_cast<int>((p.num_tokens + BM - 1) / BM);
  const int my_tiles = m_split < num_tiles ? (num_tiles - 1 - m_split) / m_splits + 1 : 0;

  if (warp == 4 * Cfg::kConsumers && lane == 0) {
    prefetch_tensor_map(&args.x_map);
    prefetch_tensor_map(&args.w_map);
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);                      // the producer's arrive + the TMA bytes
      mbar_init(empty_bar + 8 * s, 4 * Cfg::kConsumers);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == 4 * Cfg::kConsumers) {
    // ---- producer warp: one lane issues every load, weight piece then x piece per stage
    if (lane == 0) {
      const int total_steps = my_tiles * kChunks;
#pragma unroll 1
      for (int step = 0; step < total_steps; ++step) {
        const int stage = step % kStages, kc = step % kChunks;
        const int tile = m_split + (step / kChunks) * m_splits;
        const uint32_t dst = smem_s + stage * Cfg::kStageBytes;
        if (step >= kStages) mbar_wait(empty_bar + 8 * stage, ((step / kStages) - 1) & 1);
        mbar_arrive_expect_tx(full_bar + 8 * stage, Cfg::kStageBytes);
        tma_load_2d(dst, &args.w_map, full_bar + 8 * stage, kc * BK, h * kVHeadDim + nb * BN);
        tma_load_3d(dst + Cfg::kWBytes, &args.x_map, full_bar + 8 * stage, kc * BK, h, tile * BM);
      }
    }
    return;
  }

  // ---- consumer warpgroups: rows [64 wg, 64 wg + 64) of each tile
  const int wg = warp / 4, tid_wg = tid % 128;
  auto* c_head = static_cast<__nv_bfloat16*>(p.c) + int64_t(h) * p.stride_c_head + nb * BN;
  float acc[BN / 2];
  for (int i = 0; i < my_tiles; ++i) {
    fence_accumulators(acc);
    // the 8 pieces unrolled, as in v_up_tma_kernel
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      const int step = i * kChunks + kc, stage = step % kStages;
      mbar_wait(full_bar + 8 * stage, (step / kStages) & 1);
      const uint32_t w_piece = smem_s + stage * Cfg::kStageBytes;
      const uint32_t x_piece = w_piece + Cfg::kWBytes + wg * (64 * 128);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma_m64nNk16_bf16<BN>(acc, kmajor_sw128_desc(x_piece + kk * 32), kmajor_sw128_desc(w_piece + kk * 32),
                                kc > 0 || kk > 0);
      wgmma_commit();
      wgmma_wait<1>();  // the previous piece's wgmma are done: its stage can be refilled
      if (kc > 0 && lane == 0) mbar_arrive(empty_bar + 8 * ((step - 1) % kStages));
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (lane == 0) mbar_arrive(empty_bar + 8 * ((i * kChunks + kChunks - 1) % kStages));
    const int64_t tile = m_split + static_cast<int64_t>(i) * m_splits;
    store_acc_m64n128<BN>(acc, c_head, tile * BM + wg * 64, p.num_tokens, p.stride_c_token, tid_wg);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // wgmma and TMA as used here exist on sm_90a only; the host never launches this elsewhere
#endif
}

template <class Cfg>
bool launch_v_up_tma_stream(const AbsorbParams& p) {
  TmaVUpParams args{};
  args.p = p;
  if (!make_v_up_tensor_maps<Cfg::BM, Cfg::BN>(p, false, &args.x_map, &args.w_map)) return false;
  auto kernel = v_up_tma_stream_kernel<Cfg>;
  opt_in_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, p.device);
  // One tile per CTA (the dispatch takes this kernel where that is at most one wave).
  const int64_t m_splits = (p.num_tokens + Cfg::BM - 1) / Cfg::BM;
  MLA_HOST_CHECK(p.num_heads <= 65535 && m_splits <= 65535, "v_up: grid too large (H or T)");
  MLA_HOST_CHECK(p.num_tokens <= (int64_t(1) << 31) - Cfg::BM, "v_up: T too large for the TMA kernel's coordinates");
  const dim3 grid(static_cast<unsigned>(m_splits), kVHeadDim / Cfg::BN, static_cast<unsigned>(p.num_heads));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, p.stream>>>(args);
  MLA_CHECK_LAUNCH();
  return true;
}

template <int kBM, int kBN>
bool run_v_up_tma_stream(const AbsorbParams& p) {
  return launch_v_up_tma_stream<TmaStreamVUpConfig<kBM / 64, kBN>>(p);
}

}  // namespace mla::absorb
