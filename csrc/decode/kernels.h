// The split kernels' launchers, for decode/dispatch.cu (the one place that picks among them).
// Each launches its kernel on p.stream with grid (p.num_parts, m-blocks); definitions in the
// kernels' .cuh/.cu files, explicit instantiations next to them.
#pragma once

#include "decode/decode.h"

namespace mla::decode {

// How the fp8 16-row kernel's sm90 variant copies a tile with TMA: not at all (cp.async rows), as
// one page of whole tiles (block_size % 64 == 0), or as 2-8 pages of block_size rows (block sizes
// 8, 16, 32). (DecodeParams::kv_map / scale_map, built by the dispatcher.)
enum TmaTiles : int { kTmaNone = 0, kTmaWholePage = 1, kTmaPages = 2 };

namespace portable {
// portable/decode_split.cuh: mma.sync, kBlockM = 16, 32 or 64 query rows per CTA, every format
// (fp8 formats dequantised into a 16-bit tile).
template <typename T, CacheFormat kFormat, int kBlockM>
void launch_decode_split(const DecodeParams& p);
}  // namespace portable

namespace fp8_16rows {
// fp8_16rows/decode_split_fp8.cuh: fp8 / fp8_ds_mla caches, 16 query rows per CTA, e4m3 converted
// in registers. kRowThreads: threads per cache row of the row copies (8 for fp8_ds_mla, 4 for
// fp8); kQkWgmma: QK^T on fp8 wgmma (sm90a, bf16 q); kTma: the tile copies of that variant;
// kRawRows: rows copied byte for byte by bulk copies (mma.sync variant, packed rows, block sizes
// that are multiples of 16).
template <typename T, CacheFormat kFormat, int kRowThreads, bool kQkWgmma, int kTma, bool kRawRows>
void launch_decode_split_fp8(const DecodeParams& p);
// Threads per cache row of the row copies, by format (H200, memory-bound b128 x 4096, same run:
// fp8_ds_mla 150.7 us with 4, 145.5 us with 8: 656-byte rows, 128 contiguous bytes per row and warp
// instruction; fp8 107.6 us with 4, 112.7 us with 8: more registers, and its 36 chunks do not
// split evenly over 8 threads).
template <CacheFormat kFormat>
inline constexpr int kRowThreads = kFormat == CacheFormat::kFp8DsMla ? 8 : 4;
}  // namespace fp8_16rows

namespace hopper {
// sm90/decode_split_wgmma.cu: 64 query rows, S and P V on wgmma, cp.async tiles; every format.
template <typename T, CacheFormat kFormat>
void launch_decode_split_wgmma(const DecodeParams& p);
// sm90/decode_split_wgmma_pairs.cu: 64 query rows of a 16-bit cache, or of fp8_ds_mla with bf16 q,
// with TMA tiles (the tensor maps built: p.tma_box_rows = 64, or 8, 16, 32), the key tiles taken by
// the two warpgroups in turns.
template <typename T, CacheFormat kFormat>
void launch_decode_split_wgmma_pairs(const DecodeParams& p);
}  // namespace hopper

}  // namespace mla::decode
