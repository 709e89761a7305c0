// Vocabulary shared by kernels and bindings, free of torch headers.
#pragma once

#include <cstdint>

namespace mla {

// MLA dimensions of DeepSeek V2/V3/V3.2: the cache row is [kv_c (512) | k_pe (64)].
inline constexpr int kKvLoraRank = 512;  // L
inline constexpr int kRopeDim = 64;      // R
inline constexpr int kLatentDim = kKvLoraRank + kRopeDim;  // 576

// fp8_ds_mla row: 512 e4m3 bytes of kv_c, 4 fp32 tile scales, 64 bf16 of k_pe.
inline constexpr int kDsMlaTile = 128;
inline constexpr int kDsMlaNumTiles = kKvLoraRank / kDsMlaTile;  // 4
inline constexpr int kDsMlaScaleOffset = kKvLoraRank;            // 512
inline constexpr int kDsMlaRopeOffset = kDsMlaScaleOffset + 4 * kDsMlaNumTiles;  // 528
inline constexpr int kDsMlaRowBytes = kDsMlaRopeOffset + 2 * kRopeDim;  // 656

// Largest finite e4m3 value; fp8 stores saturate to it.
inline constexpr float kFp8E4M3Max = 448.0f;

// DeepSeek-V4 (mla_ext/formats.py): 512-wide heads and rows (448 NoPE + 64 RoPE); an fp8_ds_mla
// token is a 576-byte data part (448 e4m3, 64 bf16) and an 8-byte scale part (7 UE8M0, a pad byte),
// the data parts of a page first, its pages padded to a multiple of 576 bytes.
inline constexpr int kV4HeadDim = 512;
inline constexpr int kV4NopeDim = 448;
inline constexpr int kV4Tile = 64;  // NoPE dims per UE8M0 scale
inline constexpr int kV4DataBytes = 576;
inline constexpr int kV4ScaleBytes = 8;
inline constexpr int kV4TokenBytes = kV4DataBytes + kV4ScaleBytes;  // 584
inline constexpr int kV4PageAlign = 576;                           // page strides are multiples of it

// 16-byte vector accesses (uint4 loads, cp.async) need 16-byte aligned addresses.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Element types that cross the binding boundary.
enum class DType : int { kBF16, kFP16, kFP32, kFP8E4M3, kUInt8 };

// The kv_cache_dtype string of DESIGN.md §2.
enum class CacheFormat : int {
  kAuto,      // bf16/fp16 rows of 576 elements
  kFp8,       // 576 e4m3 bytes, one per-tensor fp32 scale
  kFp8DsMla,  // 656-byte rows (see above)
};

inline constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kFP16: return "float16";
    case DType::kFP32: return "float32";
    case DType::kFP8E4M3: return "float8_e4m3fn";
    case DType::kUInt8: return "uint8";
  }
  return "?";
}

}  // namespace mla
