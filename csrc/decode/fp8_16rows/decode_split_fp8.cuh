// Split-KV decode for the fp8 caches ('fp8', 'fp8_ds_mla') with 16 query rows per CTA: the memory-bound shape (h_q <= 16 after tensor parallelism, s_q = 1), where the
// kernel has to keep up with HBM while turning e4m3 bytes into MMA operands.
//
// No dequantisation pass. The cache rows stay e4m3 in shared memory; each warp converts the bytes
// of its own MMA fragments in registers with cvt.rn.f16x2.e4m3x2 (exact, one instruction per two
// values) and runs fp16 MMAs. The scales move out of the operands:
//   scores  S[r, k] = 2^e_r * (sum_t scale[k, t] * (q'_t . k8_t) + q'_pe . k_pe), where
//           q' = q * 2^-e_r in fp16 and e_r is the power of two that puts max|q_r| in
//           [2^14, 2^15) (q' equals q but for values 2^-39 below the row's largest). fp8_ds_mla:
//           t = its four 128-wide tiles, k_pe is bf16 (bf16 MMA with q'_pe). fp8: one tensor
//           scale, folded into the softmax scale, and k_pe is e4m3 like the rest.
//   values  O[r, tile t] = R_t * sum_k (P[r, k] * scale[k, t] / R_t) * v8[k] with P' = P
//           scale / R_t in fp16 (|P'| <= 2^11 P): R_t follows the max |scale| of the 64-key tiles
//           (e4m3::update_scale_ref); O is rescaled when it changes, as the online softmax does
//           when the max grows.
//   softmax lazy running maximum (moves only by more than kMaxSlack, so P <= 2^kMaxSlack and
//           most tiles skip the O rescale), P computed speculatively with it; the team redoes P
//           only when a warp flags a key above the slack: three barriers per tile.
// Two teams of 8 warps take alternate 64-key tiles of each piece and merge at its end: 16 warps
// per SM hide each other's barriers and MMA latencies the way two CTAs per SM would, without a
// second CTA's copy of the schedule. (fp16 q: fp8_ds_mla's q'_pe meets the bf16 k_pe as two bf16
// terms, hi and lo, so that nothing of the fp16 q is rounded away.)
//
// One kernel template, two variants: mma.sync for every QK^T (every target: the portable path,
// instantiations/split_fp8_16_mma.cu), and kQkWgmma (sm90a, bf16 q: instantiations/
// split_fp8_16_wgmma.cu; chosen by decode/dispatch.cu): QK^T leaves the mma.sync path, and with it every
// QK^T conversion, since Hopper has fp8 tensor math only in wgmma. S^T = K q'^T with
// wgmma.m64n32k32.e4m3: the A operand is the stage's cache tile itself (K-major: dims contiguous
// per key), laid out by the cp.async addresses as five [64 keys][128 B] blocks in the 128-byte
// swizzle (chunk c of key k at block c / 8, place (c % 8) ^ (k % 8)); the B operand is q' as two
// e4m3 terms per value (rows 0-15 hi, 16-31 lo; exact for bf16 q with max|q'_r| in [2^7, 2^8)),
// built once per piece. Warpgroup wg of a team takes dim blocks 2 wg and 2 wg + 1 (an
// accumulator each, scaled per key for fp8_ds_mla) and rope k-steps 2 wg, 2 wg + 1 (fp8_ds_mla:
// bf16 wgmma.m64n16k16); the two partial sums meet in red_s. Softmax and PV are the mma.sync
// ones below, with the natural PV key order (pv_key) and, for fp8_ds_mla, the tile's PV scales
// computed once into shared memory.
//
// Fragment layouts (m16n8k16, grp = lane / 4, qd = lane % 4). The dot products do not care in
// which order they sum, so k indices are permuted to make every operand one wide shared load:
//   QK^T  the 8 e4m3 k-steps of a 128-dim tile g: thread qd owns the 16-byte chunk
//         8 g + 4 G + qd of a key (dims 128 g + 64 G + 16 qd ..) for half G, and k-step
//         s = 4 G + j reads its bytes 4 j .. 4 j + 3: B = k8[key = n][those 4 dims] (k indices
//         2 qd, + 1 | + 8, + 9), A = q' at the same dims. One 128-bit load feeds 4 k-steps. The
//         ninth k-step is k_pe (dims 512 + 16 g + 4 qd ..: bf16 for fp8_ds_mla, e4m3 for fp8).
//         The A fragments are built once per piece into shared memory (fragment order, one
//         128-bit load per k-step) so that they do not hold 36 registers through the tile loop.
//   PV    k-step over 16 keys k0..: thread qd holds keys k0 + qd + {0, 4 | 8, 12};
//         B column n of n-tile j of set S is dim 64 w + 8 n + 4 S + j: one 64-bit load per key
//         (dims 64 w + 8 grp ..) gives both sets' four n-tiles, regrouped by prmt. The C fragment
//         then holds 16 consecutive dims per row (64 w + 16 qd ..).
// Cache rows in shared memory: 40 chunks of 16 B per key (kv_c e4m3: chunks 0-31; k_pe: e4m3 in
// 32-35 or bf16 in 32-39), chunk c of key k stored at chunk c ^ f(k), f(k) = 4 (k % 2) +
// 2 ((k / 2) % 2) + (k / 4) % 2 (bits of k % 8 reversed): conflict-free for QK^T (keys 2i, 2i + 1
// take opposite halves of a 128-byte line), PV (4 keys k0 + qd: 4 distinct chunk pairs), the k_pe
// step (8 consecutive keys, one chunk) and the cp.async writes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/e4m3.cuh"
#include "common/mbarrier.cuh"
#include "common/sm80.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/wgmma.cuh"
#include "common/vec.cuh"
#include "decode/decode.h"
#include "decode/kernels.h"
#include "decode/split_common.cuh"

// In the device passes for sm90 and newer (every target built): cp.async.bulk and mbarrier
// transaction counts (kBulkRows).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MLA_DECODE_BULK 1
#else
#define MLA_DECODE_BULK 0
#endif

namespace mla::decode::fp8_16rows {

inline constexpr int align1024(int bytes) { return (bytes + 1023) / 1024 * 1024; }

template <typename T, CacheFormat kFormat, int kRowThreadsT, bool kQkWgmmaT, int kTmaT = kTmaNone, bool kRawRowsT = false>
struct Fp8SplitConfig {
  static_assert(kFormat == CacheFormat::kFp8 || kFormat == CacheFormat::kFp8DsMla);
  static constexpr bool kDsMla = kFormat == CacheFormat::kFp8DsMla;
  static constexpr bool kQkWgmma = kQkWgmmaT;  // sm90a: S^T = K q^T on wgmma (see the file comment)
  // sm90a, block sizes that are multiples of 64 or 8 / 16 / 32: tiles copied with TMA (p.kv_map:
  // [rows][128 B] boxes, already in the wgmma layout; fp8_ds_mla's scales by p.scale_map), an
  // mbarrier per stage counting the bytes, instead of ~10 cp.async per thread (TmaTiles).
  static constexpr int kTma = kTmaT;
  static constexpr bool kTmaTiles = kTma != kTmaNone;
  static_assert(!kTmaTiles || kQkWgmma, "TMA tiles come in the wgmma layout");
  static constexpr int kRows = 16;
  static constexpr int kTeams = 2;
  static constexpr int kTeamWarps = 8;
  static constexpr int kTeamThreads = 32 * kTeamWarps;
  static constexpr int kThreads = kTeams * kTeamThreads;
  static constexpr int kStages = 2;                          // per team: one computing, one loading
  static constexpr int kKeyChunks = 40;                      // per key in shared memory
  static constexpr int kKeyBytes = 16 * kKeyChunks;          // 640
  // kRawRows (mma.sync QK^T; block sizes that are multiples of 16, rows packed at 656 bytes for
  // fp8_ds_mla, 576 for fp8): a stage holds the tile's 64 cache rows byte for byte, scales and k_pe in
  // place, so each 16-row quarter of a tile is one contiguous run. A 656-byte row is 16 bytes (one chunk)
  // past a multiple of 128, so chunk c of key k lies at chunk (k + c) % 8 of a 128-byte line: the
  // keys themselves are the swizzle. QK^T then pairs keys 4 apart in each quarter-warp (qk_key)
  // and PV takes the natural key order.
  // fp8 raw rows (packed at 576 bytes, four chunks past a multiple of 128: chunk c of key k at place
  // (4 k + c) % 8): QK^T pairs adjacent keys, and PV takes an even
  // and an odd key of each half of the tile per half-warp (pv_tile_key), whose rows lie 32 bytes apart
  // (kRowHalfShift): conflict-free. (Keys qd + 4 e of one quarter had 2-way conflicts.)
  static constexpr bool kRawRows = kRawRowsT;
  static_assert(!kRawRows || !kQkWgmma, "raw rows: the mma.sync path");
  static constexpr int kRawRowBytes = kDsMla ? kDsMlaRowBytes : kLatentDim;  // 656 or 576
  static constexpr int kRawRowChunks = kRawRowBytes / 16;                    // 41 or 36
  // Raw rows arrive by bulk copies (kBulkRows; every target has cp.async.bulk): the raw rows of a
  // quarter as one copy (n_valid rows) issued by one thread, lane q of warp 0 for quarter q, counted
  // on the stage's mbarrier, instead of 9-11 cp.async per thread of the team; when a tile is one page
  // (block sizes that are multiples of 64) lane 0 copies all of it at once. Rows a copy leaves out
  // (past the sequence, invalid page) are zeroed after the wait. The row flags are then the
  // quarters' counts of valid rows (stage_row_valid).
  static constexpr bool kBulkRows = kRawRows;
  // Cache rows in a stage: chunk c of key k at key_chunk_offset(k, c) (see there): rows of 640
  // bytes (mma.sync path), of 656 / 576 (kRawRows) or five [64 keys][128 B] blocks (wgmma path).
  static constexpr int kKeyStride = kQkWgmma ? 128 : kRawRows ? kRawRowBytes : kKeyBytes;  // bytes between keys
  static constexpr int kBlockStride = kQkWgmma ? kBlockN * 128 : 128;  // between chunks c and c + 8
  // mma.sync QK^T: warp (g = w % 4, kh = w / 4) takes k-steps of dim group g for keys 32 kh ..
  // 32 kh + 31: 8 e4m3 steps (dims 128 g ..) and one k_pe step (dims 512 + 16 g ..; bf16 for
  // fp8_ds_mla). wgmma QK^T: warpgroup wg of the team takes dim blocks 2 wg, 2 wg + 1 and half of
  // the rope dims for all 64 keys. The partial scores of the kScoreGroups meet in red_s.
  // fp8_ds_mla's k_pe is bf16: an fp16 q_pe meets it as two bf16 terms (hi, lo) in two MMAs
  // (k-steps 8 and 9); a bf16 q_pe is one.
  static constexpr bool kPeLoTerm = kDsMla && std::is_same_v<T, __half>;
  static constexpr int kF16Steps = 8;
  static constexpr int kQSteps = kPeLoTerm ? 10 : 9;
  static constexpr int kScoreGroups = kQkWgmma ? 2 : 4;
  // Tile loads: kRowThreads threads copy one cache row (16-byte cp.async each), so a warp's copy
  // covers 32 / kRowThreads rows; each thread takes kRowsPerThread rows, kRowStep apart.
  static constexpr int kRowThreads = kRowThreadsT;                               // 4 or 8
  static constexpr int kRowsPerThread = kRawRows ? 1 : kRowThreads * kBlockN / kTeamThreads;  // 1 or 2
  static constexpr int kRowStep = kTeamThreads / kRowThreads;                    // 64 or 32
  static constexpr int kE4m3Chunks = kDsMla ? kKvLoraRank / 16 : kLatentDim / 16;  // raw 16-byte chunks: 32 or 36
  static constexpr int kJ = (kE4m3Chunks + kRowThreads - 1) / kRowThreads;       // e4m3 chunks per thread and row
  static_assert(kRowThreads == 4 || kRowThreads == 8, "the chunk swizzle offsets assume 4 or 8 threads per row");
  // Softmax weights may reach 2^kMaxSlack (see the lazy maximum in the kernel), and fp8_ds_mla's
  // P' = P scale / R up to 2^(kMaxSlack + kScaleFitLog2) (e4m3::update_scale_ref): 2^15 < fp16's
  // 65504. A small slack makes the maximum move (and the team redo P and rescale O) on many
  // tiles: with slack 1, any of 16 rows' tile maxima passing it hit 44% of the tiles of the
  // memory-bound benchmark; R, with 2^11 of room above it, moves only for scale outliers. fp8's
  // P' = P has room for more.
  static constexpr int kScaleFitLog2 = 11;
  static constexpr float kMaxSlack = kDsMla ? 4.f : 8.f;
  static_assert(!kDsMla || kScaleFitLog2 + 4 <= 15, "P' must stay below fp16's largest value");

