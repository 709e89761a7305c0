// concat_and_cache_mla_v4 kernel: DeepSeek-V4 rows of 512 (448 NoPE + 64 RoPE) into their slots.
//
// One warp per token (8 warps per CTA, a grid of up to 4 CTAs per SM striding over the tokens).
// Lane l owns elements [16 l, 16 l + 16) of the row: one 32-byte piece of the input.
//   auto        the 32 bytes copied to the row.
//   fp8_ds_mla  lanes 0-27 hold the NoPE dims, 4 lanes per 64-dim tile: amax (and whether the tile
//               holds inf or NaN) reduced over the 4 by shuffles, scale 2^e from
//               cache_write/tile_scale.cuh (UE8M0 byte 127 + e; 0xFF and e4m3 NaN bytes for a tile
//               with inf or NaN), 16 e4m3 bytes stored at 16 l of the token's data part; lanes
//               28-31 store the RoPE dims as bf16 at 448 + 32 (l - 28); lane 0 gathers the 7 scale
//               bytes and stores the token's 8-byte scale part.
// Bit-exact with mla_ext.reference.quantize_v4_rows: e4m3 of x * 2^-e (exact: a power of two)
// rounded to nearest even, RoPE rounded to bf16 from fp16 input (copied from bf16).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "cache_write/cache_write.h"
#include "cache_write/tile_scale.cuh"
#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/vec.cuh"

namespace mla {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlocksPerSm = 4;
constexpr int kNopeLanes = kV4NopeDim / 16;  // 28
constexpr uint32_t kUe8m0Nan = 0xFF;
constexpr uint32_t kE4m3NanX4 = 0x7F7F7F7Fu;

// 16-byte pieces with a byte-wise fallback for inputs and caches that are not 16-byte aligned.
template <bool kVec>
__device__ __forceinline__ uint4 load16(const void* src) {
  if constexpr (kVec) return *static_cast<const uint4*>(src);
  uint32_t w[4];
  const uint8_t* b = static_cast<const uint8_t*>(src);
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = b[4 * i] | (b[4 * i + 1] << 8) | (b[4 * i + 2] << 16) | (uint32_t(b[4 * i + 3]) << 24);
  return make_uint4(w[0], w[1], w[2], w[3]);
}
template <bool kVec>
__device__ __forceinline__ void store16(void* dst, uint4 v) {
  if constexpr (kVec) {
    *static_cast<uint4*>(dst) = v;
  } else {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint8_t* b = static_cast<uint8_t*>(dst);
#pragma unroll
    for (int i = 0; i < 16; ++i) b[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
  }
}

template <typename T>
__device__ __forceinline__ float to_float_bits(uint32_t w, int half) {
  const uint16_t bits = static_cast<uint16_t>(w >> (16 * half));
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(uint32_t(bits) << 16);
  else return __half2float(__ushort_as_half(bits));
}

template <typename T, bool kVec, bool kDsMla>
__global__ void __launch_bounds__(kThreads) concat_and_cache_mla_v4_kernel(const __grid_constant__ CacheWriteV4Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t num_warps = int64_t(gridDim.x) * kWarps;
  for (int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; t < p.num_tokens; t += num_warps) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0 || slot >= p.num_slots) continue;  // padding or past the cache: warp-uniform
    const int64_t block = slot / p.block_size, offset = slot % p.block_size;
    const uint8_t* src = reinterpret_cast<const uint8_t*>(static_cast<const T*>(p.kv) + t * p.stride_kv_token) + 32 * lane;
    const uint4 in[2] = {load16<kVec>(src), load16<kVec>(src + 16)};
    uint8_t* page = static_cast<uint8_t*>(p.kv_cache) + block * p.stride_cache_block_bytes;
    if constexpr (!kDsMla) {
      uint8_t* dst = page + offset * p.stride_cache_token_bytes + 32 * lane;
      store16<kVec>(dst, in[0]);
      store16<kVec>(dst + 16, in[1]);
      continue;
    }
    const uint32_t w[8] = {in[0].x, in[0].y, in[0].z, in[0].w, in[1].x, in[1].y, in[1].z, in[1].w};
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = to_float_bits<T>(w[i / 2], i % 2);
    float amax = 0.f;
    bool bad = false;  // inf or NaN (fmaxf would drop a NaN)
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      amax = fmaxf(amax, fabsf(x[i]));
      bad |= !isfinite(x[i]);
    }
    // The 4 lanes of a tile (lanes 28-31, the RoPE dims, reduce among themselves, unused).
#pragma unroll
    for (int mask = 1; mask <= 2; mask *= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
      bad |= __shfl_xor_sync(0xffffffffu, int(bad), mask) != 0;
    }
    const float scale = ds_mla_tile_scale(amax);
    const uint32_t scale_byte = bad ? kUe8m0Nan : __float_as_uint(scale) >> 23;  // 127 + e
    uint8_t* data = page + offset * kV4DataBytes;
    if (lane < kNopeLanes) {
      uint4 q = make_uint4(kE4m3NanX4, kE4m3NanX4, kE4m3NanX4, kE4m3NanX4);
      if (!bad) {
        float lo[8], hi[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) lo[i] = x[i], hi[i] = x[8 + i];
        const uint2 a = quantize8_e4m3(lo, scale), b = quantize8_e4m3(hi, scale);
        q = make_uint4(a.x, a.y, b.x, b.y);
      }
      store16<kVec>(data + 16 * lane, q);
    } else {
      uint32_t r[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
          r[i] = w[i];
        } else {
          const __nv_bfloat162 v = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
          r[i] = *reinterpret_cast<const uint32_t*>(&v);
        }
      }
      uint8_t* rope = data + kV4NopeDim + 32 * (lane - kNopeLanes);
      store16<kVec>(rope, make_uint4(r[0], r[1], r[2], r[3]));
      store16<kVec>(rope + 16, make_uint4(r[4], r[5], r[6], r[7]));
    }
    uint32_t part[2] = {0u, 0u};  // the 7 scale bytes (tile i from lane 4 i), then the zero pad byte
