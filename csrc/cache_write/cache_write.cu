// concat_and_cache_mla kernel.
//
// Grid mapping: one warp per token at a time; 8 warps per CTA; a persistent grid of
// kBlocksPerSm CTAs per SM, each warp striding over tokens (token += all warps in the grid).
// Memory-bound, so what matters is bytes in flight: each warp keeps kStages tokens' inputs in
// flight with cp.async into shared memory (no registers held while they land) and converts and
// stores the oldest. Inputs that are not 16-byte aligned take a byte-wise path with one token of
// register prefetch. (Register prefetch on the vector path too reached 0.75-0.89 of the copy
// bandwidth at 40 warps/SM; two tokens unrolled per warp took 81 registers and ran slower.)
// Every lane owns the same elements of a token in every format, so each warp-wide access is
// one contiguous, coalesced span (an earlier mapping of 16 consecutive elements per lane made
// every load instruction touch twice the sectors it used):
//   kv_c elements [8 lane, 8 lane + 8) and [256 + 8 lane, 256 + 8 lane + 8) (16 B loads),
//   k_pe elements 2 lane, 2 lane + 1 (4 B).
// Rows written:
//   auto       (1152 B): the same 16 B and 4 B pieces, copied.
//   fp8        (576 B):  8 e4m3 bytes per kv_c piece, 2 for k_pe.
//   fp8_ds_mla (656 B):  8 e4m3 bytes per kv_c piece; 128-element tile t is piece (t % 2) of
//                        lanes 16 (t / 2)..16 (t / 2) + 15, whose amax is reduced by shuffles;
//                        lane 0 writes the four fp32 scales as one 16 B store; k_pe as bf16.
// Memory-bound (bytes = inputs read + rows written); see bench/results/cache_write.md.
#include "cache_write/cache_write.h"

#include <algorithm>
#include <type_traits>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/sm80.cuh"
#include "common/vec.cuh"
#include "cache_write/tile_scale.cuh"

namespace mla {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int kStages = 4;       // tokens per warp in flight (vector path), 1408 B of smem each
constexpr int kBlocksPerSm = 4;  // 45 KB of stages per CTA: 4 CTAs (32 warps, 128 tokens) per SM

// Correctly rounded x / s without IEEE division (a call of ~40 instructions per element that
// made the fp8 write instruction-bound). Markstein's theorem: with y = RN(1/s) and q = RN(x * y)
// within 1 ulp of x / s, the residual e = x - q * s is exact in one fma and RN(q + e * y) is the
// correctly rounded quotient, barring overflow and underflow. Those do not matter here because
// the result is rounded on to e4m3, where quotients past 448 saturate and quotients below 2^-10
// become a zero of the quotient's sign:
//  - an overflowing (or infinite) quotient q makes the residual NaN; then q itself is returned
//    and saturates (a NaN x gives a NaN q and stays NaN);
//  - the result takes q's sign (copysign), so -0 / s stays -0 (the fmas would give +0).
// A divisor whose reciprocal is not a normal float (|s| > 2^126 or < 2^-126) breaks the premise:
// both x and s are then pre-scaled by 2^-+64, exact unless x underflows or overflows, which only
// happens when the quotient is far below or above the e4m3 range anyway. A power-of-two divisor
// (1.0 when the cache is uncalibrated) needs only the multiply by its exact reciprocal.
struct Divisor {
  float pre;   // 2^-64, 1 or 2^64
  float s;     // divisor * pre
  float y;     // RN(1 / s)
  bool exact;  // s is a power of two: x * y == x / s
};
__device__ __forceinline__ Divisor make_divisor(float divisor) {
  const float a = fabsf(divisor);
  const float pre = a > 0x1p126f ? 0x1p-64f : (a < 0x1p-126f ? 0x1p64f : 1.0f);
  const float s = divisor * pre;
  return Divisor{pre, s, 1.0f / s, (__float_as_uint(s) & 0x7fffffu) == 0};
}
__device__ __forceinline__ float div_markstein(float x, float s, float y) {
  const float q = __fmul_rn(x, y);
  const float r = __fmaf_rn(__fmaf_rn(-q, s, x), y, q);
  return copysignf(r == r ? r : q, q);
}
// x[i] / d for one lane's elements; the branches are uniform across the grid.
template <int N>
__device__ __forceinline__ void divide(float (&x)[N], const Divisor& d) {
  if (d.exact) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = __fmul_rn(__fmul_rn(x[i], d.pre), d.y);
  } else if (d.pre == 1.0f) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = div_markstein(x[i], d.s, d.y);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = div_markstein(__fmul_rn(x[i], d.pre), d.s, d.y);
  }
}

