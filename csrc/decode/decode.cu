// Decode host entry: shape helpers shared by planner and kernels, and the architecture dispatch.
#include "decode/decode.h"

#include <algorithm>

#include "common/arch.h"
#include "common/cuda_check.h"

namespace mla::decode {

int block_m_for(int num_rows, CacheFormat /*format*/) {
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

void run_decode(const DecodeParams& p, int device, bool force_portable) {
  const DeviceInfo& info = device_info(device);
  MLA_HOST_CHECK(info.sm_version >= 80, "decode needs sm80 or newer");
  // Only the portable path exists so far: an sm90 (wgmma/TMA) kernel will be chosen here when
  // info.sm_version == 90 && !force_portable. Until then both choices run the portable kernel.
  (void)force_portable;
  run_decode_split_portable(p);
  run_decode_combine(p);
}

}  // namespace mla::decode