  // Shared memory (bytes). The Q tile is only read while building the fragments at the start of
  // a piece, so it shares its space with team 0's split-K reduction buffer.
  static constexpr int kQStride = 2 * kLatentDim + 32;       // 1184: 2-way conflicts at worst
  // floats: the float2 accesses are conflict-free per half-warp (the wgmma path's scalar writes
  // have 2-way conflicts; a stride that suits both does not exist)
  static constexpr int kRedSStride = kBlockN + 8;
  static constexpr int kRedSBytes = kScoreGroups * kRows * kRedSStride * 4;
  static constexpr int kQBytes = kRows * kQStride;
  static constexpr int kQRedBytes = kQBytes > kRedSBytes ? kQBytes : kRedSBytes;
  // fp8 raw rows: rows 32-63 of a stage lie 32 bytes further on. A 576-byte row is 64 bytes past a multiple of 128, so
  // rows k and k + 2 share banks, and the natural PV order had 2-way conflicts; with the shift, the 4 keys that a
  // half-warp's PV load takes (an even and an odd key of each half: pv_tile_key) lie 0, 64, 32, 96 bytes apart. A whole
  // tile then comes in two bulk copies, one per half.
  static constexpr int kRowHalfShift = kRawRows && !kDsMla ? 32 : 0;
  static constexpr int kStageKeyBytes = kBlockN * (kRawRows ? kRawRowBytes : kKeyBytes) + kRowHalfShift;  // 40 KB; raw 41 / 36 KB
  static constexpr int kStageScaleBytes = kDsMla && !kRawRows ? kBlockN * 16 : 0;            // fp32 [64][4]
  // fp8_ds_mla: scale of key k, tile t at byte kScaleOffset + kScaleRowBytes k + 4 t of a stage.
  static constexpr int kScaleOffset = kRawRows ? kDsMlaScaleOffset : kStageKeyBytes;
  static constexpr int kScaleRowBytes = kRawRows ? kDsMlaRowBytes : 16;
  // fp8_ds_mla: chunk of a key's first k_pe bytes (raw rows: after the 16 scale bytes)
  static constexpr int kRopeChunk = kKvLoraRank / 16 + (kRawRows ? 1 : 0);
  // QK^T (mma.sync) and PV read keys in the natural order where the layout allows (pv_key).
  static constexpr bool kNaturalPv = kQkWgmma || (kRawRows && kDsMla);
  // + flags; wgmma reads the key blocks in the 128-byte swizzle: 1024-byte aligned stages
  // Row flags: one byte per key (kBulkRows: one per quarter, its valid rows; read as one word). The
  // bulk copies' stages stay 16-byte aligned.
  static constexpr int kStageFlagBytes = kBulkRows ? 16 : kBlockN;
  static constexpr int kStageBytes = kQkWgmma ? align1024(kStageKeyBytes + kStageScaleBytes + kStageFlagBytes)
                                              : kStageKeyBytes + kStageScaleBytes + kStageFlagBytes;
  // P (fp16) [16][64 keys + 8 pad], key k at p_column(k): the PV A fragment's key pairs (in the
  // order pv_key gives) are 32-bit words; 144-byte rows: conflict-free reads.
  static constexpr int kPStride = kBlockN + 8;               // halves
  static constexpr int kPBytes = kRows * kPStride * 2;
  static constexpr int kRedBytes = kTeamWarps * kRows * 4;
  static constexpr int kExceedBytes = 128;                   // one flag byte per warp (padded);
                                                             // TMA tiles: the stages' mbarriers at 64
  // fp8_ds_mla: the tile's PV scales scale[k, t] / R_t as fp16 [4 tiles][64 keys] in P's column
  // order, written once per tile in the softmax step. Not with fp16 q on the mma.sync path (its
  // q_pe lo-term fragments leave no shared memory for them): that one recomputes them per PV k-step.
  static constexpr bool kPvScaleTile = kDsMla && (kQkWgmma || !kPeLoTerm);
  static constexpr int kPvScaleBytes = kPvScaleTile ? 4 * kBlockN * 2 : 0;
  static constexpr int kTeamBytesRaw = kStages * kStageBytes + kPBytes + kRedBytes + kExceedBytes + kPvScaleBytes;
  static constexpr int kTeamBytes = kQkWgmma ? align1024(kTeamBytesRaw) : kTeamBytesRaw;
  static constexpr int kOffQ = 0;                            // = team 0's red_s
  static constexpr int kOffRedS1 = kQRedBytes;               // team 1's red_s
  // team t at kOffTeam + t * kTeamBytes
  static constexpr int kOffTeam = kQkWgmma ? align1024(kOffRedS1 + kRedSBytes) : kOffRedS1 + kRedSBytes;
  static constexpr int kOffRowExp = kOffTeam + kTeams * kTeamBytes;   // row exponent, score scale, limit
  // q as MMA operand: mma.sync, [k-step][g][lane] uint4 A fragments; wgmma, the B operand
  // [5 dim blocks][32 rows: hi terms of the 16 rows, then lo terms][128 B] in the 128-byte
  // swizzle (fp8_ds_mla: block 4 holds the bf16 rope dims of rows 0-15).
  static constexpr int kOffQFrag = kQkWgmma ? align1024(kOffRowExp + 3 * kRows * 4) : kOffRowExp + 3 * kRows * 4;
  static constexpr int kQFragBytes = kQkWgmma ? 5 * 32 * 128 : kQSteps * 4 * 32 * 16;
  static constexpr int kSmemBytes = kOffQFrag + kQFragBytes;
  static constexpr int kSmemLaunchBytes = kSmemBytes + (kQkWgmma ? 1024 : 0);  // + base alignment
  // Team-relative offsets.
  static constexpr int kOffStages = 0;
  static constexpr int kOffP = kStages * kStageBytes;
  static constexpr int kOffRed = kOffP + kPBytes;
  static constexpr int kOffExceed = kOffRed + kRedBytes;
  static constexpr int kOffPvScale = kOffExceed + kExceedBytes;
  static constexpr int kOffTileBars = kOffExceed + 64;        // kTmaTiles, kBulkRows: one 8-byte mbarrier per stage
  static constexpr int kTmaRowBytes = 5 * 128 + (kDsMla ? 16 : 0);  // TMA bytes per cache row
  // End-of-piece exchange (team 1 -> team 0) in team 1's stages: o (32 floats per thread,
  // float index k * 256 + thread), then m and l per row, then R per warp.
  static constexpr int kXchgFloats = 32 * kTeamThreads + 2 * kRows + kTeamWarps;
  static_assert(kXchgFloats * 4 <= kStages * kStageBytes);
  static_assert(kSmemLaunchBytes <= 227 * 1024, "fp8 decode tiles do not fit in shared memory");
  static_assert(!kTmaTiles || kStageKeyBytes + kStageScaleBytes + kBlockN + 4 <= kStageBytes, "flags + 4 summary bytes");
  static_assert((kStageKeyBytes + kStageScaleBytes + kBlockN) % 4 == 0, "the summary bytes are read as one word");
};

__device__ __forceinline__ int key_swizzle(int key) { return ((key & 1) << 2) | (key & 2) | ((key >> 2) & 1); }

// Swizzle of key k's chunks: the bits of k % 8 reversed in 640-byte rows (mma.sync path: conflict-
// free for its QK^T and PV loads), k % 8 in the 128-byte swizzle wgmma reads (its PV loads stay
// conflict-free through the order pv_key gives the keys).
template <bool kQkWgmma>
__device__ __forceinline__ int chunk_swizzle(int key) {
  return kQkWgmma ? key % 8 : key_swizzle(key);
}

// Byte offset of raw row r in a stage (kRawRows; fp8: rows 32-63 shifted by kRowHalfShift).
template <typename C>
__device__ __forceinline__ uint32_t raw_row_offset(int r) {
  return r * C::kRawRowBytes + C::kRowHalfShift * (r / 32);
}
// Byte offset of 16-byte chunk c (c % 8 = its place among 8) of key k in a stage. (Raw rows: the
// cache row's own chunks, k_pe from chunk 33 on.)
template <typename C>
__device__ __forceinline__ uint32_t key_chunk_offset(int key, int chunk) {
  if constexpr (C::kRawRows) return raw_row_offset<C>(key) + 16 * chunk;
  return key * C::kKeyStride + (chunk / 8) * C::kBlockStride + (((chunk % 8) ^ chunk_swizzle<C::kQkWgmma>(key)) << 4);
}

// PV k-step order: k indices (2 qd, 2 qd + 1, 2 qd + 8, 2 qd + 9) of the B fragment (e = 0..3)
// are keys 16 ks + pv_key(qd, e), chosen so that each half-warp of a 64-bit load instruction (the
// four keys of qd = 0..3 for one e, two chunks, two halves) hits 32 distinct banks: keys
// qd + 4 e for 640-byte rows (bit-reversed swizzle), the natural order for the 128-byte swizzle
// and for raw rows (keys 2 qd + e % 2 ..: chunk places (k + c) % 8, 2 qd + {0, 1} + const).
template <bool kNaturalPv>
__device__ __forceinline__ int pv_key(int qd, int e) {
  return kNaturalPv ? 8 * (e / 2) + 2 * qd + e % 2 : qd + 4 * e;
}
// Key (of 8) of B row / C column c of an n-tile in the mma.sync QK^T. Raw rows: the bits of c
// reversed, so that the two keys of each quarter-warp's 128-bit loads (c = 2 j, 2 j + 1) are 4 rows,
// 4 chunk places, apart; the swizzled 640-byte rows take the keys in order.
template <typename C>
__device__ __forceinline__ int qk_key(int c) {
  return C::kRawRows && C::kDsMla ? key_swizzle(c) : c;  // (fp8 raw rows: adjacent keys, 4 places apart)
}
// fp8 raw rows (kRowHalfShift): PV k-step ks takes, for thread qd, keys 32 (qd / 2) + qd % 2 + 8 ks + 2 e (e = 0..3):
// an even and an odd key of each half of the tile per half-warp load (conflict-free with the shift).
__device__ __forceinline__ int pv_tile_key(int ks, int qd, int e) { return 32 * (qd / 2) + qd % 2 + 8 * ks + 2 * e; }
// Column of key k (of 64) in the P tile: pairs (pv_key(qd, 0), pv_key(qd, 1)) at 2 qd, (.., 2 | 3)
// at 2 qd + 8 of each 16, so that the A fragment is four 32-bit loads (e4m3::load_pv_a); with the
// half shift, column 16 ks + 8 (e / 2) + 2 qd + e % 2 holds pv_tile_key(ks, qd, e).
template <typename C>
__device__ __forceinline__ int p_column(int k) {
  if constexpr (C::kRowHalfShift != 0) {
    const int qd = 2 * (k / 32) + k % 2, r = (k % 32) / 2;  // r = 4 ks + e
    return 16 * (r / 4) + 8 * ((r % 4) / 2) + 2 * qd + r % 2;
  }
  return C::kNaturalPv ? k : 8 * (k / 8) + 2 * (k % 4) + (k % 8) / 4;
}

// Whether key k of a stage holds a valid cache row: its flag byte, or with bulk copies (kBulkRows) whether
// it lies below its quarter's count of valid rows.
template <typename C>
__device__ __forceinline__ bool stage_row_valid(const uint8_t* flags, int k) {
  if constexpr (C::kBulkRows) return k % 16 < flags[k / 16];
  return flags[k] != 0;
}

template <typename T, CacheFormat kFormat, int kRowThreads, bool kQkWgmma, int kTma = kTmaNone, bool kRawRows = false>
__global__ void __launch_bounds__(512, 1) decode_split_fp8_kernel(const __grid_constant__ DecodeParams p) {
  using C = Fp8SplitConfig<T, kFormat, kRowThreads, kQkWgmma, kTma, kRawRows>;
  constexpr bool kTmaTiles = C::kTmaTiles;
  using sm80::cp_async16;
  using sm80::mma_16816;
  using sm80::named_barrier;
  using sm80::pack2;
  using sm80::smem_addr;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  // (wgmma: swizzled blocks need 1024-byte alignment; the launch adds 1 KB for it.)
  uint8_t* const smem = kQkWgmma ? sm90::align_to_swizzle_atom(smem_raw) : smem_raw;

  const int tid = threadIdx.x, team = tid / C::kTeamThreads, ttid = tid % C::kTeamThreads;
  const int warp = ttid / 32, lane = tid % 32, grp = lane / 4, qd = lane % 4;
  const int g = warp % 4, kh = warp / 4;  // QK^T roles
  const int vt = warp / 2;                // PV: this warp's output dims 64 warp .. + 63 lie in tile vt
  uint8_t* const team_smem = smem + C::kOffTeam + team * C::kTeamBytes;
  float* const red = reinterpret_cast<float*>(team_smem + C::kOffRed);
  uint8_t* const exceed_s = team_smem + C::kOffExceed;
  __half* const pv_scale_s = reinterpret_cast<__half*>(team_smem + C::kOffPvScale);  // kPvScaleTile
  float* const red_s = reinterpret_cast<float*>(smem + (team == 0 ? C::kOffQ : C::kOffRedS1));
  __half* const p_tile = reinterpret_cast<__half*>(team_smem + C::kOffP);
  float* const xchg = reinterpret_cast<float*>(smem + C::kOffTeam + C::kTeamBytes);  // team 1's stages
  int* const row_exp = reinterpret_cast<int*>(smem + C::kOffRowExp);
  float* const row_scale_s = reinterpret_cast<float*>(row_exp + C::kRows);
  int* const row_lim_s = row_exp + 2 * C::kRows;
  const uint32_t stage_base = smem_addr(team_smem + C::kOffStages);
  const auto team_sync = [&] { named_barrier(1 + team, C::kTeamThreads); };
  // kTmaTiles: the stages' mbarriers (one arrival, the issuing thread's expect_tx) and the parity
  // of each stage's next completion (bit s; every thread of the team tracks the same sequence).
  const uint32_t tile_bar = smem_addr(team_smem + C::kOffTileBars);
  uint32_t tile_phase = 0;
  if constexpr (kTmaTiles) {
#if MLA_SM90A
    if (ttid == 0) {
      // One arrival per page of a tile (whole page: 1; else p.tma_box_rows rows each): its
      // thread's expect_tx.
      const uint32_t arrivals = kTma == kTmaWholePage ? 1 : kBlockN / p.tma_box_rows;
      for (int s2 = 0; s2 < C::kStages; ++s2) mbar_init(tile_bar + 8 * s2, arrivals);
      mbar_init_fence();
    }
    __syncthreads();
#endif
  } else if constexpr (C::kBulkRows) {
#if MLA_DECODE_BULK
    if (ttid == 0) {  // one arrival per quarter (its issuing thread's expect_tx, or a plain arrival)
      for (int s2 = 0; s2 < C::kStages; ++s2) mbar_init(tile_bar + 8 * s2, 4);
      mbar_init_fence();
    }
    __syncthreads();
#else
    __trap();  // kBulkRows kernels are launched on sm90 and newer only
#endif
  }

  // Launched as a dependent too (common/pdl.cuh): wait until what the kernels before wrote (the
  // plan among it) is visible, then let the combine launch, which reads the plan before it waits.
  pdl_wait_prerequisites();
  pdl_launch_dependents();
  const SchedulePart part = schedule_part(p);
  const int row0 = blockIdx.y * C::kRows;
  const int rows_here = min(C::kRows, p.num_rows - row0);
  const float tensor_scale = C::kDsMla ? 1.f : *p.scale;  // fp8: scores and output, exactly
  // cp.async loads of a tile inside one page: one block-table entry and one division per tile (see
  // page_of). Only with two rows per thread: with one, the general path costs the same and a
  // second path cost the fp8 kernel registers (spills).
  const bool tile_in_one_page = C::kRowsPerThread > 1 && p.block_size % kBlockN == 0;

  for (int req = part.begin_req; req <= part.end_req; ++req) {
    const Piece piece = part_piece(p, part, req);
    const int seq_len = piece.seq_len, kv_len = piece.kv_len, tile_begin = piece.tile_begin, num_tiles = piece.num_tiles;
    const int tile_end = tile_begin + num_tiles;
    const int32_t* bt = piece.bt;

    // This thread's cache rows of tile t are load_row + kRowStep rr; their page ids are read a
    // tile ahead (page_of) so that issuing the copies never waits for the block table. When pages
    // hold whole tiles (block_size a multiple of 64), a tile is one page: one block-table entry
    // (the same address for every thread) and one division per tile instead of one per row, and
    // the rows' addresses differ by a constant. Otherwise each row finds its own page.
    constexpr int kRR = C::kRowsPerThread;
    // (128-byte swizzle with 4 threads per row: a quarter-warp's two rows are r and r + 4, whose
    // chunks land in opposite halves of the 128 bytes; rows r and r + 1 would share banks.)
    const int load_row = kQkWgmma && C::kRowThreads == 4 ? 8 * (ttid / 32) + key_swizzle(lane / 4) : ttid / C::kRowThreads;
    const int sub = ttid % C::kRowThreads;
    struct Pages {
      int id[kRR];  // one page per row; whole-tile pages: id[0] is the tile's page
    };
    // Raw rows: thread q (< 4) of warp 0 copies quarter q, rows 16 q .. + 15 of each tile (issue_bulk).
    const int raw_q = ttid % 4;
    auto page_of = [&](int t) {
      Pages pg;
      if constexpr (C::kRawRows) {
        pg.id[0] = t < tile_end ? cache_page(p, bt, t * kBlockN + 16 * raw_q, kv_len) : -1;
      } else if (tile_in_one_page) {
        pg.id[0] = t < tile_end ? cache_page(p, bt, t * kBlockN, kv_len) : -1;
      } else {
#pragma unroll
        for (int rr = 0; rr < kRR; ++rr)
          pg.id[rr] = t < tile_end ? cache_page(p, bt, t * kBlockN + load_row + C::kRowStep * rr, kv_len) : -1;
      }
      return pg;
    };
    // cp.async of the team's tile t (relative to the request), pages `pg`, into stage `stage`, in
    // two halves (issue_rows(c, 0), issue_rows(c, 1)) so that a warp's copies do not queue up in
    // one burst: the second half goes out after the tile's QK^T.
    struct RowCopy {
      const uint8_t* src[kRR];  // this thread's 16-byte column of each of its cache rows
      uint32_t dst;             // shared address of its first row in the stage
      bool ok[kRR];
    };
    auto prepare_rows = [&](int t, int stage, const Pages& pg) {
      RowCopy c;
      uint8_t* st = team_smem + C::kOffStages + stage * C::kStageBytes;
      const auto* const cache = static_cast<const uint8_t*>(p.kv_cache);
      if (tile_in_one_page) {
        const int k0 = t * kBlockN, page = pg.id[0];
        const bool page_ok = page >= 0 && page < p.num_blocks;
        const uint8_t* row0 = cache + int64_t(page) * p.stride_cache_block_bytes +
                              int64_t(p.block_div.mod(k0, p.block_div.div(k0)) + load_row) * p.stride_cache_token_bytes;
#pragma unroll
        for (int rr = 0; rr < kRR; ++rr) {
          const int r = load_row + C::kRowStep * rr;
          c.ok[rr] = page_ok && k0 + r < kv_len;
          c.src[rr] = (c.ok[rr] ? row0 + rr * C::kRowStep * p.stride_cache_token_bytes : cache) + 16 * sub;  // any valid address
        }
      } else {
#pragma unroll
        for (int rr = 0; rr < kRR; ++rr) {
          const uint8_t* row = cache_row_on(p, pg.id[rr], t * kBlockN + load_row + C::kRowStep * rr);
          c.ok[rr] = row != nullptr;
          c.src[rr] = (c.ok[rr] ? row : cache) + 16 * sub;  // any valid address
        }
      }
      if (sub == 0) {
#pragma unroll
        for (int rr = 0; rr < kRR; ++rr) st[C::kStageKeyBytes + C::kStageScaleBytes + load_row + C::kRowStep * rr] = c.ok[rr];
      }
      c.dst = smem_addr(st) + load_row * C::kKeyStride;
      return c;
    };
    // Thread `sub` copies raw chunks sub + kRowThreads j to key_chunk_offset(r, c), where c % 8 is
    // sub or (4 threads, odd j) sub + 4: two offsets, the rest immediates. The swizzle is the
    // same for all of a thread's rows (kRowStep % 8 == 0).
    const int f_row = chunk_swizzle<kQkWgmma>(load_row);
    const uint32_t off_lo = (sub ^ f_row) << 4, off_hi = ((sub + 4) ^ f_row) << 4;
    auto chunk_off = [&](int c_minus_sub) {  // destination offset of raw chunk sub + c_minus_sub
      return uint32_t(C::kBlockStride * (c_minus_sub / 8)) + (c_minus_sub % 8 == 0 ? off_lo : off_hi);
    };
    auto issue_rows = [&](const RowCopy& c, int half) {
#pragma unroll
      for (int rr = 0; rr < kRR; ++rr) {
        const uint32_t dst = c.dst + rr * C::kRowStep * C::kKeyStride;
#pragma unroll
        for (int j = 0; j < C::kJ; ++j) {
          if ((j < C::kJ / 2) != (half == 0)) continue;
          const int cj = C::kRowThreads * j;  // raw chunk sub + cj (8 threads: sub < 8, so c / 8 = j)
          if (C::kRowThreads * (j + 1) > C::kE4m3Chunks && sub + cj >= C::kE4m3Chunks) continue;  // fp8, 8 threads: 36 chunks
          cp_async16(dst + chunk_off(cj), c.src[rr] + 16 * cj, c.ok[rr]);
        }
        if (C::kDsMla && half == 1) {
          // k_pe: raw chunks 33 + sub (+ 4 with 4 threads) -> chunks 32 + sub (+ 4); the scales (raw
          // chunk 32) go to their own array after the stage's keys (thread sub 0, whose src is the row).
#pragma unroll
          for (int q = 0; q < 8 / C::kRowThreads; ++q)
            cp_async16(dst + C::kBlockStride * 4 + chunk_off(C::kRowThreads * q), c.src[rr] + kDsMlaRopeOffset + 16 * C::kRowThreads * q, c.ok[rr]);
          if (sub == 0) {
            const int r = load_row + C::kRowStep * rr;
            cp_async16(dst - r * C::kKeyStride + C::kStageKeyBytes + 16 * r, c.src[rr] + kDsMlaScaleOffset, c.ok[rr]);
          }
        }
      }
    };
    // kBulkRows: thread q < 4 of the team (warp 0: the other warps skip the copies) writes the count of
    // valid rows of quarter q of tile t (flag byte q) and copies the quarter's valid rows as one bulk
    // copy, arriving on the stage's mbarrier with the bytes; when the tile is one page, thread 0 copies
    // the tile's valid rows and threads 1-3 arrive without bytes (one copy instead of four).
    auto issue_bulk = [&](int t, int stage, const Pages& pg) {
#if MLA_DECODE_BULK
      if (ttid >= 4) return;
      uint8_t* st = team_smem + C::kOffStages + stage * C::kStageBytes;
      const int k0 = t * kBlockN + 16 * raw_q, page = pg.id[0];
      const bool page_ok = page >= 0 && page < p.num_blocks;  // (page >= 0: k0 < kv_len)
      const int n_valid = page_ok ? min(16, kv_len - k0) : 0;
      st[C::kStageKeyBytes + raw_q] = n_valid;
      const uint32_t bar = tile_bar + 8 * stage;
      // Rows this thread copies: its quarter's, or when the tile is one page (rows past the sequence are
      // the only invalid ones) thread 0 the whole tile's, fp8 threads 0 and 2 a half each (kRowHalfShift).
      const bool whole_tile = p.block_size % kBlockN == 0;  // (from the parameters: no register through the loop)
      constexpr int kCopyRows = C::kRowHalfShift != 0 ? kBlockN / 2 : kBlockN;
      const bool copies = C::kRowHalfShift != 0 ? raw_q % 2 == 0 : raw_q == 0;
      const int rows = !whole_tile ? n_valid : copies && page_ok ? min(kCopyRows, kv_len - k0) : 0;
      if (rows > 0) {
        const auto* const src = static_cast<const uint8_t*>(p.kv_cache) + int64_t(page) * p.stride_cache_block_bytes +
                                int64_t(p.block_div.mod(k0, p.block_div.div(k0))) * C::kRawRowBytes;
        mbar_arrive_expect_tx(bar, rows * C::kRawRowBytes);
        bulk_load(stage_base + stage * C::kStageBytes + raw_row_offset<C>(16 * raw_q), src, rows * C::kRawRowBytes, bar);
      } else {
        mbar_arrive(bar);  // nothing (more) to copy
      }
#endif
    };
    auto load_tile = [&](int t, int stage, const Pages& pg) {
      if constexpr (C::kBulkRows) return issue_bulk(t, stage, pg);
      const RowCopy c = prepare_rows(t, stage, pg);
      issue_rows(c, 0);
      issue_rows(c, 1);
    };
    // kTmaWholePage: tile t is one page (page_id: its block-table entry, read a tile ahead by
    // threads 0-64); thread 0 copies it as five [64 rows][128 B] boxes (+ fp8_ds_mla's scales),
    // threads 0-63 write the row flags and thread 64 the page's (byte 64).
    // kTmaPages: a tile is 64 / p.tma_box_rows pages (2, 4 or 8 for block sizes 32, 16, 8).
    // Row r is lane r % 16 of warp r / 16 (warps 0-3: at most two pages per warp, one at block
    // size 16, since a warp issues its lanes' boxes one lane after another). These threads read
    // their row's block-table entry a tile ahead; at issue time they write the row flags (and
    // each warp whether any row of its 16 is invalid, bytes 64-67), and the first thread of each
    // page copies it: five [rows][128 B] boxes (+ scales) at row offset j * rows of page j,
    // completing its share of the stage's mbarrier (or arriving without bytes when the page is
    // invalid or past the sequence). (The whole-page path is kept separate: the per-row lookups
    // and votes cost block size 64 ~3.5% in a same-run A/B.)
    const bool page_row_thread = warp < 4 && lane < 16;
    const int page_row = 16 * warp + lane;
    auto tma_page_of = [&](int t) {
      if constexpr (kTma == kTmaWholePage) return ttid <= kBlockN && t < tile_end ? cache_page(p, bt, t * kBlockN, kv_len) : -1;
      else return page_row_thread && t < tile_end ? cache_page(p, bt, t * kBlockN + page_row, kv_len) : -1;
    };
    auto issue_tile = [&](int t, int stage, int page_id) {
#if MLA_SM90A
      if constexpr (kTma == kTmaWholePage) {
        const int k0 = t * kBlockN;
        const bool page_ok = page_id >= 0 && page_id < p.num_blocks;
        uint8_t* flags_w = team_smem + C::kOffStages + stage * C::kStageBytes + C::kStageKeyBytes + C::kStageScaleBytes;
        if (ttid < kBlockN) flags_w[ttid] = page_ok && k0 + ttid < kv_len;
        if (ttid == kBlockN) flags_w[kBlockN] = page_ok;
        if (ttid == 0) {
          const uint32_t bar = tile_bar + 8 * stage, dst = stage_base + stage * C::kStageBytes;
          if (page_ok) {
            const int row = p.block_div.mod(k0, p.block_div.div(k0));
            mbar_arrive_expect_tx(bar, C::kTmaRowBytes * kBlockN);
#pragma unroll
            for (int b = 0; b < 5; ++b)  // nope blocks, then the rope dims (fp8: 64 bytes + 64 zeros)
              sm90::tma_load_3d(dst + b * C::kBlockStride, &p.kv_map, bar,
                                b < 4 ? 128 * b : (C::kDsMla ? kDsMlaRopeOffset : kKvLoraRank), row, page_id);
            if constexpr (C::kDsMla) sm90::tma_load_3d(dst + C::kStageKeyBytes, &p.scale_map, bar, 0, row, page_id);
          } else {
            mbar_arrive(bar);  // nothing to copy: every row of the tile is invalid
          }
        }
      } else if (page_row_thread) {
        const int k0 = t * kBlockN, key = k0 + page_row;
        const bool page_ok = page_id >= 0 && page_id < p.num_blocks;
        const bool row_ok = page_ok && key < kv_len;
        uint8_t* flags_w = team_smem + C::kOffStages + stage * C::kStageBytes + C::kStageKeyBytes + C::kStageScaleBytes;
        flags_w[page_row] = row_ok;
        const bool any_invalid = __any_sync(0x0000ffffu, !row_ok);
        if (lane == 0) flags_w[kBlockN + warp] = any_invalid;
        const int rows = p.tma_box_rows;
        if (page_row % rows == 0) {
          const uint32_t bar = tile_bar + 8 * stage, dst = stage_base + stage * C::kStageBytes;
          if (row_ok) {  // (the page's first row is valid: copy the page, later rows get zeroed)
            const int row = p.block_div.mod(key, p.block_div.div(key));
            mbar_arrive_expect_tx(bar, C::kTmaRowBytes * rows);
#pragma unroll
            for (int b = 0; b < 5; ++b)  // nope blocks, then the rope dims (fp8: 64 bytes + 64 zeros)
              sm90::tma_load_3d(dst + b * C::kBlockStride + page_row * 128, &p.kv_map, bar,
                                b < 4 ? 128 * b : (C::kDsMla ? kDsMlaRopeOffset : kKvLoraRank), row, page_id);
            if constexpr (C::kDsMla) sm90::tma_load_3d(dst + C::kStageKeyBytes + page_row * 16, &p.scale_map, bar, 0, row, page_id);
          } else {
            mbar_arrive(bar);  // nothing to copy: every row of this page is invalid
          }
        }
      }
#endif
    };

    float o[2][4][4];  // [set S][n-tile j][C fragment c]: dims 64 warp + 16 qd + 8 (c % 2) + 4 S + j
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float v_ref = 0.f, v_inv = 0.f;  // R of tile vt and 1 / R (fp8_ds_mla); fp8 uses 1
    // This warp's A fragment of k-step s: 16 bytes at qfrag + s * kQFragStepBytes.
    constexpr int kQFragStepBytes = 4 * 32 * 16;
    const uint32_t qfrag = smem_addr(smem + C::kOffQFrag) + (g * 32 + lane) * 16;
#pragma unroll
    for (int S = 0; S < 2; ++S)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[S][j][e] = 0.f;

    if (num_tiles > 0) {
      // Q rows (padding rows zero) in the first cp.async group of both teams, then each team's
      // first tile.
      load_q_rows<T, C::kRows, C::kThreads>(p, req, row0, rows_here, tid, smem_addr(smem + C::kOffQ),
                                            [](int r, int c) { return uint32_t(r * C::kQStride + 16 * c); });
      sm80::cp_async_commit();
      if (team < num_tiles) {
        if constexpr (kTmaTiles) issue_tile(tile_begin + team, 0, tma_page_of(tile_begin + team));
        else load_tile(tile_begin + team, 0, page_of(tile_begin + team));
      }
      sm80::cp_async_commit();
      sm80::cp_async_wait<1>();
      __syncthreads();
      // Row exponents: warp r of the CTA scans row r (18 values per lane).
      {
        const int r = tid / 32;
        const T* row = reinterpret_cast<const T*>(smem + C::kOffQ + r * C::kQStride);
        float mx = 0.f;
#pragma unroll
        for (int j = 0; j < kLatentDim / 32; ++j) mx = fmaxf(mx, fabsf(to_float(row[lane + 32 * j])));
#pragma unroll
        for (int d = 16; d >= 1; d /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
        int e = 0;
        if (mx > 0.f && mx <= 3.0e38f) {
          frexpf(mx, &e);
          // mx * 2^-e in [2^14, 2^15) for fp16 fragments, [2^7, 2^8) for e4m3 terms (< 448)
          e = max(e - (kQkWgmma ? 8 : 15), -120);
        }
        if (lane == 0) {
          // Per row, kept in shared memory (registers are at the 128 cap): exponent, the row's
          // exp2-domain score scale, and how many leading keys it sees (0 for padding rows).
          row_exp[r] = e;
          row_scale_s[r] = ldexpf(p.softmax_scale_log2 * tensor_scale, e);
          const int s = (row0 + r) / p.h_q;
          row_lim_s[r] = r >= rows_here ? 0 : p.causal ? min(max(seq_len - p.s_q + 1 + s, 0), seq_len) : seq_len;
        }
      }
      __syncthreads();
      if constexpr (kQkWgmma) {
        // The B operand, by all threads: q' = q 2^-e as hi and lo e4m3 terms (rows r and 16 + r
        // of each dim block; fp8_ds_mla's rope dims as bf16 in block 4), 4 dims per step.
        const uint32_t qb = smem_addr(smem + C::kOffQFrag);
        auto q_scaled = [&](int r, int d) {  // inf -> NaN: e4m3 saturates inf, NaN propagates
          const float x = to_float(reinterpret_cast<const T*>(smem + C::kOffQ + r * C::kQStride)[d]) * e4m3::pow2(-row_exp[r]);
          return fabsf(x) == INFINITY ? __int_as_float(0x7fffffff) : x;
        };
        auto b_operand_offset = [](int n, int byte) {  // row n, byte `byte` of the 576 / 512 + 128
          return uint32_t((byte / 128) * 32 * 128 + n * 128 + ((((byte % 128) / 16) ^ (n % 8)) << 4) + byte % 16);
        };
        constexpr int kE4m3Dims = C::kDsMla ? kKvLoraRank : kLatentDim;
        for (int idx = tid; idx < C::kRows * kE4m3Dims / 4; idx += C::kThreads) {
          const int r = idx / (kE4m3Dims / 4), d = 4 * (idx % (kE4m3Dims / 4));
          uint16_t h01, l01, h23, l23;
          e4m3::split_e4m3x2(q_scaled(r, d), q_scaled(r, d + 1), h01, l01);
          e4m3::split_e4m3x2(q_scaled(r, d + 2), q_scaled(r, d + 3), h23, l23);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(qb + b_operand_offset(r, d)), "r"(h01 | (uint32_t(h23) << 16)));
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(qb + b_operand_offset(16 + r, d)), "r"(l01 | (uint32_t(l23) << 16)));
        }
        if constexpr (C::kDsMla) {
          for (int idx = tid; idx < C::kRows * kRopeDim / 2; idx += C::kThreads) {
            const int r = idx / (kRopeDim / 2), d = 2 * (idx % (kRopeDim / 2));
            const uint32_t v = pack2<__nv_bfloat16>(q_scaled(r, kKvLoraRank + d), q_scaled(r, kKvLoraRank + d + 1));
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(qb + b_operand_offset(r, kKvLoraRank + 2 * d)), "r"(v));
          }
        }
        fence_proxy_async_smem();  // st.shared -> wgmma's async proxy (the barrier below)
      } else if (team == 0 && kh == 0) {
        // The A fragments of each dim group, built once per piece by team 0's warps 0-3.
        const int e0 = row_exp[grp], e1 = row_exp[grp + 8];
        const uint8_t* q0 = smem + C::kOffQ + grp * C::kQStride;
        const uint8_t* q1 = q0 + 8 * C::kQStride;
#pragma unroll
        for (int s = 0; s < C::kQSteps; ++s) {
          const bool bf16_step = C::kDsMla && s >= C::kF16Steps, lo_step = s > C::kF16Steps;
          const int d = s >= C::kF16Steps ? kKvLoraRank + 16 * g + 4 * qd : 128 * g + 64 * (s / 4) + 16 * qd + 4 * (s % 4);
          uint32_t qf[4];
#pragma unroll
          for (int half = 0; half < 2; ++half) {  // dims d + 2 half, + 1
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const T* src = reinterpret_cast<const T*>(rr == 0 ? q0 : q1) + d + 2 * half;
              const int e = rr == 0 ? e0 : e1;
              float a = to_float(src[0]) * e4m3::pow2(-e), b = to_float(src[1]) * e4m3::pow2(-e);
              if (lo_step) {  // what bf16 lost of an fp16 q_pe (exact: 11 bits fit in two bf16 terms)
                a -= __bfloat162float(__float2bfloat16_rn(a));
                b -= __bfloat162float(__float2bfloat16_rn(b));
              }
              qf[2 * half + rr] = bf16_step ? pack2<__nv_bfloat16>(a, b) : pack2<__half>(a, b);
            }
          }
          *reinterpret_cast<uint4*>(smem + C::kOffQFrag + ((s * 4 + g) * 32 + lane) * 16) = make_uint4(qf[0], qf[1], qf[2], qf[3]);
        }
      }
      __syncthreads();  // the Q tile (= team 0's red_s) is free
    }

    // ---- the team's tiles: i = team, team + 2, ...; local index li = i / 2, stage li % 2.
    Pages next_page{};
    int tma_page = -1;  // kTmaTiles: the page of the team's next tile to copy
    if constexpr (kTmaTiles) tma_page = tma_page_of(tile_begin + team + C::kTeams);
    else next_page = page_of(tile_begin + team + C::kTeams);
    for (int i = team; i < num_tiles; i += C::kTeams) {
      const int li = i / C::kTeams, stage = li % C::kStages;
      uint8_t* const st = team_smem + C::kOffStages + stage * C::kStageBytes;
      // fp8_ds_mla: the scale of key k's 128-wide tile t
      const float* scales = reinterpret_cast<const float*>(st + C::kScaleOffset);
      auto scale_of = [scales](int k, int t) { return scales[C::kScaleRowBytes / 4 * k + t]; };
      const uint8_t* flags = st + C::kStageKeyBytes + C::kStageScaleBytes;
      if constexpr (kTmaTiles) {
#if MLA_SM90A
        mbar_wait(tile_bar + 8 * stage, (tile_phase >> stage) & 1);
        tile_phase ^= 1u << stage;
        // Invalid rows (past the sequence, or of an invalid page) hold whatever the page or the
        // stage's previous tile left: their scores are masked, but their values and scales meet
        // P = 0 in products, so they must be finite: zeroed here (values: blocks 0-3; before
        // wgmma reads the tile, hence the proxy fence). Rare: the last tile of a sequence. Whole
        // pages: the rows from the first invalid one on (all of them for an invalid page).
        if constexpr (kTma == kTmaWholePage) {
          const int t_abs = tile_begin + i;
          const int n_valid = flags[kBlockN] ? min(kBlockN, kv_len - t_abs * kBlockN) : 0;
          if (n_valid < kBlockN) {
            for (int idx = ttid; idx < (kBlockN - n_valid) * 33; idx += C::kTeamThreads) {
              const int r = n_valid + idx / 33, c = idx % 33;  // 32 value chunks, then the scales
              uint8_t* dst = c < 32 ? st + key_chunk_offset<C>(r, c) : st + C::kStageKeyBytes + 16 * r;
              if (c < 32 || C::kDsMla) *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
            }
            fence_proxy_async_smem();
          }
        } else if (*reinterpret_cast<const uint32_t*>(flags + kBlockN) != 0) {  // warps 0-3's votes
          for (int idx = ttid; idx < kBlockN * 33; idx += C::kTeamThreads) {
            const int r = idx / 33, c = idx % 33;  // 32 value chunks, then the scales
            if (flags[r]) continue;
            uint8_t* dst = c < 32 ? st + key_chunk_offset<C>(r, c) : st + C::kStageKeyBytes + 16 * r;
            if (c < 32 || C::kDsMla) *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
          }
          fence_proxy_async_smem();
        }
#endif
      } else if constexpr (C::kBulkRows) {
#if MLA_DECODE_BULK
        mbar_wait(tile_bar + 8 * stage, (tile_phase >> stage) & 1);
        tile_phase ^= 1u << stage;
        // Rows the bulk copies left out hold what the stage held before (an earlier tile, the
        // end-of-piece exchange, or nothing yet): zeroed, so that their values and scales meet
        // P = 0 as finite numbers (the cp.async copies zero-fill them). Rare: the last tile of a
        // sequence. The proxy fence orders these stores before a later bulk copy into the stage.
        if (*reinterpret_cast<const uint32_t*>(flags) != 0x10101010u) {  // some quarter with fewer than 16 rows
          for (int idx = ttid; idx < kBlockN * C::kRawRowChunks; idx += C::kTeamThreads) {
            const int r = idx / C::kRawRowChunks, c = idx % C::kRawRowChunks;
            if (!stage_row_valid<C>(flags, r)) *reinterpret_cast<uint4*>(st + raw_row_offset<C>(r) + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
          }
          fence_proxy_async_smem();
        }
#endif
      } else {
        sm80::cp_async_wait<0>();
        if constexpr (kQkWgmma) fence_proxy_async_smem();  // cp.async data -> wgmma
      }
      team_sync();  // tile i landed for the team; the team is done with its previous tile
      const bool load_next = i + C::kTeams < num_tiles;
      RowCopy next_copy{};
      if constexpr (C::kBulkRows) {
        if (load_next && warp == 0) {  // (a warp-uniform branch: the other warps skip it)
          issue_bulk(tile_begin + i + C::kTeams, (li + 1) % C::kStages, next_page);
          next_page = page_of(tile_begin + i + 2 * C::kTeams);
        }
      } else if (load_next && !kTmaTiles) {
        next_copy = prepare_rows(tile_begin + i + C::kTeams, (li + 1) % C::kStages, next_page);
        issue_rows(next_copy, 0);
        next_page = page_of(tile_begin + i + 2 * C::kTeams);
      }
      const uint32_t kbase = stage_base + stage * C::kStageBytes;

      // The next tile's second half of copies (TMA tiles: the whole tile; raw rows: none) goes out
      // while QK^T runs; R's vote after it. (TMA: issued after the wgmma so that the issuing warps, all in warpgroup
      // 0, do not hold back its QK^T, which warpgroup 1 waits for at the partial scores.)
      float v_rescale = 1.f;
      auto after_qk_issue = [&] {
        if constexpr (kTmaTiles) {
          if (load_next) {
            issue_tile(tile_begin + i + C::kTeams, (li + 1) % C::kStages, tma_page);
            tma_page = tma_page_of(tile_begin + i + 2 * C::kTeams);
          }
        } else if constexpr (!C::kBulkRows) {
          if (load_next) issue_rows(next_copy, 1);
          sm80::cp_async_commit();
        }
        // V reference R of this warp's tile (P' = P scale / R in fp16): see e4m3::update_scale_ref.
        // (Not before QK^T: the scale loads right after the barrier stalled the warp.)
        if constexpr (C::kDsMla) e4m3::update_scale_ref<C::kScaleFitLog2>(scale_of(lane, vt), scale_of(lane + 32, vt), v_ref, v_rescale, v_inv);
      };
      if constexpr (kQkWgmma) {
#if MLA_SM90A
        // ---- S^T partial = K_b q'_b^T for all 64 keys over dim blocks b = 2 wg, 2 wg + 1 (one
        // accumulator each: fp8_ds_mla scales them per key; e4m3 MMAs also keep fewer bits of a
        // long running sum) and rope k-steps 2 wg, 2 wg + 1; columns 0-15 hi terms, 16-31 lo.
        const int wg = warp / 4, w4 = warp % 4;
        // Descriptors (low words) of this warpgroup's first dim block in the K tile and in q; the
        // other k-steps and blocks are constant byte offsets (/ 16) from them.
        constexpr uint32_t kQBlock = 32 * 128;
        const uint32_t qb = smem_addr(smem + C::kOffQFrag);
        const uint32_t dk = sm90::kmajor_sw128_desc_lo(kbase + 2 * wg * C::kBlockStride);
        const uint32_t dq = sm90::kmajor_sw128_desc_lo(qb + 2 * wg * kQBlock);
        float acc[2][16];
        float acc_pe[8];  // fp8_ds_mla: the bf16 rope dims
        sm90::wgmma_fence();
#pragma unroll
        for (int bb = 0; bb < 2; ++bb)
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            sm90::wgmma_m64n32k32_e4m3(acc[bb], dk + (bb * C::kBlockStride + 32 * ks) / 16, dq + (bb * kQBlock + 32 * ks) / 16, ks > 0);
        // Rope dims: block 4.
        const uint32_t dk_pe = sm90::kmajor_sw128_desc_lo(kbase + 4 * C::kBlockStride);
        const uint32_t dq_pe = sm90::kmajor_sw128_desc_lo(qb + 4 * kQBlock);
        if constexpr (C::kDsMla) {
#pragma unroll
          for (int ks = 0; ks < 2; ++ks)
            sm90::wgmma_m64n16k16_bf16(acc_pe, dk_pe + 2 * (2 * wg + ks), dq_pe + 2 * (2 * wg + ks), ks > 0);
        } else {  // e4m3 rope dims 512 + 32 wg ..
          sm90::wgmma_m64n32k32_e4m3(acc[1], dk_pe + 2 * wg, dq_pe + 2 * wg, true);
        }
        sm90::wgmma_commit();
        after_qk_issue();
        sm90::wgmma_wait<0>();
        sm90::fence_accumulators(acc);
        if constexpr (C::kDsMla) sm90::fence_accumulators(acc_pe);
        // Thread: keys 16 w4 + grp + 8 r, rows 8 i + 2 qd + c: d[4 i + 2 r + c] (+ 8 for lo terms).
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = 16 * w4 + grp + 8 * r;
          const float s0 = C::kDsMla ? scale_of(key, 2 * wg) : 1.f, s1 = C::kDsMla ? scale_of(key, 2 * wg + 1) : 1.f;
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int e = 4 * i + 2 * r + c;
              float v = s0 * (acc[0][e] + acc[0][e + 8]) + s1 * (acc[1][e] + acc[1][e + 8]);
              if constexpr (C::kDsMla) v += acc_pe[e];
              red_s[(wg * 16 + 8 * i + 2 * qd + c) * C::kRedSStride + key] = v;
            }
        }
#else
        __trap();  // kQkWgmma kernels are launched on sm90 only
#endif
      } else {
        // ---- S partial = q'_g . k_g for keys 32 kh .. + 31 (four n-tiles).
        float part[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) part[nt][e] = 0.f;
        // Chunk swizzle of the keys this thread loads (all with key % 8 == qk_key(grp)); raw rows: none.
        const int fk = C::kRawRows ? 0 : key_swizzle(grp);
        const uint32_t qk_row = kbase + (32 * kh + qk_key<C>(grp)) * C::kKeyStride + C::kRowHalfShift * kh;
        auto load_qa = [&](int s, uint32_t (&a)[4]) {
          const uint4 v = e4m3::lds128(qfrag + s * kQFragStepBytes);
          a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;
        };
#pragma unroll
        for (int G = 0; G < 2; ++G) {
          uint4 raw[4];  // chunk 8 g + 4 G + qd of keys 32 kh + 8 nt + qk_key(grp)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            raw[nt] = e4m3::lds128(qk_row + nt * 8 * C::kKeyStride + ((8 * g + ((4 * G + qd) ^ fk)) << 4));
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            uint32_t qa[4];
            load_qa(4 * G + j, qa);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              const uint32_t w = j == 0 ? raw[nt].x : j == 1 ? raw[nt].y : j == 2 ? raw[nt].z : raw[nt].w;
              uint32_t b0, b1;
              e4m3::x4_to_f16x2x2(w, b0, b1);
              mma_16816<__half>(part[nt], qa, b0, b1);
            }
          }
        }
        {
          uint32_t qa[4];
          load_qa(C::kF16Steps, qa);
          if constexpr (C::kDsMla) {
            // Tile g's scale per key, then k_pe (bf16, dims 512 + 16 g + 4 qd ..) unscaled.
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {  // (C columns 2 qd, 2 qd + 1)
              const int key = 32 * kh + 8 * nt;
              const float s0 = scale_of(key + qk_key<C>(2 * qd), g), s1 = scale_of(key + qk_key<C>(2 * qd + 1), g);
              part[nt][0] *= s0, part[nt][1] *= s1, part[nt][2] *= s0, part[nt][3] *= s1;
            }
            const int chunk = C::kRopeChunk + 2 * g + qd / 2;
            uint32_t qa_lo[4];
            if constexpr (C::kPeLoTerm) load_qa(C::kF16Steps + 1, qa_lo);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              const uint2 w = e4m3::lds64(qk_row + nt * 8 * C::kKeyStride + ((chunk ^ fk) << 4) + 8 * (qd % 2));
              mma_16816<__nv_bfloat16>(part[nt], qa, w.x, w.y);
              if constexpr (C::kPeLoTerm) mma_16816<__nv_bfloat16>(part[nt], qa_lo, w.x, w.y);
            }
          } else {
            // k_pe in e4m3: dims 512 + 16 g + 4 qd .. = chunk 32 + g, bytes 4 qd ..
            const int chunk = kKvLoraRank / 16 + g;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              uint32_t b0, b1;
              e4m3::x4_to_f16x2x2(e4m3::lds32(qk_row + nt * 8 * C::kKeyStride + ((chunk ^ fk) << 4) + 4 * qd), b0, b1);
              mma_16816<__half>(part[nt], qa, b0, b1);
            }
          }
        }
        after_qk_issue();
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int col = 32 * kh + 8 * nt + 2 * qd;  // red_s columns: keys in qk_key order
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(red_s + (g * 16 + grp + 8 * h) * C::kRedSStride + col) =
                make_float2(part[nt][2 * h], part[nt][2 * h + 1]);
        }
      }
      team_sync();

      // ---- warp w: red_s columns 8 w + 2 qd, + 1 (keys ka, kb of the tile) of rows grp, grp + 8:
      // sum the groups, mask, scale.
      float sc[4];
      const int kcol = 8 * warp + 2 * qd;
      const int ka = 8 * warp + qk_key<C>(2 * qd), kb = 8 * warp + qk_key<C>(2 * qd + 1);
      const int pos_a = (tile_begin + i) * kBlockN + ka, pos_b = pos_a - ka + kb;
      const bool ok0 = stage_row_valid<C>(flags, ka), ok1 = stage_row_valid<C>(flags, kb);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float2 acc = make_float2(0.f, 0.f);
