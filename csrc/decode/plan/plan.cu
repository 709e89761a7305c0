// Decode planner: seq_lens -> schedule, on the GPU (no host sync, CUDA-graph capturable), one
// small kernel of one CTA. mla_ext/reference.py (decode_plan) is the same algorithm on the CPU;
// the two must give identical plans.
//
// Cost model (in 64-key tiles): request r costs n_r + kPlanOverheadTiles, the overhead standing
// for loading Q, filling the pipeline and writing the result. Lay the requests end to end in cost
// space: request r occupies [C_r, C_{r+1}) with C the exclusive prefix sum of the costs, its
// overhead first ([C_r, C_r + O)), then tile k at C_r + O + k; the total is T = C_b. The P parts
// of the schedule cut this line at the P + 1 boundaries
//     B_p = floor(p * T / U),  p = 0 .. U  (U = min(P, T): every boundary distinct),
// so every part gets an even share of the work however the lengths vary; parts U .. P - 1 (only
// when T < P) are empty. A boundary x inside request r maps to the cut (r, t): tiles below t go to
// the earlier part, with t = x - C_r - O when x lies past the overhead (an interior cut: the request
// is split there), else t = 0 (the whole request goes to the later part). So:
//   * every tile is covered exactly once (the cuts are ordered and partition the tiles);
//   * a request of n tiles has 1 + |{p : B_p in [C_r + O + 1, C_{r+1} - 1]}| pieces, counted
//     without walking: with first(y) = ceil(y * U / T), the smallest p with B_p >= y, that is
//     1 + max(0, first(C_{r+1}) - first(C_r + O + 1)); a piece that starts at an interior cut of
//     part p is split number p - first(C_r + O + 1) + 1 of its request;
//   * a part ends with at most one interior cut, so the pieces of split requests number at most
//     (U - 1) + (split requests) <= P + min(b, P) (max_partials_for); a part may be empty
//     (begin_req > end_req: both its boundaries fall in one overhead), a piece never is, except
//     the one piece of a request with no tiles (it writes out 0, lse -inf).
// The split requests are listed, in order, in the kSplitReq field of rows 0, 1, ... (-1 after
// the last one), so combine visits exactly them; split_info[r] = (pieces, first partial slot, or
// -1 when not split), the slots numbered in request order.
//
// The schedule has P rows, so its size tells the decode binding how many parts to launch and how
// many partial slots to allocate: a plan made for another s_q / h_q / format is still computed
// correctly (only less evenly balanced).
//
// Kernel: one CTA of up to 1024 threads, each holding kItems consecutive requests of a chunk of
// blockDim.x * kItems. Pass 1 sums the costs (T). Pass 2, per chunk: a block-wide exclusive scan
// gives C_r (kept in shared memory for the chunk), each thread writes its requests' split_info
// (a second scan numbers the split requests and their slots), then the parts whose first boundary
// falls in the chunk find their cut by binary search over the chunk's C. A b of 256 is one chunk
// of 64 threads x 4; b = 65535 takes 16 chunks of 4096.
#include "decode/decode.h"

#include "common/cuda_check.h"

