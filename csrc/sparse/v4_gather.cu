// V4 sparse decode gather (v4_decode.h): one warp per gathered entry and per query row, lane l
// owning elements [16 l, 16 l + 16) of the 512: a 32-byte piece of a bf16 row, or (fp8_ds_mla,
// lanes 0-27) 16 e4m3 bytes of the token's data part times the UE8M0 scale of its 64-dim tile
// (exact in fp32 and in bf16 for every scale a writer makes; byte 0xFF: NaN), lanes 28-31 the bf16
// RoPE dims. Lanes 0-7 write the 64 zero dims. Entry validity is the V3 rule: 0 <= slot <
// num_slots and a position below the list's length (a length past the list counts all of it).
#include <cuda_bf16.h>

#include <algorithm>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/e4m3.cuh"
#include "sparse/v4_decode.h"

namespace mla {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kWideBytes = 576 * 2;  // a widened bf16 row
constexpr int kNopeLanes = 448 / 16;

template <bool kVec>
__device__ __forceinline__ uint4 load16(const uint8_t* src) {
  if constexpr (kVec) return *reinterpret_cast<const uint4*>(src);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = src[4 * i] | (src[4 * i + 1] << 8) | (src[4 * i + 2] << 16) | (uint32_t(src[4 * i + 3]) << 24);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <bool kVec, bool kDsMla>
__global__ void __launch_bounds__(kThreads) v4_gather_kernel(const __grid_constant__ V4GatherParams p) {
  const int lane = threadIdx.x % 32;
  const int total_topk = p.pool[0].topk + p.pool[1].topk;
  const int64_t tokens = int64_t(p.b) * p.s_q;
  const int64_t num_entries = tokens * total_topk, num_items = num_entries + tokens * p.h_q;
  const int64_t num_warps = int64_t(gridDim.x) * kWarps;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (int64_t item = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; item < num_items; item += num_warps) {
    uint4 piece[2];
    uint8_t* dst;
    if (item >= num_entries) {  // a query row: q then 64 zeros
      const int64_t r = item - num_entries;
      const int64_t t = r / p.h_q, h = r % p.h_q;
      const uint8_t* src = reinterpret_cast<const uint8_t*>(static_cast<const __nv_bfloat16*>(p.q) + (t / p.s_q) * p.stride_q_b +
                                                            (t % p.s_q) * p.stride_q_s + h * p.stride_q_h) + 32 * lane;
      piece[0] = load16<kVec>(src);
      piece[1] = load16<kVec>(src + 16);
      dst = static_cast<uint8_t*>(p.q_wide) + r * kWideBytes;
    } else {
      const int64_t t = item / total_topk;
      const int k = static_cast<int>(item % total_topk);
      const int sel = k < p.pool[0].topk ? 0 : 1;
      const V4Pool& pool = p.pool[sel];
      const int kk = sel == 0 ? k : k - p.pool[0].topk;
      const int64_t bi = t / p.s_q, s = t % p.s_q;
      const int64_t slot = pool.indices[bi * pool.stride_indices_b + s * pool.stride_indices_s + kk];
      const int length = pool.lengths != nullptr ? pool.lengths[bi] : pool.topk;
      const bool valid = kk < length && slot >= 0 && slot < pool.num_slots;
      if (lane == 0) p.row_index[item] = valid ? static_cast<int32_t>(item) : -1;
      if (!valid) continue;  // warp-uniform
      const int64_t block = slot / pool.block_size, offset = slot % pool.block_size;
      const uint8_t* page = static_cast<const uint8_t*>(pool.cache) + block * pool.stride_block_bytes;
      if constexpr (!kDsMla) {
        const uint8_t* src = page + offset * pool.stride_token_bytes + 32 * lane;
        piece[0] = load16<kVec>(src);
        piece[1] = load16<kVec>(src + 16);
      } else {
        const uint8_t* data = page + offset * 576;
        if (lane < kNopeLanes) {
          const uint4 raw = load16<kVec>(data + 16 * lane);
          const float scale = e4m3::ue8m0_to_float(page[pool.block_size * 576 + offset * 8 + lane / 4]);
          piece[0] = e4m3::x8_scaled_to_bf16x8(make_uint2(raw.x, raw.y), scale);
          piece[1] = e4m3::x8_scaled_to_bf16x8(make_uint2(raw.z, raw.w), scale);
        } else {
          const uint8_t* src = data + 448 + 32 * (lane - kNopeLanes);
          piece[0] = load16<kVec>(src);
          piece[1] = load16<kVec>(src + 16);
        }
      }
      dst = static_cast<uint8_t*>(p.rows) + item * kWideBytes;
    }
    // The destinations are fresh 16-byte aligned allocations.
    reinterpret_cast<uint4*>(dst)[2 * lane] = piece[0];
    reinterpret_cast<uint4*>(dst)[2 * lane + 1] = piece[1];
    if (lane < 8) reinterpret_cast<uint4*>(dst + 1024)[lane] = zero;
  }
}

}  // namespace

void run_v4_gather(const V4GatherParams& p) {
  const int64_t tokens = int64_t(p.b) * p.s_q;
  const int64_t items = tokens * (p.pool[0].topk + p.pool[1].topk) + tokens * p.h_q;
  if (items == 0) return;
  // 16-byte loads need q's rows, both caches and their strides 16-byte aligned (fp8_ds_mla pages
  // are multiples of 576 bytes apart); anything else reads byte by byte.
  bool vec = aligned16(p.q) && p.stride_q_b % 8 == 0 && p.stride_q_s % 8 == 0 && p.stride_q_h % 8 == 0;
  for (const V4Pool& pool : p.pool) {
    if (pool.topk == 0) continue;
    vec = vec && aligned16(pool.cache) && pool.stride_block_bytes % 16 == 0 && (p.ds_mla || pool.stride_token_bytes % 16 == 0);
  }
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  const int64_t blocks = std::min<int64_t>((items + kWarps - 1) / kWarps, int64_t(device_info(device).num_sms) * 8);
  MLA_BOOL_SWITCH(vec, kVec, [&] {
    MLA_BOOL_SWITCH(p.ds_mla, kDsMla, [&] {
      v4_gather_kernel<kVec, kDsMla><<<static_cast<unsigned>(blocks), kThreads, 0, p.stream>>>(p);
      MLA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mla