#pragma unroll
        for (int gg = 0; gg < C::kScoreGroups; ++gg) {
          const float2 v = *reinterpret_cast<const float2*>(red_s + (gg * 16 + grp + 8 * h) * C::kRedSStride + kcol);
          acc.x += v.x;
          acc.y += v.y;
        }
        const int lim = row_lim_s[grp + 8 * h];
        const float rs = row_scale_s[grp + 8 * h];
        sc[2 * h] = (ok0 && pos_a < lim) ? acc.x * rs : -INFINITY;
        sc[2 * h + 1] = (ok1 && pos_b < lim) ? acc.y * rs : -INFINITY;
        float mx = fmaxf(sc[2 * h], sc[2 * h + 1]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (qd == 0) red[(grp + 8 * h) * C::kTeamWarps + warp] = mx;
      }

      // ---- online softmax, speculatively with the running maximum m: P = 2^(s - m) (fp16) to
      // shared memory. That is the answer unless a key of the tile exceeds m by more than
      // kMaxSlack (the lazy maximum: m moves only then, so P <= 2^kMaxSlack; always so on a
      // piece's first tile, m = -inf). One flag per warp tells the team after the barrier that
      // P must be redone with the new maximum, which the row maxima in `red` already give.
      bool exceed = false;
      float pk[4];
      const int pcol0 = p_column<C>(ka), pcol1 = p_column<C>(kb);
      auto write_p = [&](int h, float p0, float p1) {
        if constexpr (kQkWgmma) {  // natural order, kb = ka + 1: one word
          *reinterpret_cast<__half2*>(p_tile + (grp + 8 * h) * C::kPStride + pcol0) = __floats2half2_rn(p0, p1);
        } else {
          p_tile[(grp + 8 * h) * C::kPStride + pcol0] = __float2half_rn(p0);
          p_tile[(grp + 8 * h) * C::kPStride + pcol1] = __float2half_rn(p1);
        }
      };
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float base = m[h] == -INFINITY ? 0.f : m[h];
        pk[2 * h] = sm80::fast_exp2(sc[2 * h] - base), pk[2 * h + 1] = sm80::fast_exp2(sc[2 * h + 1] - base);
        // (sc - m, not sc > m + slack: the difference is what P = 2^(sc - m) sees, so P <= 2^slack
        // holds exactly even where m + slack rounds; m = -inf gives +inf: exceed.)
        exceed |= fmaxf(sc[2 * h], sc[2 * h + 1]) - m[h] > C::kMaxSlack;
        write_p(h, pk[2 * h], pk[2 * h + 1]);
      }
      const bool warp_exceeds = __any_sync(0xffffffffu, exceed);
      if (lane == 0) exceed_s[warp] = warp_exceeds;
      if constexpr (C::kPvScaleTile) {  // warps 2 vt, 2 vt + 1: keys 32 (warp % 2) + lane of tile vt
        const int k = 32 * (warp % 2) + lane;
        pv_scale_s[vt * kBlockN + p_column<C>(k)] = __float2half_rn(scale_of(k, vt) * v_inv);
      }
      team_sync();

      float rescale[2] = {v_rescale, v_rescale};  // o *= exp2(m_old - m) * R_old / R
      const uint2 any_exceed = *reinterpret_cast<const uint2*>(exceed_s);  // the 8 warps' flags
      if ((any_exceed.x | any_exceed.y) != 0) {  // the same branch for the whole team
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = grp + 8 * h;
          const float4 mx0 = *reinterpret_cast<const float4*>(red + r * C::kTeamWarps);
          const float4 mx1 = *reinterpret_cast<const float4*>(red + r * C::kTeamWarps + 4);
          const float tile_max = fmaxf(fmaxf(fmaxf(mx0.x, mx0.y), fmaxf(mx0.z, mx0.w)), fmaxf(fmaxf(mx1.x, mx1.y), fmaxf(mx1.z, mx1.w)));
          const float m_new = tile_max - m[h] > C::kMaxSlack ? tile_max : m[h];
          const float base = m_new == -INFINITY ? 0.f : m_new;
          const float alpha = m_new == m[h] ? 1.f : sm80::fast_exp2(m[h] - base);  // exactly 1: skips the rescale
          pk[2 * h] = sm80::fast_exp2(sc[2 * h] - base), pk[2 * h + 1] = sm80::fast_exp2(sc[2 * h + 1] - base);
          l[h] = l[h] * alpha + pk[2 * h] + pk[2 * h + 1];
          m[h] = m_new;
          write_p(h, pk[2 * h], pk[2 * h + 1]);
          rescale[h] *= alpha;
        }
        team_sync();  // the redone P
      } else {
        l[0] += pk[0] + pk[1];
        l[1] += pk[2] + pk[3];
      }
      // Most tiles change neither the row maxima nor R: skip the 32 multiplies then.
      if (!__all_sync(0xffffffffu, rescale[0] == 1.f && rescale[1] == 1.f)) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int S = 0; S < 2; ++S)
