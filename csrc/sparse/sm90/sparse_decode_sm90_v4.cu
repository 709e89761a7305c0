// DeepSeek-V4 sparse decode on sm90a, fused: fp8_ds_mla pools (584-byte tokens), 64-head tiles, the
// three-warpgroup kernel of sparse_decode_sm90_fp8.cu with V4Rows (both pools' rows gathered and
// converted once, 512-wide heads whose value is the whole row). Here: when it runs, and its launch.
#include "common/arch.h"
#include "common/cuda_check.h"
#include "sparse/sparse_decode.h"
#include "sparse/v4_decode.h"

namespace mla {
namespace sparse {
// Compiled in sparse_decode_sm90_fp8.cu.
int sm90_v4_smem_bytes();
void launch_sparse_decode_sm90_v4(const V4FusedParams& fp);
}  // namespace sparse

bool v4_fused_supported(int device, int h_q) {
  const DeviceInfo& info = device_info(device);
  return info.sm_version == 90 && !force_portable() && h_q > 32 && sparse::sm90_v4_smem_bytes() <= info.max_smem_per_block;
}

void run_sparse_decode_v4_fused(const V4FusedParams& fp, int device) {
  const SparseDecodeParams& p = fp.sparse;
  MLA_HOST_CHECK(p.num_splits >= 1 && p.tiles_per_split >= 1, "plan_sparse_decode() must run first");
  MLA_HOST_CHECK(p.num_splits == 1 || (p.partial_out != nullptr && p.partial_lse != nullptr),
                 "a split plan needs partial_out and partial_lse");
  if (p.batch == 0 || p.s_q == 0 || p.h_q == 0) return;
  MLA_HOST_CHECK(int64_t(p.batch) * p.s_q <= 65535, "sparse decode supports b * s_q <= 65535 query tokens per call");
  V4FusedParams params = fp;
  for (int i = 0; i < 2; ++i) {
    MLA_HOST_CHECK(fp.pool[i].topk == 0 || (fp.pool[i].block_size >= 1 && fp.pool[i].num_slots < (int64_t{1} << 31)),
                   "cache pages of 1 .. 2^31 - 1 tokens");
    params.block_div[i] = FastDivmod(static_cast<int32_t>(fp.pool[i].topk > 0 ? fp.pool[i].block_size : 1));
  }
  sparse::launch_sparse_decode_sm90_v4(params);
  if (p.num_splits > 1) run_sparse_combine(p, device_info(device).num_sms);
}

}  // namespace mla