// Small (8-, 4- and 2-byte) accesses with the same aligned/byte-wise switch as load16/store16.
template <bool kVec>
__device__ __forceinline__ uint32_t load4(const void* src) {
  if constexpr (kVec) return *static_cast<const uint32_t*>(src);
  const uint8_t* b = static_cast<const uint8_t*>(src);
  return b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
}
template <bool kVec, typename T>
__device__ __forceinline__ void store_small(void* dst, T v) {
  if constexpr (kVec) {
    *static_cast<T*>(dst) = v;
  } else if constexpr (std::is_same_v<T, uint2>) {
    store_small<false>(dst, v.x);
    store_small<false>(static_cast<uint8_t*>(dst) + 4, v.y);
  } else {
#pragma unroll
    for (int i = 0; i < int(sizeof(T)); ++i) static_cast<uint8_t*>(dst)[i] = uint8_t(uint64_t(v) >> (8 * i));
  }
}

// The two 16-bit k_pe elements a lane owns, as floats.
template <typename scalar_t>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  const scalar_t* e = reinterpret_cast<const scalar_t*>(&v);
  return make_float2(to_float(e[0]), to_float(e[1]));
}

// What one lane holds of one token between the load and the store phase.
struct LaneToken {
  Bytes16 kv_c[2];  // elements [8 lane, 8 lane + 8) and [256 + 8 lane, 256 + 8 lane + 8)
  uint32_t k_pe;    // elements 2 lane, 2 lane + 1
  uint8_t* row;     // destination row, nullptr when the token is skipped (warp-uniform)
};

// The destination row of a slot, or nullptr for padding (< 0) and out-of-range slots.
__device__ __forceinline__ uint8_t* row_for_slot(const CacheWriteParams& p, int64_t slot) {
  if (slot < 0 || slot >= p.num_slots) return nullptr;  // padding, or out of range: never write
  // 64-bit division is a ~70-instruction subroutine, issued once per token by every lane; the
  // 32-bit one is a few instructions. The branch is uniform (the cache's size).
  int64_t block, offset;
  if (p.num_slots <= int64_t(UINT32_MAX)) {
    const uint32_t s32 = static_cast<uint32_t>(slot), bs32 = static_cast<uint32_t>(p.block_size);
    block = s32 / bs32;
    offset = s32 - static_cast<uint32_t>(block) * bs32;
  } else {
    block = slot / p.block_size;
    offset = slot - block * p.block_size;
  }
  return static_cast<uint8_t*>(p.kv_cache) + block * p.stride_cache_block_bytes + offset * p.stride_cache_token_bytes;
}

// Byte-wise path: the loads of one token into registers.
template <typename scalar_t>
__device__ __forceinline__ LaneToken load_token_bytewise(const CacheWriteParams& p, int64_t token, int lane) {
  LaneToken t{};
  t.row = token < p.num_tokens ? row_for_slot(p, p.slot_mapping[token]) : nullptr;
  if (t.row == nullptr) return t;
  const auto* kv_c = static_cast<const scalar_t*>(p.kv_c) + token * p.stride_kv_c_token;
  const auto* k_pe = static_cast<const scalar_t*>(p.k_pe) + token * p.stride_k_pe_token;
  t.kv_c[0] = load16<false>(kv_c + 8 * lane);
  t.kv_c[1] = load16<false>(kv_c + kKvLoraRank / 2 + 8 * lane);
  t.k_pe = load4<false>(k_pe + 2 * lane);
  return t;
}