#pragma unroll
            for (int j = 0; j < 4; ++j) o[S][j][2 * h] *= rescale[h], o[S][j][2 * h + 1] *= rescale[h];
      }

      // ---- O[:, 64 warp ..] += P' V8.
      // Keys 16 ks + pv_key(qd, e) (pv_key(qd, e + 2) = pv_key(qd, e) + 8): the offset of e % 2
      // here, 8 (e / 2) keys added per load.
      const int pv_chunk = 4 * warp + grp / 2;
      // (half shift: pv_tile_key(ks, qd, e) = pv_tile_key(0, qd, 0) + 8 ks + 2 e, in the same half: pv_off[0] only)
      const uint32_t pv_off[2] = {key_chunk_offset<C>(C::kRowHalfShift != 0 ? pv_tile_key(0, qd, 0) : pv_key<C::kNaturalPv>(qd, 0),
                                                      pv_chunk) + 8 * (grp % 2),
                                  key_chunk_offset<C>(pv_key<C::kNaturalPv>(qd, 1), pv_chunk) + 8 * (grp % 2)};
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        // A fragment: P of keys 16 ks + pv_key(qd, 0 | 1) and (2 | 3), rows grp and grp + 8, times
        // scale[key, vt] / R for fp8_ds_mla.
        uint32_t pa[4];
        e4m3::load_pv_a<C::kPStride>(p_tile, ks, lane, pa);
        if constexpr (C::kPvScaleTile) {  // the words of P's A fragment, from the tile's fp16 scales
          const __half* ps = pv_scale_s + vt * kBlockN + 16 * ks + 2 * qd;
          const __half2 v01 = *reinterpret_cast<const __half2*>(ps), v23 = *reinterpret_cast<const __half2*>(ps + 8);
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            pa[rr] = e4m3::hmul2_bits(pa[rr], v01);
            pa[2 + rr] = e4m3::hmul2_bits(pa[2 + rr], v23);
          }
        } else if constexpr (C::kDsMla) {  // (fp16 q, mma.sync: no room for the scale tile)
          auto s_of = [&](int e) { return scale_of(16 * ks + pv_key<C::kNaturalPv>(qd, e), vt) * v_inv; };
          const __half2 v01 = __floats2half2_rn(s_of(0), s_of(1));
          const __half2 v23 = __floats2half2_rn(s_of(2), s_of(3));
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            pa[rr] = e4m3::hmul2_bits(pa[rr], v01);
            pa[2 + rr] = e4m3::hmul2_bits(pa[2 + rr], v23);
          }
        }
        uint2 wk[4];  // dims 64 warp + 8 grp .. + 7 of keys 16 ks + pv_key(qd, e) (half shift: pv_tile_key(ks, qd, e))
