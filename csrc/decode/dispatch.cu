// Decode host entry: shape helpers shared by planner and kernels, and the one kernel choice of
// the op (architecture x cache format x query rows -> split kernel), then the combine.
//
//   rows per CTA      format            sm90                                  portable (sm100, forced portable)
//   16 (<= 16 rows)   auto              portable::decode_split<16>            the same
//   16 (<= 32 rows)   fp8, fp8_ds_mla   bf16 q: fp8_16rows, QK^T on wgmma:    fp8_16rows on mma.sync: raw rows
//                                       TMA tiles where the tensor map        by bulk copies where rows are
//                                       builds, else cp.async rows;           packed and block_size % 16 == 0,
//                                       fp16 q: as portable                   else row copies
//   32 (17-32 rows)   auto              as 64 rows (one tile, padded)         portable::decode_split<32>
//   64 (> 32 rows)    auto              hopper::wgmma_pairs where the tensor  portable::decode_split<64>
//                                       map builds, else hopper::wgmma
//                     fp8_ds_mla        bf16 q: hopper::wgmma_pairs with a    portable::decode_split<64>
//                                       converter warpgroup where the tensor
//                                       maps build; else hopper::wgmma
//                     fp8               hopper::wgmma (fp16 q too)            portable::decode_split<64>
// (16-bit caches, 17-32 rows on sm90: the 64-row wgmma kernels with the rows padded, as FlashMLA pads
// every head count to 64, run at the time of 64 rows, ~0.77x of the portable 32-row kernel's on the
// H200; the m-block count, hence the plan, is the same either way. fp8 caches, 17-32 rows: two 16-row
// CTAs per part, each converting in registers, read the same tiles, the second mostly from L2.)
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/sm90/tensor_map.h"
#include "decode/combine/combine.h"
#include "decode/decode.h"
#include "decode/kernels.h"

namespace mla::decode {

int block_m_for(int num_rows, CacheFormat format) {
  if (format != CacheFormat::kAuto && num_rows <= 32) return 16;  // fp8: the 16-row kernel (see above)
  if (num_rows <= 16) return 16;
  if (num_rows <= 32) return 32;
  return 64;
}

int num_m_blocks(int num_rows, CacheFormat format) {
  const int bm = block_m_for(num_rows, format);
  return (num_rows + bm - 1) / bm;
}

int num_parts_for(int num_sms, int s_q, int h_q, CacheFormat format) {
  return std::max(1, num_sms / num_m_blocks(s_q * h_q, format));
}

namespace {

// Tensor maps for the TMA tile copies of the sm90 kernels (the fp8 16-row kernel's wgmma variant
// and the 16-bit 64-row pairs kernel; DecodeParams::kv_map / scale_map): boxes of min(64,
// block_size) rows, so a 64-key tile is whole pages (block sizes that are multiples of 64, or 8,
// 16, 32: pages of whole 1024-byte swizzle atoms), and only where the driver takes the cache's
// strides (multiples of 16 bytes, 16-byte aligned base). Returns false otherwise: the caller
// takes the kernel that copies rows with cp.async. (Built here rather than in the kernels'
// launchers because whether the map builds decides the kernel.)
bool make_tile_maps(DecodeParams& p) {
  const int box_rows = p.block_size < kBlockN ? p.block_size : kBlockN;
  if (box_rows % 8 != 0 || p.block_size % box_rows != 0 || kBlockN % box_rows != 0) return false;
  p.tma_box_rows = box_rows;
  const bool ds = p.format == CacheFormat::kFp8DsMla;
  const uint64_t strides[2] = {static_cast<uint64_t>(p.stride_cache_token_bytes), static_cast<uint64_t>(p.stride_cache_block_bytes)};
  if (reinterpret_cast<uintptr_t>(p.kv_cache) % 16 != 0 || strides[0] % 16 != 0 || strides[1] % 16 != 0) return false;
  auto make = [&](CUtensorMap* map, const void* base, uint64_t width, uint32_t box_width, CUtensorMapSwizzle swizzle) {
    const uint64_t dims[3] = {width, static_cast<uint64_t>(p.block_size), static_cast<uint64_t>(p.num_blocks)};
    const uint32_t box[3] = {box_width, static_cast<uint32_t>(box_rows), 1};
    return sm90::make_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, swizzle, base, 3, dims, strides, box,
                                 /*cached=*/true);
  };
  // Rows in 128-byte boxes, swizzled as wgmma reads them; fp8_ds_mla's 16 scale bytes per row plain.
  const uint64_t row_bytes = ds ? kDsMlaRowBytes : p.format == CacheFormat::kAuto ? 2 * kLatentDim : kLatentDim;
  if (!make(&p.kv_map, p.kv_cache, row_bytes, 128, CU_TENSOR_MAP_SWIZZLE_128B)) return false;
  return !ds || make(&p.scale_map, static_cast<const uint8_t*>(p.kv_cache) + kDsMlaScaleOffset, 16, 16, CU_TENSOR_MAP_SWIZZLE_NONE);
}

// fp8 caches, 16 rows. sm90 with bf16 q: QK^T on wgmma (q as two e4m3 terms: exact for bf16, not
// for fp16's 11 bits). Otherwise mma.sync, with raw rows by bulk copies where a tile's 16-row
// quarters lie on one page with rows packed (656 bytes for fp8_ds_mla, 576 for fp8).
template <typename T, CacheFormat kFormat>
void launch_fp8_16_rows(DecodeParams& p, bool sm90) {
  using namespace fp8_16rows;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (sm90) {
      p.tma_tiles = make_tile_maps(p);
      if (!p.tma_tiles) return launch_decode_split_fp8<T, kFormat, kRowThreads<kFormat>, true, kTmaNone, false>(p);
      if (p.tma_box_rows == kBlockN) return launch_decode_split_fp8<T, kFormat, 8, true, kTmaWholePage, false>(p);
      return launch_decode_split_fp8<T, kFormat, 8, true, kTmaPages, false>(p);
    }
  }
  const int64_t row_bytes = kFormat == CacheFormat::kFp8DsMla ? kDsMlaRowBytes : kLatentDim;
  if (p.block_size % 16 == 0 && p.stride_cache_token_bytes == row_bytes)
    return launch_decode_split_fp8<T, kFormat, 8, false, kTmaNone, true>(p);
  launch_decode_split_fp8<T, kFormat, kRowThreads<kFormat>, false, kTmaNone, false>(p);
}

