// The fp8_ds_mla tile scale, shared by the V3.2 (656-byte rows) and DeepSeek-V4 (584-byte tokens)
// cache writes: s = 2^ceil(log2(max(amax / 448, 1e-4))), so |x / s| <= 448.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace mla {

// Computed exactly from the bits (no log2f rounding): v = 1.m * 2^e, so ceil(log2 v) = e, plus
// one when the mantissa is not 0.
__device__ __forceinline__ float ds_mla_tile_scale(float amax) {
  const float v = fmaxf(amax / kFp8E4M3Max, 1e-4f);
  const uint32_t bits = __float_as_uint(v);
  uint32_t biased_exp = bits >> 23;  // v > 0, so the sign bit is 0
  if ((bits & 0x7fffffu) != 0) biased_exp += 1;
  return __uint_as_float(biased_exp << 23);
}

}  // namespace mla