#pragma unroll
        for (int e = 0; e < 4; ++e)
          wk[e] = C::kRowHalfShift != 0 ? e4m3::lds64(kbase + (8 * ks + 2 * e) * C::kKeyStride + pv_off[0])
                                        : e4m3::lds64(kbase + (16 * ks + 8 * (e / 2)) * C::kKeyStride + pv_off[e % 2]);
#pragma unroll
        for (int S = 0; S < 2; ++S) {
          const uint32_t w[4] = {S ? wk[0].y : wk[0].x, S ? wk[1].y : wk[1].x, S ? wk[2].y : wk[2].x, S ? wk[3].y : wk[3].x};
          uint32_t b0[4], b1[4];
          e4m3::regroup_pv_b(w, b0, b1);
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_16816<__half>(o[S][j], pa, b0[j], b1[j]);
        }
      }
    }
    sm80::cp_async_wait<0>();

    // ---- end of the piece: row sums per team, team 1 hands (m, l, R, o) to team 0.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float s = l[h];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (qd == 0) red[(grp + 8 * h) * C::kTeamWarps + warp] = s;
    }
    __syncthreads();  // both teams: tiles done, red written, team 1's stages idle
    float total[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      total[h] = 0.f;
#pragma unroll
      for (int w = 0; w < C::kTeamWarps; ++w) total[h] += red[(grp + 8 * h) * C::kTeamWarps + w];
    }
    float* const xm = xchg + 32 * C::kTeamThreads;
    float* const xl = xm + C::kRows;
    float* const xr = xl + C::kRows;
    if (team == 1) {
#pragma unroll
      for (int S = 0; S < 2; ++S)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) xchg[(16 * S + 4 * j + e) * C::kTeamThreads + ttid] = o[S][j][e];
      if (warp == 0 && qd == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) xm[grp + 8 * h] = m[h], xl[grp + 8 * h] = total[h];
      }
      if (lane == 0) xr[warp] = v_ref;
