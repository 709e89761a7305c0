// Sparse top-k MLA decode, portable path (mma.sync + cp.async; sm90, sm100). One template variant,
// kBulkRows (rows by bulk copies), is instantiated for the sm90 path only (sm90/).
//
// One CTA = one query token (b, s), one tile of kM heads, one split of the top-k list.
// grid = (ceil(h_q / kM), 1, sparse_grid_z(p): b * s_q and the CTAs of split lists); 256 threads =
// 8 warps (+ 4 copy warps in the sm90 16-head kernel: PortableConfig::kCopyWarps).
// See csrc/sparse/README.md for the warp roles and the bytes each tile reads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "common/arch.h"
#include "common/attn_sink.cuh"
#include "common/cuda_check.h"
#include "common/e4m3.cuh"
#include "common/mbarrier.cuh"  // kBulkRows, copy warps
#include "common/pdl.cuh"
#include "common/sm80.cuh"
#include "common/target.h"     // MLA_SM90A
#include "common/types.h"
#include "sparse/sparse_decode.h"

namespace mla::sparse {

template <int kM_, CacheFormat kFormat_, int kStages_, bool kE4m3Frags_ = false, int kRowThreads_ = 8, bool kBulkRows_ = false,
          int kCopyWarps_ = 0, bool kPvRaw_ = false>
struct PortableConfig {
  static constexpr int kM = kM_;                     // query heads per CTA: 16, 32 or 64
  static constexpr CacheFormat kFormat = kFormat_;
  static constexpr bool kDsMla = kFormat == CacheFormat::kFp8DsMla;
  static_assert(kM == 16 || kM == 32 || kM == 64, "head tile must be 16, 32 or 64 rows");
  static_assert(kFormat == CacheFormat::kAuto || kDsMla, "sparse decode reads auto (bf16) or fp8_ds_mla caches");

  static constexpr int kWarps = 8;
  // Row gather: kRowThreads threads per row, each copying every kRowThreads-th 16-byte chunk, so
  // one warp-wide copy covers 32 / kRowThreads rows x 16 kRowThreads contiguous bytes (fewer
  // cache lines per copy instruction with more threads per row); every thread handles
  // kRowThreads / 4 rows of a 64-key tile (one slot and one division each).
  static constexpr int kRowThreads = kRowThreads_;
  static_assert(kRowThreads == 4 || kRowThreads == 8 || kRowThreads == 16, "4, 8 or 16 threads per gathered row");
  static constexpr int kThreads = 32 * kWarps;  // the compute threads (barrier counts, loaders)
  static constexpr int kN = 64;                      // keys (gathered rows) per tile
  // QK^T: warp (row_group, col_group) computes rows [16 row_group, +16) of the head tile for the
  // col_group-th slice of the tile's keys; the softmax keeps that layout (2 rows per thread).
  static constexpr int kRowGroups = kM / 16;
  static constexpr int kColGroups = kWarps / kRowGroups;  // 8, 4, 2
  static constexpr int kKeysPerWarp = kN / kColGroups;    // 8, 16, 32
  static constexpr int kSTiles = kKeysPerWarp / 8;        // n8 tiles of S per warp
  // QK^T runs 4 / kSTiles independent accumulator chains, so that a warp's MMAs do not wait on
  // each other's latency.
  static constexpr int kChains = 4 / kSTiles;
  // 16-head tiles split QK^T over the dims instead (like the dense fp8 decode): warp (g, kh) =
  // (w % 4, w / 4) takes dim group g (fp8_ds_mla: scale tile g + 16 k_pe dims; bf16: 144 dims)
  // for keys 32 kh .. + 31, with its 9 Q fragments held in registers for the whole CTA; the
  // four partial sums meet in shared memory. Each K fragment is read once instead of 8 times
  // per key with one n8 tile per warp.
  static constexpr bool kSplitDimsQK = kM == 16;
  // fp8_ds_mla, 16 heads: no K tile. The warps read their MMA fragments straight from the e4m3
  // staging rows and convert them in registers (each byte once per CTA: the split-dims QK^T and
  // the all-rows PV give every (key, dim) to exactly one warp), with permuted k indices so that B
  // fragments come from 16-byte (QK^T) or 32-bit (PV) loads (csrc/decode/README.md, "fp8 caches
  // with 16 query rows"). Without the 72 KB K tile and the dequantisation pass (all threads, two
  // barriers per tile), four staging buffers fit: the main loop pipelines PV(t) with QK^T(t + 1).
  static constexpr bool kE4m3Frags = kE4m3Frags_;
  static_assert(!kE4m3Frags || (kDsMla && kM == 16), "e4m3 fragments: fp8_ds_mla with 16-head tiles");
  // Hopper (sm_90a code only; the sparse decode's sm90 path): the e4m3-fragment kernel gathers each
  // 656-byte row with one cp.async.bulk (issued by the copy warps below; an mbarrier per staging
  // buffer counts the 64 rows and their bytes) instead of 41 16-byte
  // cp.async spread over kRowThreads threads: the rows' copies leave the load/store queue that the
  // fragment loads wait in, and a row that straddles cache lines costs the TMA engine no extra
  // instructions.
  static constexpr bool kBulkRows = kBulkRows_;
  // Who issues the bulk copies: kCopyWarps extra warps after the compute warps (kN / kCopyWarps
  // rows each, one per lane). A warp issues its copies one after the other (the copy takes
  // uniform-register operands: the compiler loops over the lanes, ~90 cycles per row on the H200),
  // so issued by the compute warps the copies held back each tile's MMAs by ~700 cycles; the copy
  // warps take them off that path (csrc/sparse/README.md).
  // Without bulk rows (kCpAsyncCopyWarps, sm80+): the copy warps gather with 16-byte cp.async,
  // kRowThreads threads per row, and each copy thread's cp.async.mbarrier.arrive counts on the
  // staging buffer's mbarrier (kCopyThreads arrivals per fill), so the compute warps never issue a
  // gather nor wait for one they issued.
  static constexpr int kCopyWarps = kCopyWarps_;
  static_assert(!kBulkRows || (kE4m3Frags && kCopyWarps > 0), "bulk row copies: the e4m3-fragment kernel's copy warps");
  static constexpr bool kCpAsyncCopyWarps = kCopyWarps > 0 && !kBulkRows;
  static constexpr int kCopyThreads = 32 * kCopyWarps;
  // (kCopyWarps + (kCopyWarps == 0): no modulo by zero when the assert's first term already holds.)
  static_assert(kCopyWarps == 0 || (kE4m3Frags && kN % (kCopyWarps + (kCopyWarps == 0)) == 0 && kN <= 32 * kCopyWarps),
                "copy warps: the e4m3-fragment kernel, the tile's rows spread evenly, at most one bulk row per lane");
  static_assert(!kCpAsyncCopyWarps || (kCopyThreads % kRowThreads == 0 && kN % (kCopyThreads / kRowThreads) == 0),
                "cp.async copy warps: whole rows per pass");
  static constexpr int kLaunchThreads = kThreads + 32 * kCopyWarps;
  // fp8_ds_mla, 64-head tiles, two staging buffers: PV reads V straight from the staging rows of
  // tile t (e4m3 converted in registers, as the 16-head kernel does, each byte once per CTA since
  // every warp owns 64 output columns), so the fp16 K tile is free once QK^T(t) is done and the
  // dequantisation of tile t + 1 into it runs interleaved with PV(t) instead of alone between two
  // barriers. The K tile holds kv_c only (QK^T reads k_pe, bf16 already, from the staging rows),
  // which with the scales read from the staging rows too is what makes the second staging buffer
  // fit next to Q (232320 of 232448 bytes).
  static constexpr bool kPvRaw = kPvRaw_;
  static_assert(!kPvRaw || (kDsMla && !kE4m3Frags && kM == 64 && kStages_ == 2 && !kBulkRows),
                "V from the staging rows: fp8_ds_mla, 64-head tiles, two staging buffers");
  // PV: every warp takes all kM rows and 64 output columns (warp w: 64 w .. + 63), so each V
  // fragment is read once per CTA and reused for the kM / 16 m-tiles (O: 2 kM fp32 per thread).
  static constexpr int kPvMTiles = kM / 16;
  static constexpr int kOTiles = 8;                       // n8 tiles of the 64 columns
  // 16-bit type of the MMA operands: bf16 rows, or fp16 for fp8_ds_mla (e4m3 is exact in fp16 and
  // the tile scales stay out of the operands; k_pe is bf16 in both formats).
  using KvT = std::conditional_t<kDsMla, __half, __nv_bfloat16>;

  // bf16 rows of 576 = 72 chunks of 16 bytes. Rows are 1152 bytes (a multiple of 128), so
  // chunk c of row r is stored at c ^ (r % 8): the 8 rows one ldmatrix reads hit 8 different
  // bank groups. 72 = 9 * 8, so the XOR stays inside the row.
  static constexpr int kChunks = kLatentDim / 8;
  static constexpr int kRawChunks = kDsMlaRowBytes / 16;  // 41 (fp8_ds_mla rows are 16-byte multiples)
  static constexpr int kKChunks = kPvRaw ? kKvLoraRank / 8 : kChunks;  // 16-byte chunks per K tile row
  // kPvRaw, lazy running maximum: a row's max moves only when a tile's max exceeds it by more than
  // kMaxSlack (log2 units), so that once the maxima settle PV skips the O rescale (128 FMULs per
  // thread and tile with 64 rows, where some row's max moved on 96% of the tiles of the benchmark;
  // 37% with a slack of 4). P <= 2^8 then, and R's room shrinks from 2^14 to 2^7 so that
  // P' = P scale / R <= 2^15 stays inside fp16.
  static constexpr float kMaxSlack = kPvRaw ? 8.f : 0.f;
  static constexpr int kScaleFitLog2 = kPvRaw ? 7 : 14;
  // Tiles in flight: bf16 K buffers (the rows land in the K tile itself), or fp8_ds_mla staging
  // buffers (dequantised into one bf16 K tile). More stages keep more gathered bytes in flight,
  // which is what the memory-bound small head tiles need.
  static constexpr int kStages = kStages_;
  static_assert(kStages >= 1 && kStages <= (kE4m3Frags ? 4 : 3) && (kDsMla || kStages <= 2));
  static constexpr int kKBuffers = kE4m3Frags ? 0 : (kDsMla ? 1 : kStages);
  // Key-validity slots: bf16 alternates two tiles; fp8_ds_mla has one per staging buffer plus
  // the copy that belongs to the K tile being computed (kPvRaw: QK^T and PV read the staging
  // buffer's own).
  static constexpr int kValidSlots = kPvRaw ? kStages : kDsMla ? kStages + 1 : 2;
  using ValidT = std::conditional_t<kPvRaw, uint8_t, int>;  // (bytes where shared memory is short)