namespace mla::decode {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMinThreads = 64;
constexpr int kItems = 4;  // consecutive requests per thread
constexpr int kMaxChunk = kMaxThreads * kItems;
constexpr unsigned kFullMask = 0xffffffffu;

using i64 = long long;

// Written so that seq_len near INT32_MAX does not overflow ((seq_len + 63) / 64 would).
__device__ __forceinline__ int num_tiles(int seq_len) { return seq_len > 0 ? key_tiles(seq_len) : 0; }

// Exclusive prefix sum of v over the block in thread order; *sum gets the block's total. warp_buf
// holds 32 values; the trailing barrier lets the caller reuse it (and publishes the caller's
// shared-memory writes made before the call).
__device__ __forceinline__ i64 block_exclusive_scan(i64 v, i64* warp_buf, i64* sum) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  i64 x = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const i64 y = __shfl_up_sync(kFullMask, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_buf[warp] = x;
  __syncthreads();
  if (warp == 0) {
    i64 w = lane < num_warps ? warp_buf[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const i64 y = __shfl_up_sync(kFullMask, w, d);
      if (lane >= d) w += y;
    }
    if (lane < num_warps) warp_buf[lane] = w;  // inclusive prefix of the warp totals
  }
  __syncthreads();
  const i64 before = (warp > 0 ? warp_buf[warp - 1] : 0) + x - v;
  *sum = warp_buf[num_warps - 1];
  __syncthreads();
  return before;
}

__global__ void __launch_bounds__(kMaxThreads) decode_plan_kernel(const __grid_constant__ PlanParams p) {
  // prefix[i + 1] = C_{c0 + i} for the chunk's requests, prefix[0] = C_{c0 - 1}.
  __shared__ i64 prefix[kMaxChunk + 1];
  __shared__ i64 warp_buf[32];
  constexpr int O = kPlanOverheadTiles;
  const int tid = threadIdx.x, chunk = blockDim.x * kItems;

  // ---- pass 1: the total cost T (the first chunk's tile counts stay in registers).
  int tiles0[kItems];
  i64 mine = 0;
  for (int c0 = 0; c0 < p.b; c0 += chunk) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int r = c0 + tid * kItems + k;
      const int n = r < p.b ? num_tiles(p.seq_lens[r]) : 0;
      if (c0 == 0) tiles0[k] = n;
      mine += r < p.b ? n + O : 0;
    }
  }
  i64 total;
  block_exclusive_scan(mine, warp_buf, &total);
  const i64 used = total < p.num_parts ? total : p.num_parts;  // U >= 1: every request costs >= O
  // first(y): the smallest p with B_p >= y, for 0 <= y <= T (y * U < 2^63: T < 2^16 * 2^26, U <= 2^12).
  auto first = [&](i64 y) { return (y * used + total - 1) / total; };

  // ---- pass 2, per chunk.
  i64 chunk_begin = 0, before_begin = 0;  // C_{c0} and C_{c0 - 1}
  i64 slots_before = 0, splits_before = 0;  // partial slots and split requests of earlier chunks
  for (int c0 = 0; c0 < p.b; c0 += chunk) {
    const int n_here = min(chunk, p.b - c0);
    int tiles[kItems];
    i64 cost = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int r = c0 + tid * kItems + k;
      tiles[k] = c0 == 0 ? tiles0[k] : r < p.b ? num_tiles(p.seq_lens[r]) : 0;
      cost += r < p.b ? tiles[k] + O : 0;
    }
    i64 chunk_cost;
    i64 c = chunk_begin + block_exclusive_scan(cost, warp_buf, &chunk_cost);

    // This thread's requests: C_r into shared memory, their piece counts, and (second scan) the
    // numbering of split requests and of their partial slots, packed as slots << 32 | splits.
    int pieces[kItems];
    i64 packed = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int i = tid * kItems + k;
      pieces[k] = 1;
      if (i < n_here) {
        prefix[i + 1] = c;
        const i64 next = c + tiles[k] + O;
        const i64 interior = first(next) - first(c + O + 1);
        pieces[k] = interior > 0 ? 1 + static_cast<int>(interior) : 1;
        if (pieces[k] > 1) packed += (i64(pieces[k]) << 32) + 1;
        c = next;
      }
    }
    if (tid == 0) prefix[0] = before_begin;
    i64 packed_sum;
    const i64 packed_before = block_exclusive_scan(packed, warp_buf, &packed_sum);  // also publishes prefix[]
    i64 slot = slots_before + (packed_before >> 32), list = splits_before + (packed_before & 0xffffffff);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int r = c0 + tid * kItems + k;
      if (r >= p.b) continue;
      p.split_info[r * kSplitInfoFields + 0] = pieces[k];
      p.split_info[r * kSplitInfoFields + 1] = pieces[k] > 1 ? static_cast<int>(slot) : -1;
      if (pieces[k] > 1) {
        p.schedule[list * kScheduleFields + kSplitReq] = r;
        slot += pieces[k];
        ++list;
      }
    }

    // Parts whose first boundary B_p lies in this chunk, [C_{c0}, C_{c1}): find its request by
    // binary search, write the part's begin and the previous part's end.
    const i64 chunk_end = chunk_begin + chunk_cost;
    const i64 part_end = min(first(chunk_end), used);
    for (i64 part = first(chunk_begin) + tid; part < part_end; part += blockDim.x) {
      const i64 x = part * total / used;
      int lo = 0, hi = n_here - 1;  // the last i with C_{c0 + i} <= x (i = 0 holds: x >= C_{c0})
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (prefix[mid + 1] <= x) lo = mid; else hi = mid - 1;
      }
      const int r = c0 + lo;
      const i64 at = prefix[lo + 1];
      const int t = x - at > O ? static_cast<int>(x - at - O) : 0;
      int32_t* s = p.schedule + part * kScheduleFields;
      s[kBeginReq] = r;
      s[kBeginTile] = t;
      s[kBeginSplit] = t > 0 ? static_cast<int>(part - first(at + O + 1) + 1) : 0;
