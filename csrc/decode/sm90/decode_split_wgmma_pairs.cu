// Dense split-KV MLA decode on sm90a for 64-row tiles of a 16-bit cache copied by TMA
// (DecodeParams::kv_map): pages of whole 64-key tiles (block sizes that are multiples of 64) or
// 64-key tiles of whole pages (block sizes 8, 16, 32: kPageBoxes, one box per page). The
// two warpgroups take the key tiles in turns, so that one warpgroup's softmax runs while the
// other's MMAs keep the tensor cores busy. (decode_split_wgmma.cu splits every tile over both
// warpgroups instead: its S, softmax and P V follow one another for the whole CTA, and Nsight
// Compute saw the tensor pipe at ~43% of the cycles.) Everything around the math is the same:
// schedule, pieces, masks, partials, epilogue (split_wgmma_common.cuh).
//
// Tiles go in pairs: tile 2j lies in stage 0 and warpgroup 0 computes its S, tile 2j + 1 in stage 1
// for warpgroup 1. Warpgroup g keeps output dims 256 g .. + 255 of all 64 rows (V's half g) and
// multiplies both tiles' P by it. m is the rows' running maximum, a / b the pair's tiles:
//   wg 0: softmax of a (m_a = max(m, rowmax S_a)) -> m_a to wg 1; O *= 2^(m - m_a);
//         O += P_a V_a (P_a from registers); once that is done, the next a's dims 0-255 are copied.
//   wg 1: softmax of b with m_a (m_b = max(m_a, rowmax S_b)) -> m_b to wg 0; O *= 2^(m - m_b);
//         P_b to shared memory (stage 1's rope block, free once S_b is done); O += P_b V_b.
//   wg 0: P_a 2^(m_a - m_b) to shared memory (stage 0's rope block); O *= 2^(m_a - m_b);
//         O += P_b V_b (P_b from shared memory); S of the next a, its first four dim blocks while
//         P_b V_b runs, then the next b's dims 0-255 and rope block are copied, then the rest of S.
//   wg 1: O += P_a' V_a (P_a' from shared memory); once P_b V_b is done the next b's dims 256-511
//         are copied, once P_a' V_a is done the next a's dims 256-575; S of the next b.
// Every stage has an mbarrier per 64-dim block, so S starts on the blocks that have landed. The
// two warpgroups meet four times per pair (m_a, m_b, P_a', P_b ready), always one warpgroup arriving
// and the other waiting, each time on an mbarrier of its own. Shared memory: Q 72 KB + 2 stages of 72 KB
// + maxima, sums and 22 mbarriers (fp8_ds_mla: + 4 KB of scales, 8 more); P needs no buffer of its own.
//
// fp8_ds_mla (bf16 q): the same two warpgroups and copies, on e4m3 rows. A copy of dims 128 k .. + 127
// (blocks 2k, 2k + 1) brings the group's 64 rows of 128 e4m3 bytes into block 2k + 1's space (groups 0
// and 2 also the rows' four fp32 scales); the rope block lands as bf16, as for a 16-bit cache. A third
// warpgroup converts each group in place as it lands (e4m3 x scale in fp32, rounded to bf16, into both
// blocks) and arrives on the two blocks' mbarriers, so S and P V read bf16 tiles that were converted
// once for all 64 rows, and the copies go out exactly when a 16-bit cache's would.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "common/sm80.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/wgmma.cuh"
#include "decode/decode.h"
#include "decode/kernels.h"
#include "decode/portable/decode_split.cuh"  // dequant8_e4m3
#include "decode/sm90/split_wgmma_common.cuh"
#include "decode/split_common.cuh"