  // Shared-memory plan (bytes).
  static constexpr int kQBytes = kM * kChunks * 16;
  static constexpr int kKTileBytes = kN * kKChunks * 16;
  static constexpr int kRawTileBytes = kN * kDsMlaRowBytes;
  static constexpr int kRawBytes = kDsMla ? kStages * kRawTileBytes : 0;  // fp8_ds_mla staging
  // P (16-bit): swizzled [kM][64] for ldmatrix; e4m3 fragments: [16][72] with key k at
  // 8 (k / 8) + 2 (k % 4) + (k % 8) / 4, so the PV A fragment's key pair (k, k + 4) is one word.
  static constexpr int kPStride = kN + 8;                            // halves (e4m3 fragments)
  static constexpr int kPBytes = kE4m3Frags ? kM * kPStride * 2 : kM * kN * 2;
  static constexpr int kRedBytes = kColGroups * kM * 4;              // per-warp row max / row sum
  static constexpr int kValidBytes = kValidSlots * kN * int(sizeof(ValidT));  // per-key validity
  // fp8_ds_mla: the K tile's 4 fp32 scales per key (e4m3 fragments, kPvRaw: read from the staging rows)
  static constexpr int kKScaleBytes = kDsMla && !kE4m3Frags && !kPvRaw ? kN * 16 : 0;
  // fp8_ds_mla: q row exponents (int; kPvRaw: in the P buffer, read before the first P is written)
  static constexpr int kRowExpBytes = kDsMla && !kPvRaw ? kM * 4 : 0;
  // per row: O rescale factor, final max (kPvRaw: the final max in the K tile, dead after the loop)
  static constexpr int kRowStateBytes = (kPvRaw ? 1 : 2) * kM * 4;
  static constexpr int kRedSStride = kN + 8;                         // floats: conflict-free float2 rows
  static constexpr int kRedSBytes = kSplitDimsQK ? 4 * 16 * kRedSStride * 4 : 0;  // partial S per dim group
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffRaw = kOffK + kKBuffers * kKTileBytes;
  static constexpr int kOffP = kOffRaw + kRawBytes;
  static constexpr int kOffRed = kOffP + kPBytes;
  static constexpr int kOffValid = kOffRed + kRedBytes;
  static constexpr int kOffKScale = kOffValid + kValidBytes;
  static constexpr int kOffRowExp = kOffKScale + kKScaleBytes;
  static constexpr int kOffRowState = kOffRowExp + kRowExpBytes;
  static constexpr int kOffRedS = kOffRowState + kRowStateBytes;
  static constexpr int kOffBars = kOffRedS + kRedSBytes;             // kBulkRows, copy warps: an mbarrier per staging buffer
  static constexpr int kSmemBytes = kOffBars + (kBulkRows || kCopyWarps > 0 ? kStages * 8 : 0);
  static_assert(kOffRaw % 16 == 0 && kOffP % 16 == 0 && kOffRed % 16 == 0 && kOffKScale % 16 == 0 && kOffRedS % 16 == 0);
};

// Byte offset of 16-byte chunk c of row r in a swizzled tile with kRowChunks chunks per row.
template <int kRowChunks>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>((r * kRowChunks + (c ^ (r & 7))) * 16);
}

// The kPvRaw K tile (kv_c only: 64 chunks per row): chunk c of row r at c ^ (r % 8) ^ ((c / 8) % 2).
// The extra bit lets the dequantisation store chunks 2 c', 2 c' + 1 in the same order in every lane:
// the 8 lanes of a store phase (chunks 16 i .. 16 i + 15) hit 8 different bank groups, where with
// swz() alone lanes c' and c' + 4 collide (which dequant_ds_mla_kv_c avoids otherwise by swapping
// the store order in half of the lanes: 8 SEL per row). An ldmatrix reads one chunk of 8
// consecutive rows: 8 bank groups either way.
__device__ __forceinline__ uint32_t swz_k64(int r, int c) {
  return static_cast<uint32_t>((r * 64 + (c ^ (r & 7) ^ ((c >> 3) & 1))) * 16);
}

using sm80::fast_exp2;  // results below 2^-126 flush to 0: the fp16/bf16 P could not hold them apart from 0

// ---- pieces shared with the sm90 kernel (sm90/sparse_decode_sm90_fp8.cu) ----------------------

// A CTA's work (grid = (head tiles, 1, sparse_grid_z(p))): query token (b, s) = bs, split `split`,
// the tile_keys-key tiles [tile_begin, tile_begin + num_tiles) of its top-k list idx_row. Entries
// past topk_length are invalid, so whole tiles past it are skipped. z < split_from: token z, its
// whole list (out and lse written here); from split_from on, num_splits CTAs per token, each
// writing partial rows partial_row0 + h for the combine.
// This CTA's query token and split (grid z, sparse_grid_z): shared by every sparse kernel, the
// DeepSeek-V4 fused one included.
struct CtaToken {
  int bs, b, s, split;
  bool whole;
  int64_t partial_row0;
};
__device__ __forceinline__ CtaToken cta_token(const SparseDecodeParams& p) {
  CtaToken w;
  const int z = blockIdx.z;
  w.whole = p.num_splits == 1 || z < p.split_from;
  if (w.whole) {
    w.bs = z, w.split = 0, w.partial_row0 = 0;
  } else {
    const int t = z - p.split_from;
    w.bs = p.split_from + t / p.num_splits, w.split = t % p.num_splits;
    w.partial_row0 = (int64_t(w.split) * (p.batch * p.s_q - p.split_from) + (w.bs - p.split_from)) * p.h_q;
  }
  w.b = w.bs / p.s_q, w.s = w.bs % p.s_q;
  return w;
}
struct CtaWork : CtaToken {
  int num_keys, tile_begin, num_tiles;
  const int32_t* idx_row;
};
__device__ __forceinline__ CtaWork cta_work(const SparseDecodeParams& p, int tile_keys) {
  CtaWork w;
  static_cast<CtaToken&>(w) = cta_token(p);
  w.num_keys = p.topk;
  if (p.topk_length != nullptr) w.num_keys = min(w.num_keys, max(p.topk_length[w.b], 0));
  const int total_tiles = (w.num_keys + tile_keys - 1) / tile_keys;
  w.tile_begin = w.whole ? 0 : w.split * p.tiles_per_split;
  w.num_tiles = w.whole ? total_tiles : max(0, min(total_tiles, w.tile_begin + p.tiles_per_split) - w.tile_begin);
  w.idx_row = p.indices + w.b * p.stride_indices_b + w.s * p.stride_indices_s;
  return w;
}

// The slot of top-k entry `key` (-1 past num_keys), read through the non-coherent path by
// volatile asm: callers issue it after the current tile's copies, into the register the next
// tile's copies use, so that it never stalls the copy issue (csrc/sparse/README.md).
__device__ __forceinline__ int32_t fetch_slot_ahead(const int32_t* idx_row, int key, int num_keys) {
  int32_t v = -1;
  if (key < num_keys) asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(idx_row + key));
  return v;
}

// Q tile of kM heads x kChunks 16-byte chunks (V3: 72, DeepSeek-V4: 64) by cp.async (all kThreads
// threads); heads past h_q are zero-filled, never read. addr(r, c) = byte offset of chunk c of head
// row r in s_q.
template <int kM, int kThreads, int kChunks = kLatentDim / 8, typename Addr>
__device__ __forceinline__ void load_q_tile(const SparseDecodeParams& p, int b, int s, int h0, int tid, uint8_t* s_q, Addr addr) {
  const auto* q = static_cast<const __nv_bfloat16*>(p.q) + b * p.stride_q_b + s * p.stride_q_s;
  for (int i = tid; i < kM * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = h0 + r < p.h_q;
    const void* src = ok ? static_cast<const void*>(q + (h0 + r) * p.stride_q_h + 8 * c) : p.q;
    sm80::cp_async16(sm80::smem_addr(s_q + addr(r, c)), src, ok);
  }
}

// Slots are int32 (the cache strides stay 64-bit): block_size clamped to 2^31 gives the same
// quotients and remainders as the int64 value.
__device__ __forceinline__ uint32_t block_size_u32(const SparseDecodeParams& p) {
  return p.block_size < (int64_t(1) << 31) ? static_cast<uint32_t>(p.block_size) : 0x80000000u;
}
// Global address of cache row `slot`; an invalid slot (ok false) gives the cache base, which the
// copies then read with src-size 0. The page is slot / block_size by multiply-shift (p.block_div;
// the integer division was ~20 instructions per row, a tenth of the row gather's); with a
// block_size of 2^31 or more every int32 slot is in page 0.
__device__ __forceinline__ const uint8_t* slot_row(const SparseDecodeParams& p, const uint8_t* cache, int32_t slot, bool ok,
                                                   uint32_t block_size32) {
  const uint32_t blk = ok && p.block_size <= INT32_MAX ? static_cast<uint32_t>(p.block_div.div(slot)) : 0u;
  const uint32_t tok = ok ? static_cast<uint32_t>(slot) - blk * block_size32 : 0u;
  return ok ? cache + int64_t(blk) * p.stride_cache_block_bytes + int64_t(tok) * p.stride_cache_token_bytes : cache;
}