#pragma unroll
    for (int i = 0; i < kV4NopeDim / kV4Tile; ++i) part[i / 4] |= __shfl_sync(0xffffffffu, scale_byte, 4 * i) << (8 * (i % 4));
    if (lane == 0) {
      uint8_t* dst = page + p.block_size * kV4DataBytes + offset * kV4ScaleBytes;
      if constexpr (kVec) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(part[0], part[1]);
      } else {
#pragma unroll
        for (int i = 0; i < kV4ScaleBytes; ++i) dst[i] = static_cast<uint8_t>(part[i / 4] >> (8 * (i % 4)));
      }
    }
  }
}

}  // namespace

void run_concat_and_cache_mla_v4(const CacheWriteV4Params& p) {
  if (p.num_tokens == 0) return;
  // 16-byte pieces need the input rows, the cache base and its strides 16-byte aligned (fp8_ds_mla
  // pages are multiples of 576 bytes apart, tokens 576 bytes; the scale part is 8-byte aligned
  // when the page is 16-byte aligned); anything else takes the byte-wise variant.
  const bool vec = aligned16(p.kv) && aligned16(p.kv_cache) && (p.stride_kv_token * 2) % 16 == 0 &&
                   p.stride_cache_block_bytes % 16 == 0 && (p.ds_mla || p.stride_cache_token_bytes % 16 == 0);
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  const int64_t max_blocks = int64_t(device_info(device).num_sms) * kBlocksPerSm;
  const int64_t blocks = std::min((p.num_tokens + kWarps - 1) / kWarps, max_blocks);
  MLA_DISPATCH_HALF_TYPES(p.input_dtype, "kv", [&] {
    MLA_BOOL_SWITCH(vec, kVec, [&] {
      MLA_BOOL_SWITCH(p.ds_mla, kDsMla, [&] {
        concat_and_cache_mla_v4_kernel<scalar_t, kVec, kDsMla><<<static_cast<unsigned>(blocks), kThreads, 0, p.stream>>>(p);
        MLA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace mla
