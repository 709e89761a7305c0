// Host dispatch of the portable split kernel: q dtype x cache format x rows per CTA.
#include "common/dispatch.h"
#include "decode/decode.h"

#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mla::decode {
namespace portable {
// Defined in decode_split.cuh, instantiated in instantiations/split_<format>.cu.
template <typename T, CacheFormat kFormat, int kBlockM>
void launch_decode_split(const DecodeParams& p);
// Defined in decode_split_fp8.cuh (fp8 caches, 16 rows per CTA), in instantiations/split_fp8_16.cu.
template <typename T, CacheFormat kFormat>
void launch_decode_split_fp8(const DecodeParams& p);
}  // namespace portable

void run_decode_split_portable(const DecodeParams& params) {
  DecodeParams p = params;
  p.block_div = FastDivmod(p.block_size);  // every kernel maps key positions to pages with it
  const int block_m = block_m_for(p.num_rows, p.format);
  MLA_DISPATCH_HALF_TYPES(p.q_dtype, "q", [&] {
    MLA_DISPATCH_CACHE_FORMAT(p.format, [&] {
      switch (block_m) {
        case 16:
          // fp8 caches: the kernel that converts e4m3 in registers (memory-bound decode).
          if constexpr (kFormat == CacheFormat::kAuto) return portable::launch_decode_split<scalar_t, kFormat, 16>(p);
          else return portable::launch_decode_split_fp8<scalar_t, kFormat>(p);
        case 32: return portable::launch_decode_split<scalar_t, kFormat, 32>(p);
        case 64: return portable::launch_decode_split<scalar_t, kFormat, 64>(p);
        default: throw std::runtime_error("mla_ext: unsupported decode block_m " + std::to_string(block_m));
      }
    });
  });
}

}  // namespace mla::decode