// A row of zeros in global memory: invalid rows are bulk-copied from it (their P is 0, but 0 x NaN
// would not be), so that every write into a staging buffer goes through the async proxy and its
// readers need only the buffer's mbarrier (read after write). The earlier generic reads of the
// buffer (write after read) are ordered by the barrier that releases it (as CUTLASS's TMA pipelines
// rely on their consumer-release barrier), plus a proxy fence where the issuing thread is one of
// the readers.
static __device__ __align__(128) const uint8_t kZeroDsMlaRow[kDsMlaRowBytes] = {};

// sm90 bulk row gathers of the 16-head e4m3-fragment kernel (from its copy warps or its compute
// warps): the 656-byte fp8_ds_mla row of `slot` (or, invalid, the zero row) into dst_row by one
// cp.async.bulk completing on mbarrier `bar`; each row's thread arrives once per fill.
__device__ __forceinline__ void bulk_ds_mla_row_or_zero_row(const SparseDecodeParams& p, const uint8_t* cache, int32_t slot,
                                                            bool ok, uint32_t block_size32, uint8_t* dst_row, uint32_t bar) {
  mbar_arrive_expect_tx(bar, kDsMlaRowBytes);
  bulk_load(sm80::smem_addr(dst_row), ok ? slot_row(p, cache, slot, true, block_size32) : kZeroDsMlaRow, kDsMlaRowBytes, bar);
}

// fp8_ds_mla: thread `part` of a row's kRowT threads copies 16-byte chunks part, part + kRowT, ...
// of the 656-byte row into dst_row (zero-filled when !ok).
template <int kRowT>
__device__ __forceinline__ void copy_ds_mla_row_part(uint8_t* dst_row, const uint8_t* row, int part, bool ok) {
  constexpr int kRawChunks = kDsMlaRowBytes / 16;
#pragma unroll
  for (int j = 0; j < (kRawChunks + kRowT - 1) / kRowT; ++j) {
    const int c = part + kRowT * j;
    if (c < kRawChunks) sm80::cp_async16(sm80::smem_addr(dst_row + 16 * c), row + 16 * c, ok);
  }
}

// fp8_ds_mla staging rows -> K tile, kv_c part: lane c converts 16-byte chunk c (e4m3 -> fp16, exact,
// one cvt per two values, no scale) of the kRows rows warp + kWarps j, j = j0 .. j0 + kRows - 1, all
// loaded before any is converted so that the shared loads overlap. addr(r, c) = byte offset of
// 16-byte chunk c (8 dims) of key row r in s_k; kSameOrder: every lane stores its chunk 2c first
// (addr must then spread them over the bank groups itself, as swz_k64 does).
template <int kRows, int kWarps, bool kSameOrder = false, typename Addr>
__device__ __forceinline__ void dequant_ds_mla_kv_c(const uint8_t* s_stage, uint8_t* s_k, int warp, int lane, int j0, Addr addr) {
  const int c = lane;
  uint4 v[kRows];
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    v[j] = *reinterpret_cast<const uint4*>(s_stage + (warp + kWarps * (j0 + j)) * kDsMlaRowBytes + 16 * c);
  }
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    const int r = warp + kWarps * (j0 + j);
    uint32_t h[8];
    e4m3::x4_to_f16x2x2(v[j].x, h[0], h[1]);
    e4m3::x4_to_f16x2x2(v[j].y, h[2], h[3]);
    e4m3::x4_to_f16x2x2(v[j].z, h[4], h[5]);
    e4m3::x4_to_f16x2x2(v[j].w, h[6], h[7]);
    // Output chunks 2c, 2c + 1; lanes c / 4 odd store the odd one first (unless kSameOrder), so that
    // the 8 lanes of each store phase hit 8 different 16-byte bank groups.
    const int first = kSameOrder ? 0 : (c >> 2) & 1;
    const uint4 lo = make_uint4(h[0], h[1], h[2], h[3]), hi = make_uint4(h[4], h[5], h[6], h[7]);
    *reinterpret_cast<uint4*>(s_k + addr(r, 2 * c + first)) = first ? hi : lo;
    *reinterpret_cast<uint4*>(s_k + addr(r, 2 * c + 1 - first)) = first ? lo : hi;
  }
}

// fp8_ds_mla staging rows (kN x 656 bytes) -> K tile: kv_c converted (dequant_ds_mla_kv_c, 4 rows
// at a time), k_pe copied (bf16); the caller stores the scales. Fixed work per thread, no
// branches: each thread copies 2 of the kN x 8 k_pe chunks. addr(r, c) = byte offset of 16-byte
// chunk c (8 dims, 0..71) of key row r in s_k.
template <int kN, int kWarps, int kThreads, typename Addr>
__device__ __forceinline__ void dequant_ds_mla_rows(const uint8_t* s_stage, uint8_t* s_k, int warp, int lane, int tid, Addr addr) {
#pragma unroll
  for (int j0 = 0; j0 < kN / kWarps; j0 += 4) dequant_ds_mla_kv_c<4, kWarps>(s_stage, s_k, warp, lane, j0, addr);
  static_assert(kN * 8 == 2 * kThreads, "k_pe: two chunks per thread");
  uint4 pe[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int i = tid + kThreads * j;
    pe[j] = *reinterpret_cast<const uint4*>(s_stage + (i / 8) * kDsMlaRowBytes + kDsMlaRopeOffset + 16 * (i % 8));
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int i = tid + kThreads * j;
    *reinterpret_cast<uint4*>(s_k + addr(i / 8, kKvLoraRank / 8 + i % 8)) = pe[j];
  }
}

