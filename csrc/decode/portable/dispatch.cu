// Host dispatch of the portable split kernel: q dtype x cache format x rows per CTA.
#include "common/dispatch.h"
#include "decode/decode.h"

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

void run_decode_split_portable(const DecodeParams& params, bool sm90) {
  DecodeParams p = params;
  p.block_div = FastDivmod(p.block_size);  // every kernel maps key positions to pages with it
  const int block_m = block_m_for(p.num_rows, p.format);
  MLA_DISPATCH_HALF_TYPES(p.q_dtype, "q", [&] {
    MLA_DISPATCH_CACHE_FORMAT(p.format, [&] {
      switch (block_m) {
        case 16:
          // fp8 caches: the kernel that converts e4m3 in registers (memory-bound decode).
          if constexpr (kFormat == CacheFormat::kAuto) return portable::launch_decode_split<scalar_t, kFormat, 16>(p);
          // (sm90 with bf16 q: QK^T on wgmma, q as two e4m3 terms, exact for bf16 but not for
          // fp16's 11 bits.)
          else if (sm90 && std::is_same_v<scalar_t, __nv_bfloat16>) return portable::launch_decode_split_fp8<scalar_t, kFormat, true>(p);
          else return portable::launch_decode_split_fp8<scalar_t, kFormat, false>(p);
        case 32: return portable::launch_decode_split<scalar_t, kFormat, 32>(p);
        case 64: return portable::launch_decode_split<scalar_t, kFormat, 64>(p);
        default: throw std::runtime_error("mla_ext: unsupported decode block_m " + std::to_string(block_m));
      }
    });
  });
}

}  // namespace mla::decode