#if MLA_DECODE_BULK
      // (team 1's stages: these stores come before the next piece's bulk copies into them)
      if constexpr (C::kBulkRows) fence_proxy_async_smem();
#endif
    }
    __syncthreads();
    if (team == 0) {  // also for pieces without tiles: out 0, lse -inf
      const float r1 = C::kDsMla ? xr[warp] : 1.f, r0 = C::kDsMla ? v_ref : 1.f;
      const int num_splits = p.split_info[req * kSplitInfoFields + 0];
      const int64_t slot = partial_slot(p, part, req, num_splits);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = grp + 8 * h;
        const float m1 = xm[r], l1 = xl[r];
        const float mm = fmaxf(m[h], m1);
        const float base = mm == -INFINITY ? 0.f : mm;
        const float a0 = sm80::fast_exp2(m[h] - base), a1 = sm80::fast_exp2(m1 - base);
        const float tot = a0 * total[h] + a1 * l1;
        // tot == 0: nothing attended (out 0, lse -inf); NaN propagates.
        const float inv = tot == 0.f ? 0.f : tensor_scale / tot;
        const float c0 = a0 * r0 * inv, c1 = a1 * r1 * inv;
        if (r >= rows_here || slot < 0 || slot >= p.max_partials) continue;  // (a hand-made plan's bad slot)
        const float lse2 = tot == 0.f ? -INFINITY : mm + log2f(tot);
        const int gr = row0 + r, s = gr / p.h_q, hq = gr % p.h_q;
        float v[16];  // dims 64 warp + 16 qd + 0..15
#pragma unroll
        for (int S = 0; S < 2; ++S)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              const int e = 2 * h + k;
              v[8 * k + 4 * S + j] = o[S][j][e] * c0 + xchg[(16 * S + 4 * j + e) * C::kTeamThreads + ttid] * c1;
            }
        const int d0 = 64 * warp + 16 * qd;
        if (num_splits <= 1) {
          T* d = static_cast<T*>(p.out) + req * p.stride_out_b + s * p.stride_out_s + hq * p.stride_out_h + d0;
#pragma unroll
          for (int k = 0; k < 8; ++k) *reinterpret_cast<uint32_t*>(d + 2 * k) = pack2<T>(v[2 * k], v[2 * k + 1]);
        } else {
          float4* d = reinterpret_cast<float4*>(p.partial_o + (slot * p.num_rows + gr) * kKvLoraRank + d0);
#pragma unroll
          for (int k = 0; k < 4; ++k) d[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
        }
        if (warp == 0 && qd == 0) {
          if (num_splits <= 1) p.lse[req * p.stride_lse_b + hq * p.stride_lse_h + s * p.stride_lse_s] = lse2 * kLn2;
          else p.partial_lse[slot * p.num_rows + gr] = lse2;
        }
      }
    }
    __syncthreads();  // the next piece reuses every shared buffer
  }
}

// kQkWgmma: the sm90a kernel (QK^T on wgmma), launched only on sm90 devices (decode/dispatch.cu).
template <typename T, CacheFormat kFormat, int kRowThreads, bool kQkWgmma, int kTma, bool kRawRows>
void launch_decode_split_fp8(const DecodeParams& p) {
  using C = Fp8SplitConfig<T, kFormat, kRowThreads, kQkWgmma, kTma, kRawRows>;
  launch_split_kernel(&decode_split_fp8_kernel<T, kFormat, kRowThreads, kQkWgmma, kTma, kRawRows>, C::kThreads,
                      C::kSmemLaunchBytes, kQkWgmma ? "sm90 fp8 decode kernel" : "fp8 16-row decode kernel", p);
}

}  // namespace mla::decode::fp8_16rows