// fp8_ds_mla: q rows in place to q' = q 2^-e_r, fp16 for kv_c (the e4m3 operand type) and bf16
// for q_pe; e_r puts max |q_r| in [2^14, 2^15), so q' equals q but for values 2^-28 below the
// row's largest (fp16 subnormals). 2^e_r goes into the row's softmax scale (s_row_exp[r] = e_r).
// Warp w takes rows w, w + kWarps, ...: the row's lanes find its exponent and convert it, no
// barrier in between. addr(r, c) = byte offset of 16-byte chunk c (0..71) of row r in s_q (the
// portable and the sm90 kernels lay Q out differently).
template <int kM, int kWarps, typename Addr>
__device__ __forceinline__ void normalise_q_rows(uint8_t* s_q, int* s_row_exp, int warp, int lane, Addr addr) {
  constexpr int kChunks = kLatentDim / 8;
  for (int r = warp; r < kM; r += kWarps) {
    uint4 v[3];
    float mx = 0.f;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      const int c = lane + 32 * j;
      if (c < kChunks) {
        v[j] = *reinterpret_cast<const uint4*>(s_q + addr(r, c));
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
        *reinterpret_cast<uint4*>(s_q + addr(r, c)) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    if (lane == 0) s_row_exp[r] = e;
  }
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kLaunchThreads, 1)
    sparse_decode_portable_kernel(const __grid_constant__ SparseDecodeParams p) {
  constexpr int kM = Cfg::kM, kN = Cfg::kN, kChunks = Cfg::kChunks;
  using KvT = typename Cfg::KvT;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* s_q = smem + Cfg::kOffQ;
  uint8_t* s_k = smem + Cfg::kOffK;
  uint8_t* s_raw = smem + Cfg::kOffRaw;
  uint8_t* s_p = smem + Cfg::kOffP;
  float* s_red = reinterpret_cast<float*>(smem + Cfg::kOffRed);         // [kColGroups][kM]
  auto* s_valid = reinterpret_cast<typename Cfg::ValidT*>(smem + Cfg::kOffValid);  // [kValidSlots][kN]
  float* s_kscale = reinterpret_cast<float*>(smem + Cfg::kOffKScale);   // [kN][4] (fp8_ds_mla)
  int* s_row_exp = reinterpret_cast<int*>(smem + (Cfg::kPvRaw ? Cfg::kOffP : Cfg::kOffRowExp));  // [kM] (fp8_ds_mla)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int row_group = warp / Cfg::kColGroups, col_group = warp % Cfg::kColGroups;
  const int h0 = blockIdx.x * kM;
  // Launched as a programmatic dependent (common/pdl.cuh): wait until what the kernels before wrote
  // (q, the indices, a gathered DeepSeek-V4 cache) is visible, then let the combine launch.
  pdl_wait_prerequisites();
  pdl_launch_dependents();
  const CtaWork work = cta_work(p, kN);
  const int bs = work.bs, b = work.b, s = work.s;
  const bool whole = work.whole;
  const int num_keys = work.num_keys, tile_begin = work.tile_begin, num_tiles = work.num_tiles;
  const uint8_t* cache = static_cast<const uint8_t*>(p.kv_cache);

  // ---- loaders (all compute threads; with copy warps the row copies are theirs) ------------
  // Q tile: kM heads x 72 chunks; heads past h_q are zero-filled, never read.
  auto load_q = [&]() {
    load_q_tile<kM, Cfg::kThreads>(p, b, s, h0, tid, s_q, [](int r, int c) { return swz<Cfg::kChunks>(r, c); });
  };
  // fp8_ds_mla: q rows in place to q' = q 2^-e_r (normalise_q_rows).
  auto prepare_q_fp16 = [&]() {
    normalise_q_rows<kM, Cfg::kWarps>(s_q, s_row_exp, warp, lane, [](int r, int c) { return swz<Cfg::kChunks>(r, c); });
  };
  // One tile of gathered rows: kRowThreads threads per row, each issues its row's chunks part,
  // part + kRowThreads, ... so one thread computes kRowThreads / 4 row addresses and keeps ~10-18
  // 16-byte copies in flight. 8 threads per row measured faster than 4 (fewer cache lines per
  // copy instruction) in every kernel; 16 faster again for fp8_ds_mla rows (4-8%, the kPvRaw and
  // 16-head kernels), the same for bf16 rows (csrc/sparse/README.md).
  // Invalid keys (negative, past the cache, past topk_length) are zero-filled and never read.
  // Tiles are loaded in order; each thread's slot for the next tile is fetched one load ahead,
  // so the index read never stalls the issue of the row copies. The fetch is issued after the
  // copies (volatile asm keeps the order), when the old slot is dead: the load then writes the
  // loop-carried register itself, instead of a copy that would wait for the load at the end of
  // every tile.
  // kBulkRows: lane l of copy warp c copies row 16 c + l, one slot each; the other lanes none.
  const bool copy_warp = Cfg::kCopyWarps > 0 && warp >= Cfg::kWarps;
  constexpr int kBulkRowsPerWarp = kN / (Cfg::kCopyWarps > 0 ? Cfg::kCopyWarps : 1);
  constexpr int kRowT = Cfg::kRowThreads;
  constexpr int kRowsPerPass = Cfg::kBulkRows ? kN : (Cfg::kCpAsyncCopyWarps ? Cfg::kCopyThreads : Cfg::kThreads) / kRowT;
  constexpr int kPasses = kN / kRowsPerPass;
  const bool bulk_lane = Cfg::kBulkRows && lane < kBulkRowsPerWarp && copy_warp;
  const int load_tid = Cfg::kCpAsyncCopyWarps ? tid - Cfg::kThreads : tid;  // (cp.async copy warps: their own index)
  const int load_row = Cfg::kBulkRows ? kBulkRowsPerWarp * (warp - Cfg::kWarps) + lane : load_tid / kRowT;
  auto fetch_slot = [&](int tile, int pass) { return fetch_slot_ahead(work.idx_row, tile * kN + load_row + kRowsPerPass * pass, num_keys); };
  int32_t next_slot[kPasses];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    next_slot[pass] = Cfg::kBulkRows ? (bulk_lane ? fetch_slot(tile_begin, pass) : -1)
                                     : (!Cfg::kCpAsyncCopyWarps || copy_warp ? fetch_slot(tile_begin, pass) : -1);
  }
  const uint32_t block_size32 = block_size_u32(p);
  const uint32_t bars = sm80::smem_addr(smem + Cfg::kOffBars);  // kBulkRows, copy warps: staging buffer j's at bars + 8 j
  auto load_tile = [&](int tile, uint8_t* dst, int valid_slot) {
    if constexpr (Cfg::kBulkRows) {
#if MLA_SM90A
      // valid_slot is the staging buffer's index (the e4m3-fragment loop), hence its mbarrier; the
      // phase completes with the 64th arrival and the last byte. No generic writes at all (the
      // compute warps write the row flags themselves).
      if (bulk_lane) {
        const int32_t slot = next_slot[0];
        const bool ok = slot >= 0 && slot < p.num_slots;
        bulk_ds_mla_row_or_zero_row(p, cache, slot, ok, block_size32, dst + load_row * kDsMlaRowBytes, bars + 8 * valid_slot);
        next_slot[0] = fetch_slot(tile + 1, 0);
      }
#endif
      return;
    }
    if (Cfg::kCpAsyncCopyWarps && !copy_warp) return;
    const int part = load_tid % kRowT;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int r = load_row + kRowsPerPass * pass;
      const int32_t slot = next_slot[pass];
      const bool ok = slot >= 0 && slot < p.num_slots;
      if (!Cfg::kCpAsyncCopyWarps && part == 0) s_valid[valid_slot * kN + r] = ok;  // (copy warps: the compute warps write them)
      const uint8_t* row = slot_row(p, cache, slot, ok, block_size32);
      if constexpr (!Cfg::kDsMla) {
#pragma unroll
        for (int j = 0; j < (kChunks + kRowT - 1) / kRowT; ++j) {
          const int c = part + kRowT * j;
          if (kChunks % kRowT == 0 || c < kChunks) {
            sm80::cp_async16(sm80::smem_addr(dst + swz<kChunks>(r, c)), row + 16 * c, ok);
          }
        }
      } else {
        copy_ds_mla_row_part<kRowT>(dst + r * kDsMlaRowBytes, row, part, ok);
      }
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) next_slot[pass] = fetch_slot(tile + 1, pass);
    // cp.async copy warps: this thread's arrival on the buffer's mbarrier once its copies have landed
    if constexpr (Cfg::kCpAsyncCopyWarps) cp_async_mbar_arrive(bars + 8 * valid_slot);
  };

  // fp8_ds_mla staging -> K tile (dequant_ds_mla_rows); the 4 tile scales per key go to s_kscale
  // and are applied to the partial scores and to P (see compute_tile).
  auto dequant_tile = [&](const uint8_t* s_stage) {
    dequant_ds_mla_rows<kN, Cfg::kWarps, Cfg::kThreads>(s_stage, s_k, warp, lane, tid,
                                                        [](int r, int c) { return swz<Cfg::kChunks>(r, c); });
    if (tid < kN) {
      reinterpret_cast<float4*>(s_kscale)[tid] = *reinterpret_cast<const float4*>(s_stage + tid * kDsMlaRowBytes + kDsMlaScaleOffset);
    }
  };

  // ---- per-thread state --------------------------------------------------------------------
  // Softmax (QK^T layout): rows r0 = 16 row_group + lane / 4 and r0 + 8.
  float m_run[2] = {-INFINITY, -INFINITY};  // running max, log2 domain (score * scale * log2 e)
  float l_run[2] = {0.f, 0.f};              // this thread's share of the row sum
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float row_scale[2] = {scale_log2, scale_log2};  // fp8_ds_mla: times 2^e of the row
  const int r0 = row_group * 16 + lane / 4;
  const int bar_id = 1 + row_group;                // warps sharing rows sync on their own barrier
  constexpr int kComputeBar = 5;                   // (copy warps: all compute warps; 1-4 are bar_id's, 6-7 below)
  constexpr int kBarThreads = 32 * Cfg::kColGroups;
  float* s_corr = reinterpret_cast<float*>(smem + Cfg::kOffRowState);  // [kM] O rescale of this tile
  float* s_mfin = Cfg::kPvRaw ? reinterpret_cast<float*>(s_k) : s_corr + kM;  // [kM] final row max
  // PV (all rows, 64 columns per warp): O[m-tile][n-tile] holds rows 16 mt + lane / 4 (+ 8),
  // columns col0 + 8 n + 2 (lane % 4) (+ 1).
  float o[Cfg::kPvMTiles][Cfg::kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < Cfg::kPvMTiles; ++mt)