#pragma unroll
      for (int f = kSplitReq + 1; f < kScheduleFields; ++f) s[f] = 0;
      if (part > 0) {
        // The previous part ends at this cut: inside request r, or after all of request r - 1
        // (r = 0 only for an empty part: both its boundaries lie in request 0's overhead).
        int32_t* e = s - kScheduleFields;
        e[kEndReq] = t > 0 ? r : r - 1;
        e[kEndTile] = t > 0 ? t : r > 0 ? static_cast<int>(at - prefix[lo] - O) : 0;
      }
    }

    slots_before += packed_sum >> 32;
    splits_before += packed_sum & 0xffffffff;
    before_begin = prefix[n_here];
    chunk_begin = chunk_end;
    __syncthreads();  // the next chunk rewrites prefix[]
  }

  // ---- the tail: part U - 1 ends with the last request; parts U .. P - 1 are empty; the split
  // list ends with -1.
  const int last_tiles = static_cast<int>(chunk_begin - before_begin - O);
  for (int part = static_cast<int>(used) - 1 + tid; part < p.num_parts; part += blockDim.x) {
    int32_t* s = p.schedule + part * kScheduleFields;
    if (part >= used) {
      s[kBeginReq] = p.b;
      s[kBeginTile] = 0;
      s[kBeginSplit] = 0;
#pragma unroll
      for (int f = kSplitReq + 1; f < kScheduleFields; ++f) s[f] = 0;
    }
    s[kEndReq] = p.b - 1;
    s[kEndTile] = part == used - 1 ? last_tiles : 0;
  }
  for (int row = static_cast<int>(splits_before) + tid; row < p.num_parts; row += blockDim.x) {
    p.schedule[row * kScheduleFields + kSplitReq] = -1;
  }
}

}  // namespace

void run_decode_plan(const PlanParams& p) {
  MLA_HOST_CHECK(p.num_parts >= 1 && p.num_parts <= kPlanMaxParts && p.b >= 1 && p.b <= kPlanMaxBatch,
                 "decode plan needs 1 <= num_parts <= 4096 and 1 <= b <= 65535");
  // Threads for one chunk of kItems requests each (fewer for a small batch: each barrier waits for
  // every warp), a multiple of the warp size.
  const int want = (p.b + kItems - 1) / kItems;
  const int threads = want >= kMaxThreads ? kMaxThreads : want <= kMinThreads ? kMinThreads : (want + 31) / 32 * 32;
  decode_plan_kernel<<<1, threads, 0, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

}  // namespace mla::decode