void run_split(DecodeParams& p, bool sm90) {
  const int block_m = block_m_for(p.num_rows, p.format);
  MLA_DISPATCH_HALF_TYPES(p.q_dtype, "q", [&] {
    MLA_DISPATCH_CACHE_FORMAT(p.format, [&] {
      switch (block_m) {
        case 16:
          if constexpr (kFormat == CacheFormat::kAuto) return portable::launch_decode_split<scalar_t, kFormat, 16>(p);
          else return launch_fp8_16_rows<scalar_t, kFormat>(p, sm90);
        case 32:  // 16-bit caches only (block_m_for)
          if constexpr (kFormat == CacheFormat::kAuto)
            if (!sm90) return portable::launch_decode_split<scalar_t, kFormat, 32>(p);
          [[fallthrough]];
        case 64:
          if (!sm90) return portable::launch_decode_split<scalar_t, kFormat, 64>(p);
          if constexpr (kFormat == CacheFormat::kAuto ||
                        (kFormat == CacheFormat::kFp8DsMla && std::is_same_v<scalar_t, __nv_bfloat16>)) {
            p.tma_tiles = make_tile_maps(p);
            if (p.tma_tiles) return hopper::launch_decode_split_wgmma_pairs<scalar_t, kFormat>(p);
          }
          return hopper::launch_decode_split_wgmma<scalar_t, kFormat>(p);
        default:
          throw std::runtime_error("mla_ext: unsupported decode block_m " + std::to_string(block_m));
      }
    });
  });
}

}  // namespace

void run_decode(const DecodeParams& params, int device, bool force_portable) {
  const DeviceInfo& info = device_info(device);
  MLA_HOST_CHECK(info.sm_version >= 90, "decode needs sm90 or newer");
  DecodeParams p = params;
  p.block_div = FastDivmod(p.block_size);  // every kernel maps key positions to pages with it
  p.tma_tiles = false;
  run_split(p, info.sm_version == 90 && !force_portable);

  // Merge the pieces of split requests (the planner lists them in the kSplitReq column).
  static_assert(kSplitInfoFields == 2, "combine reads split_info as (num_splits, first slot) pairs");
  combine::CombineParams c{};
  c.partial_o = p.partial_o;
  c.partial_lse = p.partial_lse;
  c.lse_is_natural = false;  // the split kernels write log2-domain lse
  c.num_slots = p.max_partials;
  c.stride_partial_slot = p.num_rows;
  c.stride_partial_req = 0;
  c.split_list = p.schedule + kSplitReq;
  c.stride_split_list = kScheduleFields;
  c.list_len = p.num_parts;
  c.split_info = p.split_info;
  c.attn_sink = nullptr;
  c.out = p.out;
  c.lse = p.lse;
  c.stride_out_b = p.stride_out_b;
  c.stride_out_s = p.stride_out_s;
  c.stride_out_h = p.stride_out_h;
  c.stride_lse_b = p.stride_lse_b;
  c.stride_lse_h = p.stride_lse_h;
  c.stride_lse_s = p.stride_lse_s;
  c.b = p.b;
  c.s_q = p.s_q;
  c.h_q = p.h_q;
  c.out_dtype = p.q_dtype;
  c.num_sms = info.num_sms;
  c.stream = p.stream;
  combine::run_split_combine(c);
}

}  // namespace mla::decode