#pragma unroll
    for (int n = 0; n < Cfg::kOTiles; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  const int col0 = 64 * warp;
  // fp8_ds_mla: R = running max |scale| of the 128-wide tile vt holding this warp's columns; O holds
  // sum_k P[k] scale[k, vt] / R * v8[k], rescaled when R grows (like the softmax max).
  const int vt = warp / 2;
  float v_ref = 0.f, v_inv = 0.f;  // fp8_ds_mla: R of this warp's scale tile and 1 / R
  // 16-head tiles: the warp's Q fragments (dim group g = warp % 4), loaded once Q is ready.
  constexpr int kQf = Cfg::kSplitDimsQK ? 9 : 1;
  uint32_t qf[kQf][4];
  auto load_q_frags = [&]() {
    if constexpr (Cfg::kE4m3Frags) {
      // Permuted k: thread (grp, qd) holds 4 dims d .. d + 3 of rows grp and grp + 8 for every
      // k-step (a0/a1 = dims +0, +1; a2/a3 = dims +2, +3), matching 4 e4m3 bytes of a key. kv_c
      // k-step st of scale tile g: d = 128 g + 32 qd + 4 st, so a thread's 8 k-steps are 32
      // consecutive bytes of a key (two 16-byte loads); k_pe: d = 512 + 16 g + 4 qd.
      const int g = warp % 4, grp = lane / 4, qd = lane % 4;
#pragma unroll
      for (int st = 0; st < 9; ++st) {
        const int d = st < 8 ? 128 * g + 32 * qd + 4 * st : kKvLoraRank + 16 * g + 4 * qd;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const uint2 v = *reinterpret_cast<const uint2*>(s_q + swz<kChunks>(grp + 8 * rr, d / 8) + 2 * (d % 8));
          qf[st][rr] = v.x;
          qf[st][2 + rr] = v.y;
        }
      }
    } else if constexpr (Cfg::kSplitDimsQK) {
      const int g = warp % 4;
#pragma unroll
      for (int st = 0; st < 9; ++st) {
        const int kk = Cfg::kDsMla ? (st < 8 ? 8 * g + st : kKvLoraRank / 16 + g) : 9 * g + st;
        sm80::ldmatrix_x4(qf[st], sm80::smem_addr(s_q) + swz<kChunks>(lane % 16, 2 * kk + lane / 16));
      }
    }
  };

  // One 64-key tile, in phases: scores() S = Q K^T on the warp's keys; softmax_p() masks, shares
  // the row max across the column groups, writes P to shared memory and the O rescale factors to
  // s_corr; rescale_o(); pv() O += P V on this warp's output columns. compute_tile() runs them in
  // order with the barrier that PV needs (P of all rows); the 16-head e4m3-fragment kernel
  // pipelines them across tiles instead (main loop).
  const int key0 = col_group * Cfg::kKeysPerWarp;
  const int grp = lane / 4, qd = lane % 4;
  float* red_s = reinterpret_cast<float*>(smem + Cfg::kOffRedS);  // 16-head: [4 groups][16 rows][kRedSStride]
  // fp8_ds_mla tile scale t of key k: in the staging rows s_rows (e4m3 fragments, kPvRaw) or s_kscale.
  auto kscale = [&](const uint8_t* s_rows, int k, int t) -> float {
    if constexpr (Cfg::kE4m3Frags || Cfg::kPvRaw) {
      return *reinterpret_cast<const float*>(s_rows + k * kDsMlaRowBytes + kDsMlaScaleOffset + 4 * t);
    } else {
      return s_kscale[4 * k + t];
    }
  };
  // 16-head tiles: partial S of dim group g = warp % 4 for keys 32 kh .. + 31 (kh = warp / 4, 4 n8
  // tiles) into red_s; the sum over the four groups follows a barrier (sum_dim_groups).
  auto qk_partial = [&](const uint8_t* s_kt) {
    const uint32_t k_base = sm80::smem_addr(s_kt);
    auto ldmatrix_k16 = [&](uint32_t (&bk)[4], int key16, int kk) {
      const int key = key16 + (lane / 16) * 8 + lane % 8;
      sm80::ldmatrix_x4(bk, k_base + swz<Cfg::kKChunks>(key, 2 * kk + (lane / 8) % 2));
    };
    const int g = warp % 4, kh = warp / 4;
    float part[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) part[nt][0] = part[nt][1] = part[nt][2] = part[nt][3] = 0.f;
    if constexpr (Cfg::kE4m3Frags) {
      // B = 4 e4m3 bytes of key 32 kh + 8 nt + grp at dims 128 g + 32 qd + 4 st (the Q fragments'
      // permutation): one 16-byte load per 4 k-steps, conflict-free per 8-lane phase (rows are
      // 656 B = 164 words apart: word offset 4 grp + 8 qd + const).
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint4 w[4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          w[nt] = e4m3::lds128(k_base + (32 * kh + 8 * nt + grp) * kDsMlaRowBytes + 128 * g + 32 * qd + 16 * half);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const uint32_t word = j == 0 ? w[nt].x : j == 1 ? w[nt].y : j == 2 ? w[nt].z : w[nt].w;
            uint32_t b0, b1;
            e4m3::x4_to_f16x2x2(word, b0, b1);
            sm80::mma_16816<__half>(part[nt], qf[4 * half + j], b0, b1);
          }
        }
      }
    } else {
      constexpr int kSteps = Cfg::kDsMla ? 8 : 9;  // fp8_ds_mla: + 1 bf16 k_pe step after the scale
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const int kk = Cfg::kDsMla ? 8 * g + st : 9 * g + st;
#pragma unroll
        for (int n16 = 0; n16 < 2; ++n16) {
          uint32_t bk[4];
          ldmatrix_k16(bk, 32 * kh + 16 * n16, kk);
          sm80::mma_16816<KvT>(part[2 * n16], qf[st], bk[0], bk[1]);
          sm80::mma_16816<KvT>(part[2 * n16 + 1], qf[st], bk[2], bk[3]);
        }
      }
    }
    if constexpr (Cfg::kDsMla) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int key = 32 * kh + 8 * nt + 2 * qd;
        const float s0 = kscale(s_kt, key, g), s1 = kscale(s_kt, key + 1, g);
        part[nt][0] *= s0, part[nt][1] *= s1, part[nt][2] *= s0, part[nt][3] *= s1;
      }
    }
    if constexpr (Cfg::kE4m3Frags) {
      // k_pe (bf16 in the row): dims 16 g + 4 qd .. + 3 of key 32 kh + 8 nt + grp, one 64-bit load.
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int key = 32 * kh + 8 * nt + grp;
        const uint2 w = e4m3::lds64(k_base + key * kDsMlaRowBytes + kDsMlaRopeOffset + 2 * (16 * g + 4 * qd));
        sm80::mma_16816<__nv_bfloat16>(part[nt], qf[8], w.x, w.y);
      }
    } else if constexpr (Cfg::kDsMla) {
#pragma unroll
      for (int n16 = 0; n16 < 2; ++n16) {
        uint32_t bk[4];
        ldmatrix_k16(bk, 32 * kh + 16 * n16, kKvLoraRank / 16 + g);
        sm80::mma_16816<__nv_bfloat16>(part[2 * n16], qf[8], bk[0], bk[1]);
        sm80::mma_16816<__nv_bfloat16>(part[2 * n16 + 1], qf[8], bk[2], bk[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int key = 32 * kh + 8 * nt + 2 * qd;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float2*>(red_s + (g * 16 + grp + 8 * h) * Cfg::kRedSStride + key) =
            make_float2(part[nt][2 * h], part[nt][2 * h + 1]);
      }
    }
  };
  // After a barrier: S of keys key0 .. + 7 (this warp's softmax columns) = the four partial sums.
  auto sum_dim_groups = [&](float (&sc)[Cfg::kSTiles][4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[0][2 * h] = sc[0][2 * h + 1] = 0.f;
#pragma unroll
      for (int gg = 0; gg < 4; ++gg) {
        const float2 v = *reinterpret_cast<const float2*>(red_s + (gg * 16 + grp + 8 * h) * Cfg::kRedSStride + key0 + 2 * qd);
        sc[0][2 * h] += v.x;
        sc[0][2 * h + 1] += v.y;
      }
    }
  };
  // s_rows: the tile's staging rows (kPvRaw: k_pe and the scales come from there).
  auto scores = [&](const uint8_t* s_kt, const uint8_t* s_rows, float (&sc)[Cfg::kSTiles][4]) {
    const uint32_t q_base = sm80::smem_addr(s_q), k_base = sm80::smem_addr(s_kt);
    // B fragments of two n8 tiles (keys key .. key + 15 as addressed by this lane), k-step kk.
    auto ldmatrix_k16 = [&](uint32_t (&bk)[4], int key16, int kk) {
      const int key = key16 + (lane / 16) * 8 + lane % 8;
      sm80::ldmatrix_x4(bk, k_base + swz<Cfg::kKChunks>(key, 2 * kk + (lane / 8) % 2));
    };
    // One 16-dim k-step (chunks 2 kk, 2 kk + 1) of acc += Q K^T on the warp's keys, operand type T.
    auto qk_step = [&](auto type_tag, float (&acc)[Cfg::kSTiles][4], int kk) {
      using T = decltype(type_tag);
      uint32_t a[4];
      sm80::ldmatrix_x4(a, q_base + swz<kChunks>(row_group * 16 + lane % 16, 2 * kk + lane / 16));
      if constexpr (Cfg::kSTiles == 1) {
        uint32_t bk[2];
        sm80::ldmatrix_x2(bk, k_base + swz<Cfg::kKChunks>(key0 + lane % 8, 2 * kk + (lane / 8) % 2));
        sm80::mma_16816<T>(acc[0], a, bk[0], bk[1]);
      } else {
#pragma unroll
        for (int n16 = 0; n16 < Cfg::kSTiles / 2; ++n16) {
          uint32_t bk[4];
          ldmatrix_k16(bk, key0 + 16 * n16, kk);
          sm80::mma_16816<T>(acc[2 * n16], a, bk[0], bk[1]);
          sm80::mma_16816<T>(acc[2 * n16 + 1], a, bk[2], bk[3]);
        }
      }
    };
#pragma unroll
    for (int j = 0; j < Cfg::kSTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
    constexpr int kC = Cfg::kChains;
    if constexpr (Cfg::kSplitDimsQK) {
      qk_partial(s_kt);
      sm80::named_barrier(bar_id, kBarThreads);  // (all 8 warps)
      sum_dim_groups(sc);
    } else if constexpr (!Cfg::kDsMla) {
      // 36 bf16 k-steps over kC independent accumulators.
      float acc[kC][Cfg::kSTiles][4];
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int j = 0; j < Cfg::kSTiles; ++j) acc[c][j][0] = acc[c][j][1] = acc[c][j][2] = acc[c][j][3] = 0.f;
#pragma unroll 4
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
      // kPvRaw: the ldmatrix addresses come from one base per lane and operand. Chunk c = 2 kk + h of
      // a Q row r sits at byte 16 (c ^ (r % 8)) of the row, which for kk = 8 t + st is 256 t + 128 (st / 4)
      // + (16 (h ^ (r % 8)) ^ 32 (st % 4)); the row's address plus 256 t has bits 4-6 clear, so the
      // address is ((lane base + 256 t) ^ 32 (st % 4)) + 128 (st / 4): one XOR per k-step and operand
      // and an immediate offset, where the generic swz() costs ~4 integer instructions per ldmatrix
      // (the profile of the first kPvRaw kernel: ~78 of the 158 instructions of this loop). K rows
      // (swz_k64) XOR 16 more where (c / 8) % 2 = 1, i.e. for st >= 4.
      uint32_t q_lane = 0, k_lane = 0;
      if constexpr (Cfg::kPvRaw) {
        const int qr = row_group * 16 + lane % 16, kr = key0 + (lane / 16) * 8 + lane % 8;
        q_lane = q_base + qr * kChunks * 16 + 16 * ((lane / 16) ^ (qr & 7));
        k_lane = k_base + swz_k64(kr, (lane / 8) % 2);  // = row + 16 (h ^ (kr % 8))
      }
#pragma unroll 1  // (unrolled, the 64-head tile's MMA operands outgrow the 255 registers)
      for (int t0 = 0; t0 < 4; t0 += kC) {
        float acc[kC][Cfg::kSTiles][4];
#pragma unroll
        for (int c = 0; c < kC; ++c)
#pragma unroll
          for (int j = 0; j < Cfg::kSTiles; ++j) acc[c][j][0] = acc[c][j][1] = acc[c][j][2] = acc[c][j][3] = 0.f;
        if constexpr (Cfg::kPvRaw) {
          // The fragments of k-step st + 1 are loaded before the MMAs of step st (the MMAs waited for
          // their own ldmatrix: short-scoreboard stalls were 2/3 of this loop's samples).
          static_assert(Cfg::kSTiles == 4 && kC == 1, "kPvRaw: 32 keys per warp, two ldmatrix_x4 of K per k-step");
          uint32_t a[2][4], bk[2][2][4];
          auto load_step = [&](int st, uint32_t (&fa)[4], uint32_t (&fb)[2][4]) {
            const uint32_t x = 32 * (st % 4), off = 128 * (st / 4);
            sm80::ldmatrix_x4(fa, ((q_lane + 256 * t0) ^ x) + off);
            const uint32_t ka = ((k_lane + 256 * t0) ^ (x | (st >= 4 ? 16u : 0u))) + off;
            sm80::ldmatrix_x4(fb[0], ka);
            sm80::ldmatrix_x4(fb[1], ka + 16 * Cfg::kKChunks * 16);  // keys + 16: same row % 8
          };
          load_step(0, a[0], bk[0]);
#pragma unroll
          for (int st = 0; st < 8; ++st) {
            if (st + 1 < 8) load_step(st + 1, a[(st + 1) % 2], bk[(st + 1) % 2]);
#pragma unroll
            for (int n16 = 0; n16 < 2; ++n16) {
              sm80::mma_16816<__half>(acc[0][2 * n16], a[st % 2], bk[st % 2][n16][0], bk[st % 2][n16][1]);
              sm80::mma_16816<__half>(acc[0][2 * n16 + 1], a[st % 2], bk[st % 2][n16][2], bk[st % 2][n16][3]);
            }
          }
        } else {
#pragma unroll
          for (int st = 0; st < 8; ++st) {
#pragma unroll
            for (int c = 0; c < kC; ++c) qk_step(__half{}, acc[c], 8 * (t0 + c) + st);
          }
        }
#pragma unroll
        for (int c = 0; c < kC; ++c) {
#pragma unroll
          for (int j = 0; j < Cfg::kSTiles; ++j) {
            const int key = key0 + 8 * j + 2 * (lane % 4);
            const float s0 = kscale(s_rows, key, t0 + c), s1 = kscale(s_rows, key + 1, t0 + c);
            sc[j][0] = fmaf(acc[c][j][0], s0, sc[j][0]);
            sc[j][1] = fmaf(acc[c][j][1], s1, sc[j][1]);
            sc[j][2] = fmaf(acc[c][j][2], s0, sc[j][2]);
            sc[j][3] = fmaf(acc[c][j][3], s1, sc[j][3]);
          }
        }
      }
      if constexpr (Cfg::kPvRaw) {
        // k_pe from the staging rows (656 B = 164 words apart: the 8 rows of an ldmatrix phase start
        // 4 banks apart, conflict-free), same fragments as from the K tile.
        const uint32_t rows = sm80::smem_addr(s_rows) + kDsMlaRopeOffset;
#pragma unroll
        for (int kk = kKvLoraRank / 16; kk < kChunks / 2; ++kk) {
          uint32_t a[4];
          sm80::ldmatrix_x4(a, (q_lane + 1024) ^ (32 * (kk - kKvLoraRank / 16)));  // chunks 64 + 2 (kk - 32) + h
#pragma unroll
          for (int n16 = 0; n16 < Cfg::kSTiles / 2; ++n16) {
            uint32_t bk[4];
            const int key = key0 + 16 * n16 + (lane / 16) * 8 + lane % 8;
            sm80::ldmatrix_x4(bk, rows + key * kDsMlaRowBytes + 16 * (2 * kk - kKvLoraRank / 8 + (lane / 8) % 2));
            sm80::mma_16816<__nv_bfloat16>(sc[2 * n16], a, bk[0], bk[1]);
            sm80::mma_16816<__nv_bfloat16>(sc[2 * n16 + 1], a, bk[2], bk[3]);
          }
        }
      } else {
#pragma unroll
        for (int kk = kKvLoraRank / 16; kk < kChunks / 2; ++kk) qk_step(__nv_bfloat16{}, sc, kk);
      }
    }
  };
  // Returns the factor R_old / R_new of this warp's O (fp8_ds_mla; else 1).
  auto softmax_p = [&](float (&sc)[Cfg::kSTiles][4], const uint8_t* s_kt, int valid_slot) -> float {
    // Mask with selects (never multiply: a masked score must not turn into NaN), scale.
    const auto* valid = s_valid + valid_slot * kN;
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
    if (lane % 4 == 0) {
      s_red[col_group * kM + r0] = mx[0];
      s_red[col_group * kM + r0 + 8] = mx[1];
    }
    // fp8_ds_mla: R of this warp's scale tile (registers only: overlaps the barrier wait).
    float v_rescale = 1.f;
    if constexpr (Cfg::kDsMla) {
      e4m3::update_scale_ref<Cfg::kScaleFitLog2>(kscale(s_kt, lane, vt), kscale(s_kt, lane + 32, vt), v_ref, v_rescale, v_inv);
    }
    sm80::named_barrier(bar_id, kBarThreads);
    float m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int g = 0; g < Cfg::kColGroups; ++g) tile_max = fmaxf(tile_max, s_red[g * kM + r0 + 8 * i]);
      float m_new = fmaxf(m_run[i], tile_max);
      // (The difference, not m_run + slack: at |m_run| ~ 2^27 the sum rounds by 16. -inf - -inf = NaN
      // compares false: m stays -inf.)
      if constexpr (Cfg::kMaxSlack > 0.f) m_new = tile_max - m_run[i] > Cfg::kMaxSlack ? m_new : m_run[i];
      m_use[i] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: exp2(-inf - 0) = 0
      const float corr = fast_exp2(m_run[i] - m_use[i]);
      m_run[i] = m_new;
      l_run[i] *= corr;
      if (col_group == 0 && lane % 4 == 0) s_corr[r0 + 8 * i] = corr;
    }