// Vector path: one token's inputs, staged by cp.async. Each lane reads back only what it copied
// itself, so the stage needs no warp synchronisation, only cp.async.wait_group.
struct alignas(16) TokenStage {
  uint4 kv_c[2][32];  // [piece][lane]
  uint32_t k_pe[32];
  int64_t slot[32];   // every lane keeps its own copy of the token's slot
};
static_assert(sizeof(TokenStage) == 1408);

template <typename scalar_t>
__device__ __forceinline__ void issue_token_copy(const CacheWriteParams& p, int64_t token, TokenStage& st, int lane) {
  if (token < p.num_tokens) {
    const auto* kv_c = static_cast<const scalar_t*>(p.kv_c) + token * p.stride_kv_c_token;
    const auto* k_pe = static_cast<const scalar_t*>(p.k_pe) + token * p.stride_k_pe_token;
    sm80::cp_async16(sm80::smem_addr(&st.kv_c[0][lane]), kv_c + 8 * lane, true);
    sm80::cp_async16(sm80::smem_addr(&st.kv_c[1][lane]), kv_c + kKvLoraRank / 2 + 8 * lane, true);
    sm80::cp_async_ca<4>(sm80::smem_addr(&st.k_pe[lane]), k_pe + 2 * lane);
    sm80::cp_async_ca<8>(sm80::smem_addr(&st.slot[lane]), p.slot_mapping + token);
  }
  sm80::cp_async_commit();  // an empty group past the end keeps the wait counts uniform
}

template <typename scalar_t, CacheFormat kFormat, bool kVec>
__device__ __forceinline__ void store_token(const LaneToken& t, const Divisor& d, int lane) {
  constexpr int kHalf = kKvLoraRank / 2;  // offset of a lane's second kv_c piece
  if constexpr (kFormat == CacheFormat::kAuto) {
    // Plain copy, no conversion.
    scalar_t* out = reinterpret_cast<scalar_t*>(t.row);
    store16<kVec>(out + 8 * lane, t.kv_c[0]);
    store16<kVec>(out + kHalf + 8 * lane, t.kv_c[1]);
    store_small<kVec>(out + kKvLoraRank + 2 * lane, t.k_pe);
  } else {
    float x[2][8];
    unpack8<scalar_t>(t.kv_c[0], x[0]);
    unpack8<scalar_t>(t.kv_c[1], x[1]);
    const float2 r = unpack2<scalar_t>(t.k_pe);
    if constexpr (kFormat == CacheFormat::kFp8) {
      // Per-tensor scale, k_pe quantised like kv_c, each element x / scale rounded exactly as
      // IEEE division would (see div_markstein), which is what the reference computes.
      float pe[2] = {r.x, r.y};
      divide(x[0], d);
      divide(x[1], d);
      divide(pe, d);
#pragma unroll
      for (int h = 0; h < 2; ++h) store_small<kVec>(t.row + h * kHalf + 8 * lane, quantize8_e4m3(x[h], 1.0f));
      store_small<kVec>(t.row + kKvLoraRank + 2 * lane, float2_to_e4m3x2(pe[0], pe[1]));
    } else {
      static_assert(kFormat == CacheFormat::kFp8DsMla);
      float scale[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float amax = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[h][i]));
        // A tile's 128 elements are this piece of 16 consecutive lanes.
#pragma unroll
        for (int mask = 8; mask >= 1; mask /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
        scale[h] = ds_mla_tile_scale(amax);
        store_small<kVec>(t.row + h * kHalf + 8 * lane, quantize8_e4m3(x[h], scale[h]));
      }
      // Tiles 0..3 = (piece 0, lanes 0-15), (piece 0, lanes 16-31), (piece 1, ...), (piece 1, ...).
      const float upper0 = __shfl_sync(0xffffffffu, scale[0], 16);
      const float upper1 = __shfl_sync(0xffffffffu, scale[1], 16);
      if (lane == 0) {
        Bytes16 scales;
        scales.v = make_uint4(__float_as_uint(scale[0]), __float_as_uint(upper0), __float_as_uint(scale[1]),
                              __float_as_uint(upper1));
        store16<kVec>(t.row + kDsMlaScaleOffset, scales);
      }
      // k_pe stays 16-bit, as bf16 (a plain copy for bf16 input).
      uint32_t pe = t.k_pe;
      if constexpr (!std::is_same_v<scalar_t, __nv_bfloat16>) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(r.x, r.y);
        pe = *reinterpret_cast<const uint32_t*>(&b);
      }
      store_small<kVec>(t.row + kDsMlaRopeOffset + 4 * lane, pe);
    }
  }
}

