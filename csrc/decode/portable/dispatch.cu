// Host dispatch of the portable split kernel: q dtype x cache format x rows per CTA.
#include "common/arch.h"
#include "common/dispatch.h"
#include "decode/decode.h"
#include "absorb/sm90/tma.cuh"

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mla::decode {
namespace portable {
// Defined in decode_split.cuh, instantiated in instantiations/split_<format>.cu.
template <typename T, CacheFormat kFormat, int kBlockM>
void launch_decode_split(const DecodeParams& p);
// Defined in decode_split_fp8.cuh (fp8 caches, 16 rows per CTA), in instantiations/split_fp8_16.cu
// (mma.sync) and split_fp8_16_sm90.cu (QK^T on wgmma).
template <typename T, CacheFormat kFormat, bool kQkWgmma>
void launch_decode_split_fp8(const DecodeParams& p);
}  // namespace portable
namespace hopper {
// Defined in sm90/decode_split_wgmma.cu: 64-row tiles with S and P V on wgmma.
template <typename T, CacheFormat kFormat>
void launch_decode_split_wgmma(const DecodeParams& p);
}  // namespace hopper

namespace {

// MLA_EXT_DECODE_WGMMA=0 keeps 64-row tiles on the portable mma.sync kernel on sm90 too
// (comparisons, tests; read per call).
bool wgmma_64_rows_enabled() { return !env_switched_off("MLA_EXT_DECODE_WGMMA"); }

// Tensor maps for the TMA tile copies of the sm90 kernels (the fp8 16-row kernel and the 16-bit
// 64-row wgmma kernel, which uses them for whole pages only; DecodeParams::kv_map / scale_map): boxes
// of min(64, block_size) rows, so a 64-key tile is whole pages (block sizes that are multiples of
// 64, or 8, 16, 32: pages of whole 1024-byte swizzle atoms), and only where the driver takes the
// cache's strides (multiples of 16 bytes, 16-byte aligned base); otherwise the kernel copies rows
// with cp.async.
// MLA_EXT_DECODE_TMA_TILES=0 turns them off (comparisons, tests).
bool make_tile_maps(DecodeParams& p) {
  static const bool disabled = env_switched_off("MLA_EXT_DECODE_TMA_TILES");
  const int box_rows = p.block_size < kBlockN ? p.block_size : kBlockN;
  if (disabled || box_rows % 8 != 0 || p.block_size % box_rows != 0 || kBlockN % box_rows != 0) return false;
  p.tma_box_rows = box_rows;
  const bool ds = p.format == CacheFormat::kFp8DsMla;
  const uint64_t strides[2] = {static_cast<uint64_t>(p.stride_cache_token_bytes), static_cast<uint64_t>(p.stride_cache_block_bytes)};
  if (reinterpret_cast<uintptr_t>(p.kv_cache) % 16 != 0 || strides[0] % 16 != 0 || strides[1] % 16 != 0) return false;
  auto make = [&](CUtensorMap* map, const void* base, uint64_t width, uint32_t box_width, CUtensorMapSwizzle swizzle) {
    const uint64_t dims[3] = {width, static_cast<uint64_t>(p.block_size), static_cast<uint64_t>(p.num_blocks)};
    const uint32_t box[3] = {box_width, static_cast<uint32_t>(box_rows), 1};
    return sm90::make_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, swizzle, base, 3, dims, strides, box);
  };
  // Rows in 128-byte boxes, swizzled as wgmma reads them; fp8_ds_mla's 16 scale bytes per row plain.
  const uint64_t row_bytes = ds ? kDsMlaRowBytes : p.format == CacheFormat::kAuto ? 2 * kLatentDim : kLatentDim;
  if (!make(&p.kv_map, p.kv_cache, row_bytes, 128, CU_TENSOR_MAP_SWIZZLE_128B)) return false;
  return !ds || make(&p.scale_map, static_cast<const uint8_t*>(p.kv_cache) + kDsMlaScaleOffset, 16, 16, CU_TENSOR_MAP_SWIZZLE_NONE);
}

// MLA_EXT_DECODE_BULK_ROWS=0 keeps the portable fp8 16-row kernel off bulk copies on sm90 and newer
// too: fp8_ds_mla raw rows by cp.async, fp8 rows by 4 threads each (comparisons, tests; read once).
bool bulk_rows_enabled() {
  static const bool enabled = !env_switched_off("MLA_EXT_DECODE_BULK_ROWS");
  return enabled;
}

}  // namespace

void run_decode_split_portable(const DecodeParams& params, int sm_version, bool sm90) {
  DecodeParams p = params;
  p.block_div = FastDivmod(p.block_size);  // every kernel maps key positions to pages with it
  p.tma_tiles = false;
  p.bulk_rows = sm_version >= 90 && bulk_rows_enabled();
  const int block_m = block_m_for(p.num_rows, p.format);
  MLA_DISPATCH_HALF_TYPES(p.q_dtype, "q", [&] {
    MLA_DISPATCH_CACHE_FORMAT(p.format, [&] {
      switch (block_m) {
        case 16:
          // fp8 caches: the kernel that converts e4m3 in registers (memory-bound decode).
          if constexpr (kFormat == CacheFormat::kAuto) return portable::launch_decode_split<scalar_t, kFormat, 16>(p);
          // (sm90 with bf16 q: QK^T on wgmma, q as two e4m3 terms, exact for bf16 but not for
          // fp16's 11 bits.)
          else if (sm90 && std::is_same_v<scalar_t, __nv_bfloat16>) {
            p.tma_tiles = make_tile_maps(p);  // else the kernel copies rows with cp.async
            return portable::launch_decode_split_fp8<scalar_t, kFormat, true>(p);
          }
          else return portable::launch_decode_split_fp8<scalar_t, kFormat, false>(p);
        case 32: return portable::launch_decode_split<scalar_t, kFormat, 32>(p);
        case 64:
          // sm90: the compute-bound tiles on wgmma (16-bit cache: TMA for whole-page tiles).
          if (sm90 && wgmma_64_rows_enabled()) {
            if constexpr (kFormat == CacheFormat::kAuto) p.tma_tiles = make_tile_maps(p);
            return hopper::launch_decode_split_wgmma<scalar_t, kFormat>(p);
          }
          return portable::launch_decode_split<scalar_t, kFormat, 64>(p);
        default: throw std::runtime_error("mla_ext: unsupported decode block_m " + std::to_string(block_m));
      }
    });
  });
}

}  // namespace mla::decode