#pragma unroll
    for (int j = 0; j < Cfg::kSTiles; ++j) {
      const float p0 = fast_exp2(sc[j][0] - m_use[0]), p1 = fast_exp2(sc[j][1] - m_use[0]);
      const float p2 = fast_exp2(sc[j][2] - m_use[1]), p3 = fast_exp2(sc[j][3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int key = key0 + 8 * j + 2 * (lane % 4);
      if constexpr (Cfg::kE4m3Frags) {
        // keys key, key + 1 (key % 8 = 2 qd) at their permuted places
        __half* pt = reinterpret_cast<__half*>(s_p);
        const int pos0 = 8 * (key / 8) + 2 * ((2 * qd) % 4) + qd / 2, pos1 = 8 * (key / 8) + 2 * ((2 * qd + 1) % 4) + qd / 2;
        pt[r0 * Cfg::kPStride + pos0] = __float2half_rn(p0);
        pt[r0 * Cfg::kPStride + pos1] = __float2half_rn(p1);
        pt[(r0 + 8) * Cfg::kPStride + pos0] = __float2half_rn(p2);
        pt[(r0 + 8) * Cfg::kPStride + pos1] = __float2half_rn(p3);
      } else {
        const uint32_t in_chunk = (key % 8) * 2;
        *reinterpret_cast<uint32_t*>(s_p + swz<kN / 8>(r0, key / 8) + in_chunk) = sm80::pack2<KvT>(p0, p1);
        *reinterpret_cast<uint32_t*>(s_p + swz<kN / 8>(r0 + 8, key / 8) + in_chunk) = sm80::pack2<KvT>(p2, p3);
      }
    }
    return v_rescale;
  };
  // After a barrier (s_corr of all rows written): O *= exp2(m_old - m_new) R_old / R_new per row;
  // most tiles change neither: skip then.
  auto rescale_o = [&](float v_rescale) {
    float corr[Cfg::kPvMTiles][2];
    bool unit = v_rescale == 1.f;
#pragma unroll
    for (int mt = 0; mt < Cfg::kPvMTiles; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        corr[mt][i] = s_corr[16 * mt + lane / 4 + 8 * i];
        unit = unit && corr[mt][i] == 1.f;
      }
    }
    if (!__all_sync(0xffffffffu, unit)) {
#pragma unroll
      for (int mt = 0; mt < Cfg::kPvMTiles; ++mt) {
        const float c0 = corr[mt][0] * v_rescale, c1 = corr[mt][1] * v_rescale;
#pragma unroll
        for (int n = 0; n < Cfg::kOTiles; ++n) {
          o[mt][n][0] *= c0;
          o[mt][n][1] *= c0;
          o[mt][n][2] *= c1;
          o[mt][n][3] *= c1;
        }
      }
    }
  };
  // P A fragments of k-step kk for every m-tile (swizzled [kM][64] P tile), and P' = P scale / R: keys
  // k, k + 1 (a[.][0/1]) times s01, keys k + 8, k + 9 (a[.][2/3]) times s89 (fp8_ds_mla).
  auto load_p_frags = [&](uint32_t (&a)[Cfg::kPvMTiles][4], uint32_t p_base, int kk) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kPvMTiles; ++mt) {
      sm80::ldmatrix_x4(a[mt], p_base + swz<kN / 8>(16 * mt + lane % 16, 2 * kk + lane / 16));
    }
  };
  auto scale_p_frags = [&](uint32_t (&a)[Cfg::kPvMTiles][4], __half2 s01, __half2 s89) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kPvMTiles; ++mt) {
      a[mt][0] = e4m3::hmul2_bits(a[mt][0], s01);
      a[mt][1] = e4m3::hmul2_bits(a[mt][1], s01);
      a[mt][2] = e4m3::hmul2_bits(a[mt][2], s89);
      a[mt][3] = e4m3::hmul2_bits(a[mt][3], s89);
    }
  };
  auto pv = [&](const uint8_t* s_kt) {
    const uint32_t k_base = sm80::smem_addr(s_kt), p_base = sm80::smem_addr(s_p);
    // O += P V: V is the first 512 columns of the same rows, read transposed by ldmatrix once per
    // warp and used for all m-tiles. fp8_ds_mla: A = P' = P scale[k, vt] / R in fp16 (|P'| <= 2^14).
    if constexpr (Cfg::kE4m3Frags) {
      // k-step of 16 keys: thread qd holds keys 16 ks + qd + {0, 4 | 8, 12}; column n of n-tile j
      // (of a set of 4 covering 32 dims) is dim 4 n + j, so one 32-bit load per key (4 bytes:
      // dims 4 grp .. + 3) gives four n-tiles after a byte regroup. C then holds dims
      // 32 S + 8 qd + {j, 4 + j}: o[0][4 S + j].
      const __half* pt = reinterpret_cast<const __half*>(s_p);
#pragma unroll
      for (int ks = 0; ks < kN / 16; ++ks) {
        uint32_t pa[4];
        e4m3::load_pv_a<Cfg::kPStride>(pt, ks, lane, pa);
        const int k = 16 * ks + qd;
        const __half2 s01 = __floats2half2_rn(kscale(s_kt, k, vt) * v_inv, kscale(s_kt, k + 4, vt) * v_inv);
        const __half2 s23 = __floats2half2_rn(kscale(s_kt, k + 8, vt) * v_inv, kscale(s_kt, k + 12, vt) * v_inv);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          pa[rr] = e4m3::hmul2_bits(pa[rr], s01);
          pa[2 + rr] = e4m3::hmul2_bits(pa[2 + rr], s23);
        }
#pragma unroll
        for (int S = 0; S < 2; ++S) {
          uint32_t w[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) w[e] = e4m3::lds32(k_base + (k + 4 * e) * kDsMlaRowBytes + col0 + 32 * S + 4 * grp);
          uint32_t b0[4], b1[4];
          e4m3::regroup_pv_b(w, b0, b1);
#pragma unroll
          for (int j = 0; j < 4; ++j) sm80::mma_16816<__half>(o[0][4 * S + j], pa, b0[j], b1[j]);
        }
      }
    } else {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t a[Cfg::kPvMTiles][4];
      load_p_frags(a, p_base, kk);
      if constexpr (Cfg::kDsMla) {
        const int k = 16 * kk + 2 * (lane % 4);  // a[.][0/1]: keys k, k + 1; a[.][2/3]: keys k + 8, k + 9
        const float* ks = s_kscale + 4 * k + vt;
        scale_p_frags(a, __floats2half2_rn(ks[0] * v_inv, ks[4] * v_inv), __floats2half2_rn(ks[32] * v_inv, ks[36] * v_inv));
      }
      const int key = 16 * kk + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int n16 = 0; n16 < Cfg::kOTiles / 2; ++n16) {
        uint32_t bv[4];
        sm80::ldmatrix_x4_trans(bv, k_base + swz<kChunks>(key, (col0 + 16 * n16) / 8 + lane / 16));
#pragma unroll
        for (int mt = 0; mt < Cfg::kPvMTiles; ++mt) {
          sm80::mma_16816<KvT>(o[mt][2 * n16], a[mt], bv[0], bv[1]);
          sm80::mma_16816<KvT>(o[mt][2 * n16 + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
    }
  };
  // kPvRaw: O += P' V(t) with V read from tile t's staging rows `rows` and converted in registers,
  // interleaved with the dequantisation of the next tile's staging rows `rows_next` into the K tile
  // (which QK^T(t) no longer reads): two of this warp's 8 rows per 16-key step, so that their loads,
  // conversions and stores issue while the step's MMAs run. Natural key order: thread qd's B rows are
  // keys 16 ks + 2 qd + {0, 1, 8, 9} (the A fragment's, from the same P tile as pv() reads), whose
  // 32-bit loads (4 dims each) sit 8 qd + grp words apart mod 32: conflict-free. Column n of n-tile j
  // in set S is dim col0 + 32 S + 4 n + j, so C holds dims col0 + 32 S + 8 qd + {j, 4 + j}: o[mt][4 S + j].
  auto pv_raw = [&](const uint8_t* rows, const uint8_t* rows_next) {
    const uint32_t v_base = sm80::smem_addr(rows), p_base = sm80::smem_addr(s_p);
#pragma unroll
    for (int ks = 0; ks < kN / 16; ++ks) {
      // All of the step's shared loads first (P, V words, scales), then the dequantisation's, so that
      // they are in flight together before the first conversion and MMA needs them.
      uint32_t a[Cfg::kPvMTiles][4];
      load_p_frags(a, p_base, ks);
      const int k = 16 * ks + 2 * qd;  // a[.][0/1]: keys k, k + 1; a[.][2/3]: keys k + 8, k + 9
      uint32_t w[2][4];
#pragma unroll
      for (int S = 0; S < 2; ++S) {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[S][e] = e4m3::lds32(v_base + (k + (e % 2) + 8 * (e / 2)) * kDsMlaRowBytes + col0 + 32 * S + 4 * grp);
      }
      const __half2 s01 = __floats2half2_rn(kscale(rows, k, vt) * v_inv, kscale(rows, k + 1, vt) * v_inv);
      const __half2 s89 = __floats2half2_rn(kscale(rows, k + 8, vt) * v_inv, kscale(rows, k + 9, vt) * v_inv);
      dequant_ds_mla_kv_c<2, Cfg::kWarps, true>(rows_next, s_k, warp, lane, 2 * ks, [](int r, int c) { return swz_k64(r, c); });
      scale_p_frags(a, s01, s89);
#pragma unroll
      for (int S = 0; S < 2; ++S) {
        uint32_t b0[4], b1[4];
        e4m3::regroup_pv_b(w[S], b0, b1);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int mt = 0; mt < Cfg::kPvMTiles; ++mt) sm80::mma_16816<__half>(o[mt][4 * S + j], a[mt], b0[j], b1[j]);
        }
      }
    }
  };
  auto compute_tile = [&](const uint8_t* s_kt, int valid_slot) {
    float sc[Cfg::kSTiles][4];
    scores(s_kt, s_kt, sc);
    const float v_rescale = softmax_p(sc, s_kt, valid_slot);
    __syncthreads();  // P and the rescale factors of all rows written (PV takes all rows)
    rescale_o(v_rescale);
    pv(s_kt);
  };

  // A barrier of all compute warps: __syncthreads, or with copy warps (which never join one) a named
  // barrier of the kThreads compute threads.
  auto cta_sync = [&]() {
    if constexpr (Cfg::kCopyWarps > 0) sm80::named_barrier(kComputeBar, Cfg::kThreads);
    else __syncthreads();
  };
  // fp8_ds_mla, once this thread's Q chunks have landed: q' in place (all threads), the rows'
  // softmax scales times 2^e_r, the Q fragments of 16-head tiles.
  auto start_q_fp16 = [&]() {
    cta_sync();  // everyone's Q chunks
    prepare_q_fp16();
    cta_sync();
    row_scale[0] = ldexpf(scale_log2, s_row_exp[r0]);
    row_scale[1] = ldexpf(scale_log2, s_row_exp[r0 + 8]);
    load_q_frags();
  };

  // ---- main loop ------------------------------------------------------------------------
  if constexpr (!Cfg::kDsMla) {
    // bf16 rows go straight into the K buffers; kStages - 1 tiles are in flight during compute.
    // Q has its own cp.async group (16-head tiles read their Q fragments once, before the loop).
    constexpr int kS = Cfg::kStages;
    if (num_tiles > 0) load_q();
    sm80::cp_async_commit();
#pragma unroll
    for (int i = 0; i < kS - 1; ++i) {
      if (i < num_tiles) load_tile(tile_begin + i, s_k + i * Cfg::kKTileBytes, i & 1);
      sm80::cp_async_commit();
    }
    if (Cfg::kSplitDimsQK && num_tiles > 0) {
      sm80::cp_async_wait<kS - 1>();  // this thread's Q chunks
      __syncthreads();
      load_q_frags();
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
  } else if constexpr (Cfg::kE4m3Frags) {
    // fp8_ds_mla, e4m3 fragments: the warps compute on the staging rows themselves, software-
    // pipelined by one tile: iteration t runs PV of tile t together with QK^T of tile t + 1 (two
    // independent MMA chains per warp), then the softmax of tile t + 1 (P(t + 1), its rescale
    // factors). Three barriers per tile: the top one (tile t + 1 landed; P(t) and s_corr written;
    // everyone done with tile t - 1, whose buffer takes tile t + kStages - 1), the partial-score
    // one and the row-max one (in softmax_p). kStages - 2 tiles are in flight during compute.
    // With copy warps the top barrier is the compute warps' own, after which they release the buffer
    // of tile t - 1 to the copy warps (bar.arrive on named barrier 6 or 7, see below).
    constexpr int kS = Cfg::kStages;
    static_assert(kS >= 3, "the pipelined loop keeps tiles t and t + 1 resident");
    // Tile t has landed: its cp.async group (this thread's copies; the barrier after the wait
    // makes them everyone's), or with kBulkRows or copy warps: phase t / kS of its buffer's mbarrier.
    auto wait_tile = [&](int t) {
      if constexpr (Cfg::kBulkRows) {
#if MLA_SM90A
        mbar_wait(bars + 8 * (t % kS), (t / kS) & 1);
#endif
      } else if constexpr (Cfg::kCpAsyncCopyWarps) {
        mbar_wait(bars + 8 * (t % kS), (t / kS) & 1);
      }
    };
    if constexpr (Cfg::kCpAsyncCopyWarps) {
      if (tid == 0) {
        for (int j = 0; j < kS; ++j) mbar_init(bars + 8 * j, Cfg::kCopyThreads);
      }
      __syncthreads();  // (the only CTA-wide barrier the copy warps join)
    } else if constexpr (Cfg::kBulkRows) {
#if MLA_SM90A
      if (tid == 0) {
        for (int j = 0; j < kS; ++j) mbar_init(bars + 8 * j, kN);
        mbar_init_fence();
      }
      __syncthreads();  // (the only CTA-wide barrier the copy warps join)
#else
      __trap();  // bulk row copies are launched on sm90 only
#endif
    }
    if (!copy_warp && num_tiles > 0) load_q();
    sm80::cp_async_commit();
#pragma unroll
    for (int i = 0; i < kS - 1; ++i) {
      if (i < num_tiles) load_tile(tile_begin + i, s_raw + i * Cfg::kRawTileBytes, i);
      sm80::cp_async_commit();
    }
    auto stage = [&](int t) { return s_raw + (t % kS) * Cfg::kRawTileBytes; };
    // Copy warps: tile `next` goes into the buffer of tile next - kS once the compute warps have
    // released that one: after the loop-top barrier of iteration next - kS + 1 they arrive on named
    // barrier kFreeBar + (next - kS) % 2 and the copy warps wait on it (two barriers in turn: the
    // compute warps can run at most one release ahead of the copy warps' waits, since the release
    // after that needs a tile issued after the wait).
    constexpr int kFreeBar = 6;  // and 7
    static_assert(Cfg::kCopyWarps == 0 || kS <= 4, "the release two tiles later needs tile t + 4 issued after the wait");
    if (copy_warp) {
      for (int next = kS - 1; next < num_tiles; ++next) {
        const int prev = next - kS;
        if (prev >= 0) sm80::named_barrier(kFreeBar + prev % 2, Cfg::kLaunchThreads);
        load_tile(tile_begin + next, stage(next), next % kS);
      }
      return;
    }
    // Copy warps: the compute warps write the row flags of each tile (thread k < kN: key k), from
    // slots they read a tile ahead, before the barrier that precedes that tile's softmax.
    int32_t flag_slot = Cfg::kCopyWarps > 0 && tid < kN ? fetch_slot_ahead(work.idx_row, tile_begin * kN + tid, num_keys) : -1;
    auto write_flags = [&](int t) {
      if (Cfg::kCopyWarps > 0 && tid < kN) {
        s_valid[(t % kS) * kN + tid] = flag_slot >= 0 && flag_slot < p.num_slots;
        flag_slot = fetch_slot_ahead(work.idx_row, (tile_begin + t + 1) * kN + tid, num_keys);
      }
    };
    // QK^T of tile t's partial sums, their barrier, the softmax: P(t) and s_corr for tile t.
    float v_rescale = 1.f;
    auto softmax_after_qk = [&](int t) {
      sm80::named_barrier(bar_id, kBarThreads);  // (all 8 warps) partial sums of tile t written
      float sc[1][4];
      sum_dim_groups(sc);
      v_rescale = softmax_p(sc, stage(t), t % kS);
    };
    if (num_tiles > 0) {
      sm80::cp_async_wait<kS - 1>();  // this thread's Q chunks
      start_q_fp16();
      sm80::cp_async_wait<kS - 2>();  // tile 0
      wait_tile(0);
      write_flags(0);
      cta_sync();
      qk_partial(stage(0));
      softmax_after_qk(0);
    }
    for (int t = 0; t < num_tiles; ++t) {
      sm80::cp_async_wait<kS - 3>();  // tile t + 1 (loads were issued up to t + kS - 2)
      if (t + 1 < num_tiles) wait_tile(t + 1);
      cta_sync();
      const int next = t + kS - 1;
      if constexpr (Cfg::kCopyWarps > 0) {
        // Tile t - 1 consumed: its buffer takes tile `next`; the flags of tile t + 1 (softmax below,
        // after the partial-sum barrier).
        if (t > 0 && next < num_tiles) sm80::named_barrier_arrive(kFreeBar + (t - 1) % 2, Cfg::kLaunchThreads);
        if (t + 1 < num_tiles) write_flags(t + 1);
      } else if (next < num_tiles) {
        load_tile(tile_begin + next, stage(next), next % kS);
      }
      sm80::cp_async_commit();
      rescale_o(v_rescale);
      // One basic block, so that the scheduler interleaves the two MMA chains. QK^T runs past the
      // last tile too (on a stale buffer that no copy is writing; its sums are never read).
      pv(stage(t));
      qk_partial(stage(t + 1));
      if (t + 1 < num_tiles) softmax_after_qk(t + 1);
    }
  } else if constexpr (Cfg::kPvRaw) {
    // fp8_ds_mla, 64-head tiles, V from the staging rows (pv_raw): per tile t, QK^T(t) on the K tile
    // (dequantised during PV(t - 1)) and k_pe / scales from staging buffer t % 2, the softmax, one
    // barrier (P(t); tile t + 1 landed; K no longer read), then PV(t) on buffer t % 2 interleaved with
    // the dequantisation of buffer (t + 1) % 2 into K, and a barrier (K holds tile t + 1; buffer t % 2
    // is free for tile t + 2). The last tile dequantises itself again (no branch in that block;
    // nothing reads K afterwards but the epilogue's final maxima, written after the barrier).
    constexpr int kS = Cfg::kStages;
    auto stage = [&](int t) { return s_raw + (t % kS) * Cfg::kRawTileBytes; };
    if (num_tiles > 0) load_q();
    sm80::cp_async_commit();
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      if (i < num_tiles) load_tile(tile_begin + i, stage(i), i);
      sm80::cp_async_commit();
    }
    if (num_tiles > 0) {
      sm80::cp_async_wait<kS>();  // this thread's Q chunks
      start_q_fp16();
      sm80::cp_async_wait<kS - 1>();  // tile 0
      __syncthreads();
#pragma unroll
      for (int j0 = 0; j0 < kN / Cfg::kWarps; j0 += 4) {
        dequant_ds_mla_kv_c<4, Cfg::kWarps, true>(stage(0), s_k, warp, lane, j0, [](int r, int c) { return swz_k64(r, c); });
      }
      __syncthreads();  // K holds tile 0
    }
    for (int t = 0; t < num_tiles; ++t) {
      float sc[Cfg::kSTiles][4];
      scores(s_k, stage(t), sc);
      const float v_rescale = softmax_p(sc, stage(t), t % kS);
      sm80::cp_async_wait<0>();  // this thread's copies of tile t + 1
      __syncthreads();           // P(t), s_corr, tile t + 1 visible; QK^T(t) done with K
      rescale_o(v_rescale);
      pv_raw(stage(t), stage(t + 1 < num_tiles ? t + 1 : t));
      __syncthreads();  // K holds tile t + 1; buffer t % kS free
      if (t + kS < num_tiles) load_tile(tile_begin + t + kS, stage(t), t % kS);
      sm80::cp_async_commit();
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
      start_q_fp16();
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
  // Row sums: the 4 lanes of a row, then the column groups (same max, so plain sums); the final
  // max per row to shared memory for the PV layout.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
  }
  if (lane % 4 == 0) {
    s_red[col_group * kM + r0] = l_run[0];
    s_red[col_group * kM + r0 + 8] = l_run[1];
    if (col_group == 0) s_mfin[r0] = m_run[0], s_mfin[r0 + 8] = m_run[1];
  }
  cta_sync();
  const int out_col0 = col0 + 2 * (lane % 4);
#pragma unroll
  for (int mt = 0; mt < Cfg::kPvMTiles; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * mt + lane / 4 + 8 * i;
      const int h = h0 + r;
      if (h >= p.h_q) continue;
      float l_total = 0.f;
#pragma unroll
      for (int g = 0; g < Cfg::kColGroups; ++g) l_total += s_red[g * kM + r];
      // 0: nothing attended (out 0, lse -inf); NaN (a NaN row among the attended) propagates.
      const bool any = l_total != 0.f;
      const float inv = any ? 1.f / l_total : 0.f;
      const float lse = any ? (s_mfin[r] + log2f(l_total)) * 0.6931471805599453f : -INFINITY;
      // 1 / l, times R (fp8_ds_mla), times the sink factor (unsplit only; the combine applies it).
      const float sink = whole && p.attn_sink != nullptr ? attn_sink_factor(lse, p.attn_sink[h]) : 1.f;
      const float f = inv * sink * (Cfg::kDsMla ? v_ref : 1.f);
      const bool lse_writer = warp == 0 && lane % 4 == 0;
      if constexpr (Cfg::kE4m3Frags || Cfg::kPvRaw) {
        // o[mt][4 S + j] holds dims col0 + 32 S + 8 (lane % 4) + {j, 4 + j}.
#pragma unroll
        for (int S = 0; S < 2; ++S) {
          float v[8];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            v[j] = o[mt][4 * S + j][2 * i] * f;
            v[4 + j] = o[mt][4 * S + j][2 * i + 1] * f;
          }
          const int d0 = col0 + 32 * S + 8 * (lane % 4);
          if (whole) {
            auto* out = static_cast<__nv_bfloat16*>(p.out) + ((int64_t(bs) * p.h_q + h) * kKvLoraRank + d0);
            *reinterpret_cast<uint4*>(out) = make_uint4(sm80::pack2<__nv_bfloat16>(v[0], v[1]), sm80::pack2<__nv_bfloat16>(v[2], v[3]),
                                                        sm80::pack2<__nv_bfloat16>(v[4], v[5]), sm80::pack2<__nv_bfloat16>(v[6], v[7]));
          } else {
            const int64_t row = work.partial_row0 + h;
            float4* out = reinterpret_cast<float4*>(p.partial_out + row * kKvLoraRank + d0);
            out[0] = make_float4(v[0], v[1], v[2], v[3]);
            out[1] = make_float4(v[4], v[5], v[6], v[7]);
          }
        }
        if (lse_writer) {
          if (whole) p.lse[(int64_t(b) * p.h_q + h) * p.s_q + s] = lse;
          else p.partial_lse[work.partial_row0 + h] = lse;
        }
      } else if (whole) {
        auto* out = static_cast<__nv_bfloat16*>(p.out) + ((int64_t(bs) * p.h_q + h) * kKvLoraRank + out_col0);
#pragma unroll
        for (int n = 0; n < Cfg::kOTiles; ++n) {
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * n) = __floats2bfloat162_rn(o[mt][n][2 * i] * f, o[mt][n][2 * i + 1] * f);
        }
        if (lse_writer) p.lse[(int64_t(b) * p.h_q + h) * p.s_q + s] = lse;
      } else {
        const int64_t row = work.partial_row0 + h;
        float* out = p.partial_out + row * kKvLoraRank + out_col0;
#pragma unroll
        for (int n = 0; n < Cfg::kOTiles; ++n) {
          *reinterpret_cast<float2*>(out + 8 * n) = make_float2(o[mt][n][2 * i] * f, o[mt][n][2 * i + 1] * f);
        }
        if (lse_writer) p.partial_lse[row] = lse;
      }
    }
  }
}

template <int kM, CacheFormat kFormat, int kStages, bool kE4m3Frags = false, int kRowThreads = 8, bool kBulkRows = false,
          int kCopyWarps = 0, bool kPvRaw = false>
void launch_sparse_decode_portable(const SparseDecodeParams& p) {
  using Cfg = PortableConfig<kM, kFormat, kStages, kE4m3Frags, kRowThreads, kBulkRows, kCopyWarps, kPvRaw>;
  auto kernel = sparse_decode_portable_kernel<Cfg>;
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  opt_in_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, device);
  launch_dependent(kernel, dim3((p.h_q + kM - 1) / kM, 1, sparse_grid_z(p)), dim3(Cfg::kLaunchThreads), Cfg::kSmemBytes,
                   p.stream, p);
}

template <int kM, CacheFormat kFormat, int kStages>
constexpr int portable_smem_bytes() {
  return PortableConfig<kM, kFormat, kStages>::kSmemBytes;
}

}  // namespace mla::sparse