namespace mla::decode::hopper {

using sm80::pack2;
using sm80::smem_addr;

template <CacheFormat kFormat>
struct PairsConfig {
  // fp8_ds_mla: e4m3 groups converted in place by a third warpgroup (see the top of the file)
  static constexpr bool kConvert = kFormat == CacheFormat::kFp8DsMla;
  static constexpr int kRows = kWgmmaRows;
  static constexpr int kConsumerThreads = 256;                           // 2 warpgroups on the MMAs
  static constexpr int kThreads = kConsumerThreads + (kConvert ? 128 : 0);  // + the converter
  // Registers per thread after setmaxnreg (kConvert; 168 each at launch): (232 + 232 + 40) x 128 = 64 K.
  static constexpr int kConsumerRegs = 232, kConverterRegs = 40;
  static constexpr int kBlocks = 9;     // 64-dim blocks of a 576-dim row; block 8 = the rope dims
  static constexpr int kGroups = 4;     // fp8_ds_mla: e4m3 groups of 128 dims (blocks 2k, 2k + 1)
  static constexpr int kBlockBytes = kSwizzleBlockBytes;
  static constexpr int kTileBytes = kBlocks * kBlockBytes;
  static constexpr int kHandOffs = 4;   // m_a, m_b, P_a', P_b: one mbarrier each
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kTileBytes;            // stage s at kOffK + s kTileBytes
  // [2][64] fp32 each, by pair parity (a slot is rewritten two pairs after it was read; one slot would
  // also be ordered by the hand-offs, the parity stayed from the racecheck experiments)
  static constexpr int kOffMaxA = kOffK + 2 * kTileBytes;     // m_a, wg 0 -> wg 1
  static constexpr int kOffMaxB = kOffMaxA + 2 * 4 * kRows;   // m_b, wg 1 -> wg 0
  static constexpr int kOffRed = kOffMaxB + 2 * 4 * kRows;    // [2][64] fp32: row sums at the end
  // kConvert: [2 stages][2 slots][64 rows][4] fp32, the rows' scales copied with groups 0 and 2 (slot
  // 0 for groups 0-1, 1 for groups 2-3: each pair of groups may land first)
  static constexpr int kOffScales = kOffRed + 2 * 4 * kRows;
  static constexpr int kScaleSlotBytes = kBlockN * 4 * kDsMlaNumTiles;
  // [2 stages][9 blocks] mbarriers, the hand-offs', then (kConvert) [2 stages][4 groups] for the e4m3 copies
  static constexpr int kOffBars = kOffScales + (kConvert ? 4 * kScaleSlotBytes : 0);
  static constexpr int kNumBars = 2 * kBlocks + kHandOffs + (kConvert ? 2 * kGroups : 0);
  static constexpr int kSmemBytes = kOffBars + 8 * kNumBars;
  static constexpr int kSmemLaunchBytes = kSmemBytes + 1024;  // + base alignment of the swizzle atoms
  static_assert(kBlockN == 64 && kOffBars % 8 == 0 && kDsMlaNumTiles == kGroups);
  static_assert(kConsumerRegs * kConsumerThreads + kConverterRegs * 128 <= 64 * 1024);
  static_assert(kSmemLaunchBytes <= 227 * 1024, "shared memory budget of sm90");
};

// The hand-offs between the warpgroups, once per pair each: the 128 threads of one warpgroup arrive
// on the hand-off's mbarrier (release: their shared-memory writes), the other warpgroup waits for the
// pair's phase. Each can complete only once before it is waited for: a warpgroup arrives at a
// hand-off of the next pair only after it has waited for one that the other warpgroup gives after
// its wait here. The warpgroup that does not compute a stage's S reads (and zeroes) that stage's TMA
// rows without waiting on its block mbarriers: the other warpgroup's wait, then its arrival at a
// hand-off this one waits for, orders them.
// (Named barriers, bar.arrive -> bar.sync, did the same job as fast, but compute-sanitizer
// racecheck reported the warpgroup 1 -> 0 hand-offs as races, as it does for such a hand-off in a
// kernel of its own: the tool does not order bar.arrive before bar.sync.)
enum PairsHandOff : int { kMaxA = 0, kMaxB = 1, kPa = 2, kPb = 3 };
// The only named barriers left: within one warpgroup (0 is __syncthreads), and of the two MMA
// warpgroups where a converter runs beside them.
inline constexpr int kBarZero0 = 1;  // + wg
inline constexpr int kBarConsumers = 3;

// kPageBoxes: a 64-key tile is 64 / p.tma_box_rows pages (block sizes 8, 16, 32), each copied as its
// own box; else one box of 64 rows of a page of whole tiles.
template <typename T, CacheFormat kFormat, bool kPageBoxes>
__global__ void __launch_bounds__(PairsConfig<kFormat>::kThreads, 1)
    decode_split_wgmma_pairs_kernel(const __grid_constant__ DecodeParams p) {
#if MLA_SM90A
  using C = PairsConfig<kFormat>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kConvert = C::kConvert;
  static_assert(!kConvert || kBf16, "fp8_ds_mla rope dims are copied as they are: bf16 q only");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = sm90::align_to_swizzle_atom(smem_raw);
  float* const max_a = reinterpret_cast<float*>(smem + C::kOffMaxA);
  float* const max_b = reinterpret_cast<float*>(smem + C::kOffMaxB);
  float* const red = reinterpret_cast<float*>(smem + C::kOffRed);
  const float* const scales = reinterpret_cast<const float*>(smem + C::kOffScales);  // kConvert
  const uint32_t q_base = smem_addr(smem + C::kOffQ), k_base = smem_addr(smem + C::kOffK);
  const uint32_t bars = smem_addr(smem + C::kOffBars);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, qd = lane % 4;
  // Warpgroup through a shuffle: warp-uniform for the compiler, so the descriptors stay uniform.
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  // Each warpgroup's TMA thread (whole pages), or all of it (page boxes: copy_blocks).
  const bool issuer = kPageBoxes || tid % 128 == 0;
  const int row_lo = 16 * (warp % 4) + lane / 4;  // this thread's accumulator rows: row_lo, row_lo + 8
  // Launched as a dependent too (common/pdl.cuh): wait until what the kernels before wrote (the
  // plan among it) is visible, then let the combine launch, which reads the plan before it waits.
  pdl_wait_prerequisites();
  pdl_launch_dependents();
  const SchedulePart part = schedule_part(p);
  const int row0 = blockIdx.y * C::kRows;
  const int rows_here = min(C::kRows, p.num_rows - row0);
  const float score_scale = p.softmax_scale_log2;

  const sm90::SmemDesc q_desc = sm90::kmajor_sw128(q_base), k_desc = sm90::kmajor_sw128(k_base);
  // V = a stage's first 512 dims as an MN-major operand: 64-dim blocks 8 KiB apart, 8-key groups 1 KiB apart.
  const sm90::SmemDesc v_desc = sm90::mnmajor_sw128(k_base, C::kBlockBytes, 1024);
  auto bar = [&](int stage, int b) { return bars + 8 * (stage * C::kBlocks + b); };
  const uint32_t hand_off_bars = bars + 8 * 2 * C::kBlocks;
  auto hand_off = [&](PairsHandOff h) { return hand_off_bars + 8 * h; };
  const uint32_t group_bars = hand_off_bars + 8 * C::kHandOffs;  // kConvert
  auto group_bar = [&](int stage, int k) { return group_bars + 8 * (stage * C::kGroups + k); };
  if (tid == 0) {
    // A block's rows: one TMA arrival with its bytes; kConvert: blocks 0-7 the converter's 128 threads.
    for (int i = 0; i < 2 * C::kBlocks; ++i) mbar_init(bars + 8 * i, kConvert && i % C::kBlocks < 8 ? 128 : 1);
    for (int h = 0; h < C::kHandOffs; ++h) mbar_init(hand_off_bars + 8 * h, 128);
    if constexpr (kConvert)
      for (int i = 0; i < 2 * C::kGroups; ++i) mbar_init(group_bars + 8 * i, 1);
    mbar_init_fence();
  }
  __syncthreads();  // (the last barrier of all three warpgroups; the MMA warpgroups' own: consumers_sync)
  auto consumers_sync = [] {
    if constexpr (kConvert) sm80::named_barrier(kBarConsumers, C::kConsumerThreads);
    else __syncthreads();
  };

  if constexpr (kConvert) {
    if (wg == 2) {
      // The converter: each of its warps converts its rows of a pair's groups (the next a's in stage 0,
      // the next b's in stage 1; at a piece's start its first two tiles) in the order their copies land,
      // stage 0's first where several have: the copies go out as the MMA warpgroups free the blocks,
      // and neither a fixed order nor a wait for one group while another has landed would keep up with
      // them. Warp w takes rows 16 w .. + 15 of a group, lane l row 16 w + l % 16 and raw chunks l / 16
      // + 2 j (16 e4m3 each; chunk c of row r sits at 16 (c ^ (r % 8)), swizzled as it landed): eight
      // rows per quarter warp, no bank conflicts either way. Chunks 0-3 become block 2k, which holds no
      // raw bytes; chunks 4-7 block 2k + 1 itself, once the whole warp has read its rows.
      sm90::setmaxnreg_dec<C::kConverterRegs>();
      const uint32_t r = 16 * (warp % 4) + lane % 16, c0 = lane / 16, rx = r % 8;
      // Byte offsets in a row: raw chunks c0 + 2 j (j = 0..3), output chunk pairs 2 c0 + 4 j (+ 1),
      // the same in both blocks (few registers: the converter runs on 40).
      uint32_t raw_at[4], out_at[2][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) raw_at[j] = r * 128 + (((c0 + 2 * j) ^ rx) << 4);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) out_at[j][h] = r * 128 + (((2 * c0 + 4 * j + h) ^ rx) << 4);
      uint32_t group_phase[2] = {0u, 0u};  // by stage: tiles converted there so far, parity
      auto convert = [&](int stage, int k) {  // group k of `stage`, landed
        const uint32_t lo_block = k_base + stage * C::kTileBytes + 2 * k * C::kBlockBytes, hi_block = lo_block + C::kBlockBytes;
        const float scale = scales[(stage * 2 + k / 2) * (C::kScaleSlotBytes / 4) + r * kDsMlaNumTiles + k];
        // 16-byte shared loads and stores with a memory clobber (e4m3::lds128 has none): the raw loads stay
        // before the __syncwarp below and the in-place stores after it.
        auto load = [&](int j) {
          uint4 v;
          asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(hi_block + raw_at[j]) : "memory");
          return v;
        };
        auto store = [&](uint32_t block, int j, const uint4& v) {  // raw chunk c0 + 2 j (+ 4) -> two output chunks
          sm80::sts128(block + out_at[j][0], portable::dequant8_e4m3<T, true>(make_uint2(v.x, v.y), scale));
          sm80::sts128(block + out_at[j][1], portable::dequant8_e4m3<T, true>(make_uint2(v.z, v.w), scale));
        };
        const uint4 lo0 = load(0), lo1 = load(1), hi0 = load(2), hi1 = load(3);
        store(lo_block, 0, lo0);
        store(lo_block, 1, lo1);
        __syncwarp();  // the warp's rows read: block 2k + 1 may be overwritten
        store(hi_block, 0, hi0);
        store(hi_block, 1, hi1);
        fence_proxy_async_smem();  // st.shared -> the MMA warpgroups' wgmma
        mbar_arrive(bar(stage, 2 * k));
        mbar_arrive(bar(stage, 2 * k + 1));
      };
      // The groups of `pending` (bit 4 stage + k), each once it has landed (every lane saw it: each
      // acquired the copy); then those stages' next tiles.
      auto convert_landed = [&](uint32_t pending) {
        const uint32_t stages = ((pending & 0x0fu) ? 1u : 0u) | ((pending & 0xf0u) ? 2u : 0u);
        while (pending != 0) {
          for (int t = 0; t < 2 * C::kGroups; ++t) {
            const int stage = t / C::kGroups, k = t % C::kGroups;
            // (an odd group after the even one, whose copy brought the pair's scales)
            const bool ready = ((pending >> t) & 1u) && !(k % 2 == 1 && ((pending >> (t - 1)) & 1u));
            if (ready && __all_sync(0xffffffffu, mbar_test_wait(group_bar(stage, k), group_phase[stage]))) {
              convert(stage, k);
              pending &= ~(1u << t);
              break;
            }
          }
        }
        group_phase[0] ^= stages & 1u;
        group_phase[1] ^= stages >> 1;
      };
      for (int req = part.begin_req; req <= part.end_req; ++req) {
        const int num_tiles = part_piece(p, part, req).num_tiles;
        convert_landed((num_tiles > 0 ? 0x0fu : 0u) | (num_tiles > 1 ? 0xf0u : 0u));
        for (int i = 0; i < num_tiles; i += 2)
          convert_landed((i + 2 < num_tiles ? 0x0fu : 0u) | (i + 3 < num_tiles ? 0xf0u : 0u));
      }
      return;
    }
    sm90::setmaxnreg_inc<C::kConsumerRegs>();
  }
  uint32_t phase = 0;       // parity of the mbarriers of stage wg (the one this warpgroup computes S on)
  uint32_t pair_phase = 0;  // parity of the hand-offs: pairs so far, over all pieces

  for (int req = part.begin_req; req <= part.end_req; ++req) {
    const Piece piece = part_piece(p, part, req);
    const int seq_len = piece.seq_len, kv_len = piece.kv_len, tile_begin = piece.tile_begin, num_tiles = piece.num_tiles;
    const int32_t* bt = piece.bt;
    int lim[2];  // keys each of this thread's two rows may see (past kv_len: never loaded)
    row_key_limits(p, row0, rows_here, row_lo, seq_len, kv_len, lim);
    // mask_scores' whole-tile bound: the rows' limits, a padding row (limit 0) counted as seeing every
    // key of the piece, so that warps holding padding rows skip the per-key tests as well (zero Q rows:
    // on such a tile their scores are 0; padding rows are never written).
    const int whole_tile_lim = min(row_lo < rows_here ? lim[0] : kv_len, row_lo + 8 < rows_here ? lim[1] : kv_len);

    auto page_ok = [&](int page) { return page >= 0 && page < p.num_blocks; };
    // Where tile i's rows come from. tile_page(i), read a pair ahead: whole pages: the tile's page (-1
    // past the piece; an id outside the cache is copied as nothing); page boxes: lane j < 64 / rows of
    // each warp holds the page of the tile's keys j rows .. (-1 past the piece). tile_src(page), for the
    // masks and the zeroing: whole pages: the same; page boxes: bit j set when page j exists (a warp
    // vote, taken once the pair needs it, so that the block-table reads have landed by then).
    const int box_shift = __ffs(p.tma_box_rows) - 1;  // key in tile -> its page box (kPageBoxes)
    auto tile_page = [&](int i) -> int {
      if constexpr (kPageBoxes) {
        const int key = (tile_begin + i) * kBlockN + lane * p.tma_box_rows;
        return i < num_tiles && lane < (kBlockN >> box_shift) ? cache_page(p, bt, key, kv_len) : -1;
      } else {
        return i < num_tiles ? cache_page(p, bt, (tile_begin + i) * kBlockN, kv_len) : -1;
      }
    };
    auto tile_src = [&](int page) -> int {
      if constexpr (kPageBoxes) return static_cast<int>(__ballot_sync(0xffffffffu, page_ok(page)));
      else return page;
    };
    // Key k of a tile (0-63) lies in a copied page; every key of the tile does.
    auto key_ok = [&](int src, int k) {
      if constexpr (kPageBoxes) return ((src >> (k >> box_shift)) & 1) != 0;
      else return page_ok(src);
    };
    auto all_ok = [&](int src) {
      if constexpr (kPageBoxes) return src == static_cast<int>((1ull << (kBlockN >> box_shift)) - 1);
      else return page_ok(src);
    };
    // TMA boxes of dim blocks [b0, b1) of tile i (tile_page: `page`) into `stage`, each block counted
    // on its mbarrier with the bytes of the pages that exist (an invalid page is copied as nothing).
    // Whole pages: one thread per call; page boxes: all 4 warps of a warpgroup, page j copied by lane j
    // of warp j % 4 (a TMA copy takes uniform registers: a warp issues those of several lanes one lane
    // at a time, and its warpgroup's next wgmma waits for it).
    // kConvert: blocks 2k, 2k + 1 are e4m3 group k, copied into block 2k + 1 (groups 0 and 2 with the scales)
    // and counted on the group's mbarrier; the rope block is bf16 from byte 528 of the row.
    auto copy_blocks = [&](int i, int page, int stage, int b0, int b1) {
      // Block b's copy: its mbarrier, x offset in the row and where it lands; false: copied with b - 1.
      auto block_copy = [&](int b, uint32_t& bar_b, int& x, uint32_t& dst) {
        dst = k_base + stage * C::kTileBytes + b * C::kBlockBytes;
        if constexpr (kConvert) {
          if (b % 2 == 1 && b < 8) return false;  // with block b - 1
          bar_b = b == 8 ? bar(stage, 8) : group_bar(stage, b / 2);
          x = b == 8 ? kDsMlaRopeOffset : 64 * b;
          if (b < 8) dst += C::kBlockBytes;
        } else {
          bar_b = bar(stage, b);
          x = 128 * b;
        }
        return true;
      };
      // kConvert: groups 0 and 2 (blocks 0 and 4) bring the scales, into slot b / 4 of the stage.
      auto with_scales = [](int b) { return kConvert && b % 4 == 0 && b < 8; };
      auto scale_dst = [&](int b) { return smem_addr(smem + C::kOffScales) + (stage * 2 + b / 4) * C::kScaleSlotBytes; };
      if constexpr (kPageBoxes) {
        const int rows = p.tma_box_rows;
        const bool ok = page_ok(page);
        const uint32_t pages = __popc(__ballot_sync(0xffffffffu, ok));
        const bool mine = ok && lane % 4 == warp % 4;
        for (int b = b0; b < b1; ++b) {
          uint32_t bar_b, dst;
          int x;
          if (!block_copy(b, bar_b, x, dst)) continue;
          const bool scales_too = with_scales(b);
          if (tid % 128 == 0) mbar_arrive_expect_tx(bar_b, pages * rows * (scales_too ? 128 + 16 : 128));
          if (mine) {
            sm90::tma_load_3d(dst + lane * rows * 128, &p.kv_map, bar_b, x, 0, page);
            if (scales_too) sm90::tma_load_3d(scale_dst(b) + lane * rows * 16, &p.scale_map, bar_b, 0, 0, page);
          }
        }
      } else {
        const int k0 = (tile_begin + i) * kBlockN;
        const int row = p.block_div.mod(k0, p.block_div.div(k0));
        for (int b = b0; b < b1; ++b) {
          uint32_t bar_b, dst;
          int x;
          if (!block_copy(b, bar_b, x, dst)) continue;
          const bool scales_too = with_scales(b);
          if (page_ok(page)) {
            mbar_arrive_expect_tx(bar_b, scales_too ? C::kBlockBytes + C::kScaleSlotBytes : C::kBlockBytes);
            sm90::tma_load_3d(dst, &p.kv_map, bar_b, x, row, page);
            if (scales_too) sm90::tma_load_3d(scale_dst(b), &p.scale_map, bar_b, 0, row, page);
          } else {
            mbar_arrive(bar_b);
          }
        }
      }
    };
    // Rows of tile i (in `stage`) that hold no key of the sequence (past kv_len, or in a page that was
    // not copied: whatever the stage held before) are zeroed in this warpgroup's half of V: their scores
    // are masked, but P = 0 times a NaN value is NaN. Rare: the last tile of a sequence.
    auto zero_invalid_v = [&](int i, int src, int stage) {
      const int k0 = (tile_begin + i) * kBlockN;
      if (all_ok(src) && k0 + kBlockN <= kv_len) return;
      const int valid = kPageBoxes || page_ok(src) ? kv_len - k0 : 0;  // rows 0 .. valid - 1 hold keys of the sequence
      for (int idx = tid % 128; idx < kBlockN * 32; idx += 128) {
        const int r = idx / 32, c = 32 * wg + idx % 32;  // 16-byte chunk c of the 576 dims
        if (r >= valid || (kPageBoxes && !key_ok(src, r)))
          *reinterpret_cast<uint4*>(smem + C::kOffK + stage * C::kTileBytes + sw128(r, c)) = make_uint4(0u, 0u, 0u, 0u);
      }
      fence_proxy_async_smem();
      if (wg == 0) sm80::named_barrier(kBarZero0, 128);  // (immediate ids: a register id makes ptxas
      else sm80::named_barrier(kBarZero0 + 1, 128);     // reserve all 16 hardware barriers)
    };
    // S of tile i (scores s[4 j + e]: row row_lo + 8 (e / 2), key 8 j + 2 qd + e % 2): masked (select:
    // a masked score never becomes NaN) and scaled to the exp2 domain; mx = the rows' maxima. A tile whose
    // keys all lie in copied pages and below both rows' limits (whole_tile_lim: every tile but a piece's
    // last and, for s_q > 1, the causal edge) skips the per-key tests: they sit between one warpgroup's S
    // and the P V that the other warpgroup waits for (h_q 64-128: 2-5% of the kernel's time).
    auto mask_scores = [&](float (&s)[32], int i, int src, float (&mx)[2]) {
      const int pos0 = (tile_begin + i) * kBlockN + 2 * qd;
      const bool tile_ok = page_ok(src);  // (whole pages)
      if (all_ok(src) && (tile_begin + i + 1) * kBlockN <= whole_tile_lim) {
#pragma unroll
        for (int e = 0; e < 32; ++e) {
          s[e] *= score_scale;
          mx[(e % 4) / 2] = fmaxf(mx[(e % 4) / 2], s[e]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& v = s[4 * j + e];
            const bool ok = kPageBoxes ? key_ok(src, 8 * j + 2 * qd + e % 2) : tile_ok;
            v = (ok && pos0 + 8 * j + e % 2 < lim[e / 2]) ? v * score_scale : -INFINITY;
            mx[e / 2] = fmaxf(mx[e / 2], v);
          }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      }
    };
    // s -> P = 2^(s - m_new) in place, l += the rows' sums (quad-partial). Rows with nothing seen yet
    // (m_new = -inf) keep P = 0.
    auto exponentiate = [&](float (&s)[32], const float (&m_new)[2], float (&l)[2]) {
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int h = (e % 4) / 2;
        s[e] = sm80::fast_exp2(s[e] - (m_new[h] == -INFINITY ? 0.f : m_new[h]));
        l[h] += s[e];
      }
    };
    // P times f (per row) in T into `stage`'s rope block, the [64 rows][64 keys] K-major A operand of the
    // other warpgroup's P V. (That block was read by this warpgroup's S only, which is done.)
    auto store_p = [&](const float (&s)[32], const float (&f)[2], int stage) {
      const uint32_t base = k_base + stage * C::kTileBytes + 8 * C::kBlockBytes;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_lo + 8 * h;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(base + r * 128 + ((j ^ (r % 8)) << 4) + 4 * qd),
                       "r"(pack2<T>(s[4 * j + 2 * h] * f[h], s[4 * j + 2 * h + 1] * f[h])));
      }
      fence_proxy_async_smem();  // st.shared -> the other warpgroup's wgmma (after a hand-off)
    };
    // m -> m_new: the factor 2^(m - m_new) for O and l (exactly 1 when m did not move, so that the
    // rescale can be skipped).
    auto move_max = [&](float (&m)[2], const float (&m_new)[2], float (&f)[2]) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        f[h] = m_new[h] == m[h] ? 1.f : sm80::fast_exp2(m[h] - (m_new[h] == -INFINITY ? 0.f : m_new[h]));
        m[h] = m_new[h];
      }
    };
    // P (in s) as the A fragments of the 4 k-steps of this warpgroup's register-A P V.
    auto p_fragments = [](const float (&s)[32], uint32_t (&frag)[4][4]) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int t = 0; t < 4; ++t) frag[ks][t] = pack2<T>(s[8 * ks + 2 * t], s[8 * ks + 2 * t + 1]);
    };
    auto wgmma_wait_all = [](float (&acc)[2][64]) {
      sm90::wgmma_wait<0>();
      fence_accumulators(acc);
    };
    // O += P V over `stage`'s 64 keys and this warpgroup's 256 dims: P from registers (pa, the A
    // fragments of 4 k-steps) or, when pa is null, from the stage's rope block.
    auto issue_pv = [&](float (&acc)[2][64], const uint32_t (*pa)[4], int stage) {
      const uint32_t k_off = stage * C::kTileBytes;
      sm90::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        const uint64_t db = v_desc.at(k_off + 4 * wg * C::kBlockBytes + 16 * 128 * ks);
        if (pa != nullptr) sm90::wgmma_m64n256k16_rs_mn<kBf16>(acc, pa[ks], db);
        else sm90::wgmma_m64n256k16_ss_mn<kBf16>(acc, k_desc.at(k_off + 8 * C::kBlockBytes + 32 * ks), db);
      }
      sm90::wgmma_commit();
    };
    // S += Q K^T over `count` dim blocks of stage wg, first .. first + count - 1 (mod 9), each after its
    // mbarrier; `first_mma` overwrites s.
    auto issue_s = [&](float (&s)[32], int first, int count, bool first_mma) {
      sm90::wgmma_fence();
#pragma unroll
      for (int n = 0; n < count; ++n) {
        const int b = (first + n) % C::kBlocks;
        mbar_wait(bar(wg, b), phase);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const uint64_t da = q_desc.at(b * C::kBlockBytes + 32 * ks);
          const uint64_t db = k_desc.at(wg * C::kTileBytes + b * C::kBlockBytes + 32 * ks);
          const bool acc = !(first_mma && n == 0 && ks == 0);
          if constexpr (kBf16) sm90::wgmma_m64n64k16_bf16(s, da, db, acc);
          else sm90::wgmma_m64n64k16_f16(s, da, db, acc);
        }
      }
      sm90::wgmma_commit();
    };

    float o[2][64];  // this warpgroup's output dims (split_wgmma_common.cuh)
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int v = 0; v < 2; ++v)
#pragma unroll
      for (int e = 0; e < 64; ++e) o[v][e] = 0.f;
    float s[32];
    int page[2] = {tile_page(0), tile_page(1)};  // the current pair's tiles: tile_page, tile_src
    int src[2] = {tile_src(page[0]), tile_src(page[1])};

    if (num_tiles > 0) {
      load_q_rows<T, C::kRows, C::kConsumerThreads>(p, req, row0, rows_here, tid, q_base, [](int r, int c) { return sw128(r, c); });
      sm80::cp_async_commit();
      if (kPageBoxes ? wg == 0 : tid == 0) {  // warpgroup 0's issuer
        copy_blocks(0, page[0], 0, 0, C::kBlocks);
        if (num_tiles > 1) copy_blocks(1, page[1], 1, 0, C::kBlocks);
      }
      sm80::cp_async_wait<0>();
      fence_proxy_async_smem();  // Q (cp.async, generic proxy) -> wgmma
    }
    consumers_sync();
    if (wg < num_tiles) {  // S of tile wg
      issue_s(s, 0, C::kBlocks, true);
      sm90::wgmma_wait<0>();
      fence_accumulators(s);
      phase ^= 1;
    }

    for (int i = 0; i < num_tiles; i += 2) {  // the pair a = tile i (stage 0), b = tile i + 1 (stage 1)
      const bool has_b = i + 1 < num_tiles, has_next_a = i + 2 < num_tiles, has_next_b = i + 3 < num_tiles;
      const int next_page[2] = {tile_page(i + 2), tile_page(i + 3)};
      float* const pair_max_a = max_a + (i / 2 % 2) * C::kRows;
      float* const pair_max_b = max_b + (i / 2 % 2) * C::kRows;
      if (wg == 0) {
        float mx[2] = {-INFINITY, -INFINITY}, m_new[2], f[2];
        mask_scores(s, i, src[0], mx);
        m_new[0] = fmaxf(m[0], mx[0]);
        m_new[1] = fmaxf(m[1], mx[1]);
        if (qd == 0) pair_max_a[row_lo] = m_new[0], pair_max_a[row_lo + 8] = m_new[1];
        mbar_arrive(hand_off(kMaxA));
        move_max(m, m_new, f);
        l[0] *= f[0];
        l[1] *= f[1];
        exponentiate(s, m, l);
        rescale_rows(o, f);
        uint32_t pa[4][4];
        p_fragments(s, pa);
        zero_invalid_v(i, src[0], 0);
        issue_pv(o, pa, 0);
        wgmma_wait_all(o);
        if (issuer && has_next_a) copy_blocks(i + 2, next_page[0], 0, 0, 4);  // dims 0-255 of stage 0 are free
        mbar_wait(hand_off(kMaxB), pair_phase);
        m_new[0] = pair_max_b[row_lo];
        m_new[1] = pair_max_b[row_lo + 8];
        move_max(m, m_new, f);
        l[0] *= f[0];
        l[1] *= f[1];
        store_p(s, f, 0);  // P_a relative to m_b
        mbar_arrive(hand_off(kPa));
        mbar_wait(hand_off(kPb), pair_phase);  // P_b in stage 1's rope block
        if (has_b) {
          rescale_rows(o, f);
          zero_invalid_v(i + 1, src[1], 1);
          issue_pv(o, nullptr, 1);
        }
        if (has_next_a) {
          issue_s(s, 0, 4, true);
          sm90::wgmma_wait<1>();  // P_b V_b (and the S MMAs before it are in order behind it)
          if (issuer && has_next_b) {
            copy_blocks(i + 3, next_page[1], 1, 0, 4);
            copy_blocks(i + 3, next_page[1], 1, 8, 9);
          }
          issue_s(s, 4, 5, false);
          sm90::wgmma_wait<0>();
          fence_accumulators(s);
          phase ^= 1;
        } else {
          sm90::wgmma_wait<0>();
        }
        fence_accumulators(o);
      } else {
        mbar_wait(hand_off(kMaxA), pair_phase);
        float mx[2] = {-INFINITY, -INFINITY}, m_new[2], f[2];
        m_new[0] = pair_max_a[row_lo];
        m_new[1] = pair_max_a[row_lo + 8];
        move_max(m, m_new, f);  // f = 2^(m - m_a)
        if (has_b) mask_scores(s, i + 1, src[1], mx);
        m_new[0] = fmaxf(m[0], mx[0]);
        m_new[1] = fmaxf(m[1], mx[1]);
        if (qd == 0) pair_max_b[row_lo] = m_new[0], pair_max_b[row_lo + 8] = m_new[1];
        mbar_arrive(hand_off(kMaxB));
        float g[2];
        move_max(m, m_new, g);  // g = 2^(m_a - m_b)
        f[0] *= g[0];
        f[1] *= g[1];
        l[0] *= f[0];
        l[1] *= f[1];
        rescale_rows(o, f);
        uint32_t pb[4][4];
        if (has_b) {
          exponentiate(s, m, l);
          const float one[2] = {1.f, 1.f};
          store_p(s, one, 1);
          p_fragments(s, pb);
        }
        mbar_arrive(hand_off(kPb));
        if (has_b) {
          zero_invalid_v(i + 1, src[1], 1);
          issue_pv(o, pb, 1);
        }
        mbar_wait(hand_off(kPa), pair_phase);  // P_a' in stage 0's rope block
        zero_invalid_v(i, src[0], 0);
        issue_pv(o, nullptr, 0);
        if (has_b) {
          sm90::wgmma_wait<1>();  // P_b V_b
          if (issuer && has_next_b) copy_blocks(i + 3, next_page[1], 1, 4, 8);
        }
        wgmma_wait_all(o);
        if (issuer && has_next_a) copy_blocks(i + 2, next_page[0], 0, 4, C::kBlocks);
        if (has_next_b) {
          issue_s(s, 4, C::kBlocks, true);  // blocks 4-7 (copied just above), then 8, 0-3 (by warpgroup 0)
          sm90::wgmma_wait<0>();
          fence_accumulators(s);
          phase ^= 1;
        }
      }
      src[0] = tile_src(next_page[0]);
      src[1] = tile_src(next_page[1]);
      pair_phase ^= 1;
    }

    finish_piece<T>(p, part, req, row0, rows_here, wg, row_lo, red, o, m, l, 1.f, consumers_sync);
  }
#else
  __trap();  // launched on sm90 only
#endif
}

// p.tma_box_rows: 64 (pages of whole tiles) or 8, 16, 32 (tiles of whole pages).
template <typename T, CacheFormat kFormat>
void launch_decode_split_wgmma_pairs(const DecodeParams& p) {
  using C = PairsConfig<kFormat>;
  const char* what = "sm90 wgmma decode kernel (tile pairs)";
  if (p.tma_box_rows == kBlockN)
    launch_split_kernel(&decode_split_wgmma_pairs_kernel<T, kFormat, false>, C::kThreads, C::kSmemLaunchBytes, what, p);
  else
    launch_split_kernel(&decode_split_wgmma_pairs_kernel<T, kFormat, true>, C::kThreads, C::kSmemLaunchBytes, what, p);
}

template void launch_decode_split_wgmma_pairs<__nv_bfloat16, CacheFormat::kAuto>(const DecodeParams&);
template void launch_decode_split_wgmma_pairs<__half, CacheFormat::kAuto>(const DecodeParams&);
template void launch_decode_split_wgmma_pairs<__nv_bfloat16, CacheFormat::kFp8DsMla>(const DecodeParams&);

}  // namespace mla::decode::hopper
