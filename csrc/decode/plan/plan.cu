// Decode planner: seq_lens -> schedule, on the GPU (no host sync, CUDA-graph capturable).
//
// Cost model (in 64-key tiles): a request of n tiles costs n + kPlanOverheadTiles, the overhead
// standing for loading Q, filling the pipeline and writing the result of one piece. Every part
// gets a budget of ceil(total / num_parts) + overhead and is filled greedily in request order: it
// finishes requests while they fit and cuts the next one where its budget runs out (the cut
// request becomes "split"). The last part takes whatever is left, so every tile is covered
// exactly once for any seq_lens. Each part ends with at most one cut, so the pieces of split
// requests number at most (num_parts - 1) + (split requests) <= num_parts + min(b, num_parts)
// (max_partials_for). The split requests are also listed, in order, in the kSplitReq field of
// rows 0, 1, ... (-1 after the last), so combine visits exactly them.
//
// The schedule has num_parts rows, so its size tells the decode binding how many parts to launch
// and how many partial slots to allocate: a plan made for another s_q / h_q / format is still
// computed correctly (only less evenly balanced).
//
// One CTA: the total is a block reduction; the walk itself is sequential in thread 0 (b <= a few
// thousand, a few microseconds, once per decode step).
#include "decode/decode.h"

#include "common/cuda_check.h"

namespace mla::decode {
namespace {

constexpr int kPlanThreads = 256;
// The sequential walk reads each request's tile count and writes its split count from shared
// memory (a dependent global load per step would make the walk ~10x slower); batches beyond
// this fall back to global memory for the rest.
constexpr int kPlanCachedReqs = 4096;

// Written so that seq_len near INT32_MAX does not overflow ((seq_len + 63) / 64 would).
__device__ __forceinline__ int num_tiles(int seq_len) {
  return seq_len > 0 ? seq_len / kBlockN + (seq_len % kBlockN != 0) : 0;
}

__global__ void __launch_bounds__(kPlanThreads) decode_plan_kernel(const __grid_constant__ PlanParams p) {
  __shared__ long long warp_sums[kPlanThreads / 32];
  __shared__ int tiles_cache[kPlanCachedReqs];
  __shared__ int splits_cache[kPlanCachedReqs];
  long long cost = 0;
  for (int i = threadIdx.x; i < p.b; i += kPlanThreads) {
    const int n = num_tiles(p.seq_lens[i]);
    if (i < kPlanCachedReqs) tiles_cache[i] = n;
    cost += n + kPlanOverheadTiles;
  }
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) cost += __shfl_xor_sync(0xffffffffu, cost, m);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = cost;
  __syncthreads();
  if (threadIdx.x != 0) return;
  long long total = 0;
  for (int w = 0; w < kPlanThreads / 32; ++w) total += warp_sums[w];
  const long long payload = (total + p.num_parts - 1) / p.num_parts + kPlanOverheadTiles;

  int req = 0, tile = 0, split = 0;  // next unassigned tile, and its piece's split index
  int num_split_reqs = 0;
  for (int part = 0; part < p.num_parts; ++part) {
    int32_t* s = p.schedule + part * kScheduleFields;
    s[kBeginReq] = req;
    s[kBeginTile] = tile;
    s[kBeginSplit] = split;
    int end_req = req - 1, end_tile = 0;  // empty unless something is taken below
    const bool last = part == p.num_parts - 1;
    long long budget = payload;
    while (req < p.b) {
      const int n = req < kPlanCachedReqs ? tiles_cache[req] : num_tiles(p.seq_lens[req]);
      const long long rest = n - tile;
      if (last || rest + kPlanOverheadTiles <= budget) {
        // Finish this request here.
        budget -= rest + kPlanOverheadTiles;
        p.split_info[req * kSplitInfoFields + 0] = split + 1;
        if (req < kPlanCachedReqs) splits_cache[req] = split + 1;
        end_req = req;
        end_tile = n;
        ++req;
        tile = 0;
        split = 0;
        if (!last && budget <= kPlanOverheadTiles) break;
      } else {
        // Cut it: take what the budget allows (at least one tile, so the walk progresses).
        const long long take = budget - kPlanOverheadTiles;
        if (take <= 0) break;
        // Its first cut: list it for combine (row num_split_reqs <= part is already written).
        if (split == 0) p.schedule[num_split_reqs++ * kScheduleFields + kSplitReq] = req;
        tile += static_cast<int>(take);
        end_req = req;
        end_tile = tile;
        ++split;
        break;
      }
    }
    s[kEndReq] = end_req;
    s[kEndTile] = end_tile;
    for (int f = kSplitReq + 1; f < kScheduleFields; ++f) s[f] = 0;
  }
  for (int part = num_split_reqs; part < p.num_parts; ++part) p.schedule[part * kScheduleFields + kSplitReq] = -1;
  // Partial-result slots, only for requests that were split.
  int base = 0;
  for (int i = 0; i < p.b; ++i) {
    const int n = i < kPlanCachedReqs ? splits_cache[i] : p.split_info[i * kSplitInfoFields + 0];
    p.split_info[i * kSplitInfoFields + 1] = n > 1 ? base : -1;
    if (n > 1) base += n;
  }
}

}  // namespace

void run_decode_plan(const PlanParams& p) {
  MLA_HOST_CHECK(p.num_parts >= 1 && p.b >= 1, "decode plan needs num_parts >= 1 and b >= 1");
  decode_plan_kernel<<<1, kPlanThreads, 0, p.stream>>>(p);
  MLA_CHECK_LAUNCH();
}

}  // namespace mla::decode
