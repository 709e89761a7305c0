// Host dispatch of the sparse decode: plan (head tile, splits), kernel choice by architecture,
// launch, and the combine when the top-k list is split.
#include "sparse/sparse_decode.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/arch.h"
#include "common/cuda_check.h"
#include "decode/combine/combine.h"
#include "sparse/portable/sparse_decode_portable.cuh"

namespace mla {
namespace sparse {
// Compiled in portable/instantiations/*.cu.
extern template void launch_sparse_decode_portable<16, CacheFormat::kAuto, 2>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<16, CacheFormat::kAuto, 1>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<32, CacheFormat::kAuto, 2>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<32, CacheFormat::kAuto, 1>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<64, CacheFormat::kAuto, 2>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<64, CacheFormat::kAuto, 1>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 16>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 16, false, 4>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 2>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 1>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<32, CacheFormat::kFp8DsMla, 2>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<32, CacheFormat::kFp8DsMla, 1>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<64, CacheFormat::kFp8DsMla, 1>(const SparseDecodeParams&);
extern template void launch_sparse_decode_portable<64, CacheFormat::kFp8DsMla, 2, false, 16, false, 0, true>(const SparseDecodeParams&);
// Compiled in sm90/sparse_decode_sm90_fp8.cu (the kernel body exists in sm_90a code only).
void launch_sparse_decode_sm90_fp8_m64(const SparseDecodeParams& p);
int sm90_fp8_m64_smem_bytes();
// Compiled in sm90/sparse_decode_sm90_fp8_m16.cu: the e4m3-fragment kernel with bulk row copies
// issued by 4 copy warps.
extern template void launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 8, true, 4>(const SparseDecodeParams&);

namespace {

// sm90, fp8_ds_mla 16-head tiles: the e4m3-fragment kernel with one bulk copy per row.
using BulkM16Config = PortableConfig<16, CacheFormat::kFp8DsMla, 4, true, 8, true, 4>;

// Whether this GPU runs fp8_ds_mla 16-head tiles on the e4m3-fragment kernel with bulk row copies.
bool sm90_fp8_m16(const SparseDecodeParams& p, const DeviceInfo& info) {
  return info.sm_version == 90 && !force_portable() && p.format == CacheFormat::kFp8DsMla &&
         BulkM16Config::kSmemBytes <= info.max_smem_per_block;
}

// Heads per CTA: the smallest MMA tile that holds h_q (16 / 32), else 64-head tiles. h_q = 16
// therefore reads every row once with a quarter of the MMA work of h_q = 64; nothing is padded
// to 64 heads. Where the 16-head e4m3-fragment kernel with bulk copies runs (sm90, fp8_ds_mla),
// 17-32 heads take two 16-head tiles: each CTA reads the rows (its neighbour in the grid mostly
// from L2) and converts them in registers, where the 32-head kernel dequantises every tile with
// all threads between two barriers.
int head_tile(const SparseDecodeParams& p, const DeviceInfo& info) {
  if (p.h_q <= 16) return 16;
  if (p.h_q <= 32) return sm90_fp8_m16(p, info) ? 16 : 32;
  return 64;
}

// Deepest pipeline instantiated per (head tile, format): bf16 2 K buffers; fp8_ds_mla staging
// buffers as many as fit next to Q and the K tile in 227 KB (2 for 16 heads, 2 for 32, 1 for 64:
// the dequantising kernels; the 64-head kernel of sm90/sm100, PvRawConfig below, has 2 next to a
// smaller K tile). GPUs with less shared memory (the compute_100 PTX JIT-compiled for them) take
// one stage.
template <int kM, CacheFormat kFormat>
constexpr int kDeepStages = kFormat == CacheFormat::kAuto ? 2 : (kM == 64 ? 1 : 2);

// fp8_ds_mla, 16-head tiles: MMA fragments read straight from the e4m3 rows (no dequantisation
// pass), the rows gathered by 4 copy warps with cp.async, where shared memory allows.
using FragsConfig = PortableConfig<16, CacheFormat::kFp8DsMla, 4, true, 16>;
using FragsCopyWarpsConfig = PortableConfig<16, CacheFormat::kFp8DsMla, 4, true, 16, false, 4>;
// fp8_ds_mla, 64-head tiles: V read straight from the staging rows, the next tile dequantised while
// PV runs (PortableConfig::kPvRaw), where shared memory allows (232320 bytes).
using PvRawConfig = PortableConfig<64, CacheFormat::kFp8DsMla, 2, false, 16, false, 0, true>;
template <int kM, CacheFormat kFormat>
void launch_portable(const SparseDecodeParams& p, int max_smem) {
  if constexpr (kM == 16 && kFormat == CacheFormat::kFp8DsMla) {
    if (FragsCopyWarpsConfig::kSmemBytes <= max_smem) return launch_sparse_decode_portable<16, kFormat, 4, true, 16, false, 4>(p);
    if (FragsConfig::kSmemBytes <= max_smem) return launch_sparse_decode_portable<16, kFormat, 4, true, 16>(p);
  }
  if constexpr (kM == 64 && kFormat == CacheFormat::kFp8DsMla) {
    if (PvRawConfig::kSmemBytes <= max_smem) return launch_sparse_decode_portable<64, kFormat, 2, false, 16, false, 0, true>(p);
  }
  // The deep pipeline where shared memory allows (sm90, sm100: 227 KB), else one stage.
  constexpr int kDeep = kDeepStages<kM, kFormat>;
  if constexpr (kDeep > 1) {
    if (PortableConfig<kM, kFormat, kDeep>::kSmemBytes <= max_smem) return launch_sparse_decode_portable<kM, kFormat, kDeep>(p);
  }
  constexpr int kSmem = PortableConfig<kM, kFormat, 1>::kSmemBytes;
  MLA_HOST_CHECK(kSmem <= max_smem, "sparse decode needs " + std::to_string(kSmem) +
                                        " bytes of shared memory per block, this GPU allows " + std::to_string(max_smem));
  launch_sparse_decode_portable<kM, kFormat, 1>(p);
}

}  // namespace
}  // namespace sparse

void plan_sparse_decode(SparseDecodeParams& p, int device) {
  const DeviceInfo& info = device_info(device);
  constexpr int kTileKeys = 64;
  MLA_HOST_CHECK(p.topk >= 1 && p.topk <= kSparseMaxTopk,
                 "sparse decode needs 1 <= topk <= " + std::to_string(kSparseMaxTopk));
  const int total_tiles = std::max(1, (p.topk + kTileKeys - 1) / kTileKeys);
  const int tile = sparse::head_tile(p, info);
  const int64_t ctas = int64_t(p.batch) * p.s_q * ((p.h_q + tile - 1) / tile);
  // One CTA per SM (the kernel uses most of shared memory). Split the top-k list only when the
  // CTAs leave SMs idle; a split costs a partial write and the combine.
  int splits = ctas >= info.num_sms ? 1 : static_cast<int>(info.num_sms / std::max<int64_t>(ctas, 1));
  splits = std::clamp(splits, 1, total_tiles);
  // ... and only when it takes more off each CTA's list than it adds: a split (partial writes, the
  // combine and its launch) costs about 1.5 tiles' time of 16 heads; a 32-head tile takes about 1.5
  // of those, a 64-head tile 2 (H200, b 4, topk 128: 8.6 us unsplit and 9.8 us in 2 splits at
  // 16 heads, 19.3 and 16.7 us at 64). Weights in half 16-head tiles.
  const int tile_weight = tile == 16 ? 2 : tile == 32 ? 3 : 4;
  constexpr int kSplitCost = 3;
  if (splits > 1 && (total_tiles - (total_tiles + splits - 1) / splits) * tile_weight <= kSplitCost) splits = 1;
  p.split_from = 0;
  // More CTAs than SMs, 64-head tiles (one CTA per SM: the kernels take most of shared memory):
  // the CTAs run in waves of num_sms. When the last requests' CTAs alone would make a last wave
  // that leaves most SMs idle, their lists are split instead, so that the pieces fill the SMs that
  // the waves before leave free and the last wave is short (b 74 x s_q 2 x 128 heads: 296 CTAs,
  // the last 32 in 4 splits each). Each split keeps at least kMinTailTiles tiles.
  constexpr int kMinTailTiles = 2;
  const int64_t ctas_per_request = int64_t(p.s_q) * ((p.h_q + tile - 1) / tile);
  const int64_t last_wave = ctas % info.num_sms;
  if (tile == 64 && ctas > info.num_sms && last_wave != 0) {
    const int64_t tail_requests = (last_wave + ctas_per_request - 1) / ctas_per_request;
    const int64_t tail_ctas = tail_requests * ctas_per_request;
    // SMs free in the last wave of the whole CTAs, in units of the tail's CTAs
    const int64_t fill = (info.num_sms + tail_ctas - last_wave) / tail_ctas;
    const int64_t tail_splits = std::min<int64_t>(fill, total_tiles / kMinTailTiles);
    const int64_t split_from = (p.batch - tail_requests) * p.s_q;
    if (tail_splits > 1 && split_from + tail_requests * p.s_q * tail_splits <= 65535) {
      splits = static_cast<int>(tail_splits);
      p.split_from = static_cast<int>(split_from);
    }
  }
  p.tiles_per_split = (total_tiles + splits - 1) / splits;
  p.num_splits = (total_tiles + p.tiles_per_split - 1) / p.tiles_per_split;
  if (p.num_splits == 1) p.split_from = p.batch * p.s_q;
  p.block_div = FastDivmod(static_cast<int32_t>(std::clamp<int64_t>(p.block_size, 1, INT32_MAX)));
}

void run_sparse_combine(const SparseDecodeParams& p, int num_sms) {
  // The split combine shared with dense decode: the requests from split_from / s_q on (the split
  // ones, c.b of them) have num_splits splits each.
  const int first_request = p.split_from / p.s_q;
  combine::CombineParams c{};
  c.partial_o = p.partial_out;
  c.partial_lse = p.partial_lse;
  c.lse_is_natural = true;
  c.num_slots = p.num_splits;
  c.stride_partial_slot = int64_t(p.batch - first_request) * p.s_q * p.h_q;  // [splits, tokens, h_q, 512]
  c.stride_partial_req = int64_t(p.s_q) * p.h_q;
  c.split_list = nullptr;
  c.split_info = nullptr;
  c.num_splits = p.num_splits;
  c.attn_sink = p.attn_sink;
  c.out = static_cast<__nv_bfloat16*>(p.out) + int64_t(first_request) * p.s_q * p.h_q * kKvLoraRank;  // [b, s_q, h_q, 512]
  c.lse = p.lse + int64_t(first_request) * p.h_q * p.s_q;  // [b, h_q, s_q] fp32, contiguous
  c.stride_out_b = int64_t(p.s_q) * p.h_q * kKvLoraRank;
  c.stride_out_s = int64_t(p.h_q) * kKvLoraRank;
  c.stride_out_h = kKvLoraRank;
  c.stride_lse_b = int64_t(p.h_q) * p.s_q;
  c.stride_lse_h = p.s_q;
  c.stride_lse_s = 1;
  c.b = p.batch - first_request;
  c.s_q = p.s_q;
  c.h_q = p.h_q;
  c.out_dtype = DType::kBF16;
  c.num_sms = num_sms;
  c.stream = p.stream;
  combine::run_split_combine(c);
}

void run_sparse_decode_mla(const SparseDecodeParams& p, int device) {
  MLA_HOST_CHECK(p.num_splits >= 1 && p.tiles_per_split >= 1, "plan_sparse_decode() must run first");
  MLA_HOST_CHECK(p.num_splits == 1 || (p.partial_out != nullptr && p.partial_lse != nullptr),
                 "a split plan needs partial_out and partial_lse");
  MLA_HOST_CHECK(p.block_div.divisor == std::clamp<int64_t>(p.block_size, 1, INT32_MAX),
                 "plan_sparse_decode() must run after block_size is set (it sets block_div)");
  if (p.batch == 0 || p.s_q == 0 || p.h_q == 0) return;
  MLA_HOST_CHECK(int64_t(p.batch) * p.s_q <= 65535, "sparse decode supports b * s_q <= 65535 query tokens per call");
  const DeviceInfo& info = device_info(device);
  const bool hopper = info.sm_version == 90 && !force_portable();
  const int tile = sparse::head_tile(p, info);
  // sm90: fp8_ds_mla 64-head tiles run the three-warpgroup wgmma kernel (rows converted to bf16 by a
  // warpgroup of their own; two head tiles as a 2-CTA cluster; csrc/sparse/README.md), 16-head tiles (17-32 heads: two) the portable
  // e4m3-fragment kernel with bulk row copies. Everything else, and forced portable
  // (common/arch.h), runs the portable kernels.
  const bool sm90_fp8 = hopper && tile == 64 && p.format == CacheFormat::kFp8DsMla &&
                        sparse::sm90_fp8_m64_smem_bytes() <= info.max_smem_per_block;
  const bool sm90_fp8_m16 = tile == 16 && sparse::sm90_fp8_m16(p, info);
  auto by_format = [&]<int kM>() {
    if (p.format == CacheFormat::kAuto) {
      sparse::launch_portable<kM, CacheFormat::kAuto>(p, info.max_smem_per_block);
    } else if (p.format == CacheFormat::kFp8DsMla) {
      sparse::launch_portable<kM, CacheFormat::kFp8DsMla>(p, info.max_smem_per_block);
    } else {
      throw std::runtime_error("mla_ext: sparse decode reads 'auto' (bf16) or 'fp8_ds_mla' caches only");
    }
  };
  if (sm90_fp8) {
    sparse::launch_sparse_decode_sm90_fp8_m64(p);
  } else if (sm90_fp8_m16) {
    sparse::launch_sparse_decode_portable<16, CacheFormat::kFp8DsMla, 4, true, 8, true, 4>(p);
  } else if (tile == 16) {
    by_format.template operator()<16>();
  } else if (tile == 32) {
    by_format.template operator()<32>();
  } else {
    by_format.template operator()<64>();
  }
  if (p.num_splits > 1) run_sparse_combine(p, info.num_sms);
}

}  // namespace mla
