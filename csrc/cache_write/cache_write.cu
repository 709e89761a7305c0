// concat_and_cache_mla kernel.
//
// Grid mapping: one warp per token, kTokensPerBlock tokens per CTA, grid = ceil(T / 8).
// Every lane moves 16-byte pieces, so a warp's accesses to one row are contiguous:
//   auto       (1152 B row): kv_c chunks lane and lane+32 (8 elems each), k_pe chunk lane < 8
//   fp8        (576 B row):  kv_c elems [16 lane, 16 lane + 16) -> 16 e4m3 bytes; k_pe lane < 4
//   fp8_ds_mla (656 B row):  as fp8, the 8 lanes of a 128-element tile reduce amax by shuffles
//                            and the tile's first lane writes its fp32 scale; k_pe copied as
//                            bf16 by lanes < 8.
// Memory-bound: each thread issues all of its loads before the first store.
#include "cache_write/cache_write.h"

#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/vec.cuh"

#include <type_traits>

namespace mla {
namespace {

constexpr int kTokensPerBlock = 8;
constexpr int kThreads = 32 * kTokensPerBlock;

// fp8_ds_mla tile scale: s = 2^ceil(log2(max(amax / 448, 1e-4))), computed exactly from the bits
// (no log2f rounding): v = 1.m * 2^e, so ceil(log2 v) = e, plus one when the mantissa is not 0.
__device__ __forceinline__ float ds_mla_tile_scale(float amax) {
  const float v = fmaxf(amax / kFp8E4M3Max, 1e-4f);
  const uint32_t bits = __float_as_uint(v);
  uint32_t biased_exp = bits >> 23;  // v > 0, so the sign bit is 0
  if ((bits & 0x7fffffu) != 0) biased_exp += 1;
  return __uint_as_float(biased_exp << 23);
}

template <typename scalar_t, CacheFormat kFormat, bool kVec>
__global__ void __launch_bounds__(kThreads)
    concat_and_cache_mla_kernel(const __grid_constant__ CacheWriteParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t token = int64_t(blockIdx.x) * kTokensPerBlock + threadIdx.x / 32;
  if (token >= p.num_tokens) return;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_slots) return;  // padding, or out of range: never write

  const auto* kv_c = static_cast<const scalar_t*>(p.kv_c) + token * p.stride_kv_c_token;
  const auto* k_pe = static_cast<const scalar_t*>(p.k_pe) + token * p.stride_k_pe_token;
  uint8_t* row = static_cast<uint8_t*>(p.kv_cache) + (slot / p.block_size) * p.stride_cache_block_bytes +
                 (slot % p.block_size) * p.stride_cache_token_bytes;

  if constexpr (kFormat == CacheFormat::kAuto) {
    // Plain copy, no conversion: 64 kv_c chunks and 8 k_pe chunks of 8 elements.
    const Bytes16 a = load16<kVec>(kv_c + 8 * lane);
    const Bytes16 b = load16<kVec>(kv_c + 8 * (lane + 32));
    Bytes16 r;
    if (lane < 8) r = load16<kVec>(k_pe + 8 * lane);
    scalar_t* out = reinterpret_cast<scalar_t*>(row);
    store16<kVec>(out + 8 * lane, a);
    store16<kVec>(out + 8 * (lane + 32), b);
    if (lane < 8) store16<kVec>(out + kKvLoraRank + 8 * lane, r);
  } else {
    float x[16];
    {
      float lo[8], hi[8];
      unpack8<scalar_t>(load16<kVec>(kv_c + 16 * lane), lo);
      unpack8<scalar_t>(load16<kVec>(kv_c + 16 * lane + 8), hi);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = lo[i], x[i + 8] = hi[i];
    }
    if constexpr (kFormat == CacheFormat::kFp8) {
      // k_pe is quantised like kv_c: lanes 0-3 take 16 elements each.
      float r[16];
      if (lane < 4) {
        float lo[8], hi[8];
        unpack8<scalar_t>(load16<kVec>(k_pe + 16 * lane), lo);
        unpack8<scalar_t>(load16<kVec>(k_pe + 16 * lane + 8), hi);
#pragma unroll
        for (int i = 0; i < 8; ++i) r[i] = lo[i], r[i + 8] = hi[i];
      }
      const float scale = *p.scale;
      store16<kVec>(row + 16 * lane, quantize16_e4m3<false>(x, scale));
      if (lane < 4) store16<kVec>(row + kKvLoraRank + 16 * lane, quantize16_e4m3<false>(r, scale));
    } else {
      static_assert(kFormat == CacheFormat::kFp8DsMla);
      // k_pe stays 16-bit (converted to bf16): lanes 0-7 take one 8-element chunk each.
      Bytes16 r;
      if (lane < 8) r = load16<kVec>(k_pe + 8 * lane);
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));
      // The 8 lanes of one 128-element tile are lanes 8t..8t+7.
#pragma unroll
      for (int mask = 4; mask >= 1; mask /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
      const float scale = ds_mla_tile_scale(amax);
      store16<kVec>(row + 16 * lane, quantize16_e4m3<true>(x, scale));
      if (lane % 8 == 0) {
        uint8_t* dst = row + kDsMlaScaleOffset + 4 * (lane / 8);
        if constexpr (kVec) {
          *reinterpret_cast<float*>(dst) = scale;
        } else {
          const uint32_t bits = __float_as_uint(scale);
#pragma unroll
          for (int i = 0; i < 4; ++i) dst[i] = static_cast<uint8_t>(bits >> (8 * i));
        }
      }
      if (lane < 8) {
        if constexpr (!std::is_same_v<scalar_t, __nv_bfloat16>) {
          float f[8];
          unpack8<scalar_t>(r, f);
          auto* e = reinterpret_cast<__nv_bfloat16*>(&r);
#pragma unroll
          for (int i = 0; i < 8; ++i) e[i] = __float2bfloat16_rn(f[i]);
        }
        store16<kVec>(row + kDsMlaRopeOffset + 16 * lane, r);
      }
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void run_concat_and_cache_mla(const CacheWriteParams& p) {
  if (p.num_tokens == 0) return;
  MLA_HOST_CHECK(p.format != CacheFormat::kFp8 || p.scale != nullptr, "fp8 cache write needs a scale");
  // 16-byte vector accesses need every base pointer and every row stride 16-byte aligned;
  // anything else (odd strided views, odd page padding) takes the byte-wise variant.
  const bool vec = aligned16(p.kv_c) && aligned16(p.k_pe) && aligned16(p.kv_cache) &&
                   (p.stride_kv_c_token * 2) % 16 == 0 && (p.stride_k_pe_token * 2) % 16 == 0 &&
                   p.stride_cache_block_bytes % 16 == 0 && p.stride_cache_token_bytes % 16 == 0;
  const dim3 grid(static_cast<unsigned>((p.num_tokens + kTokensPerBlock - 1) / kTokensPerBlock));
  MLA_DISPATCH_HALF_TYPES(p.input_dtype, "kv_c", [&] {
    MLA_DISPATCH_CACHE_FORMAT(p.format, [&] {
      MLA_BOOL_SWITCH(vec, kVec, [&] {
        concat_and_cache_mla_kernel<scalar_t, kFormat, kVec><<<grid, kThreads, 0, p.stream>>>(p);
        MLA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace mla