template <typename scalar_t, CacheFormat kFormat, bool kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    concat_and_cache_mla_kernel(const __grid_constant__ CacheWriteParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t stride = int64_t(gridDim.x) * kWarpsPerBlock;
  int64_t token = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  // The fp8 per-tensor divisor, read and prepared once per thread.
  Divisor d{};
  if constexpr (kFormat == CacheFormat::kFp8) d = make_divisor(*p.scale);

  if constexpr (kVec) {
    // kStages tokens per warp in flight through cp.async, without holding registers.
    __shared__ TokenStage stages[kWarpsPerBlock][kStages];
    TokenStage* my = stages[threadIdx.x / 32];
#pragma unroll
    for (int s = 0; s < kStages; ++s) issue_token_copy<scalar_t>(p, token + s * stride, my[s], lane);
    for (int k = 0; token < p.num_tokens; token += stride, k = (k + 1) % kStages) {
      sm80::cp_async_wait<kStages - 1>();
      LaneToken t;
      t.row = row_for_slot(p, my[k].slot[lane]);
      if (t.row != nullptr) {
        t.kv_c[0].v = my[k].kv_c[0][lane];
        t.kv_c[1].v = my[k].kv_c[1][lane];
        t.k_pe = my[k].k_pe[lane];
        store_token<scalar_t, kFormat, kVec>(t, d, lane);
      }
      // Refill the stage only after its values were consumed (the global stores above use them).
      issue_token_copy<scalar_t>(p, token + kStages * stride, my[k], lane);
    }
  } else {
    // Byte-wise (unaligned) inputs: one token of register prefetch.
    LaneToken current = load_token_bytewise<scalar_t>(p, token, lane);
    for (; token < p.num_tokens; token += stride) {
      const LaneToken next = load_token_bytewise<scalar_t>(p, token + stride, lane);
      if (current.row != nullptr) store_token<scalar_t, kFormat, kVec>(current, d, lane);
      current = next;
    }
  }
}

}  // namespace

void run_concat_and_cache_mla(const CacheWriteParams& p) {
  if (p.num_tokens == 0) return;
  MLA_HOST_CHECK(p.format != CacheFormat::kFp8 || p.scale != nullptr, "fp8 cache write needs a scale");
  // 16-byte vector accesses need every base pointer and every row stride 16-byte aligned;
  // anything else (odd strided views, odd page padding) takes the byte-wise variant.
  const bool vec = aligned16(p.kv_c) && aligned16(p.k_pe) && aligned16(p.kv_cache) &&
                   (p.stride_kv_c_token * 2) % 16 == 0 && (p.stride_k_pe_token * 2) % 16 == 0 &&
                   p.stride_cache_block_bytes % 16 == 0 && p.stride_cache_token_bytes % 16 == 0;
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  const int64_t max_blocks = int64_t(device_info(device).num_sms) * kBlocksPerSm;
  const int64_t blocks = std::min((p.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock, max_blocks);
  MLA_DISPATCH_HALF_TYPES(p.input_dtype, "kv_c", [&] {
    MLA_DISPATCH_CACHE_FORMAT(p.format, [&] {
      MLA_BOOL_SWITCH(vec, kVec, [&] {
        concat_and_cache_mla_kernel<scalar_t, kFormat, kVec>
            <<<static_cast<unsigned>(blocks), kThreads, 0, p.stream>>>(p);
        MLA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace mla
