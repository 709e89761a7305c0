// Which GPU we run on, and whether the portable path is forced. Cached per device.
#pragma once

namespace mla {

struct DeviceInfo {
  int sm_version;          // major * 10 + minor, e.g. 90 for H100/H200, 100 for B200
  int num_sms;             // multiprocessor count
  int max_smem_per_block;  // opt-in dynamic shared memory limit, bytes
};

// Throws on a CUDA error. Thread-safe; queries each device once.
const DeviceInfo& device_info(int device);

// True when MLA_EXT_FORCE_PORTABLE is set to a non-empty value other than "0": kernels that have
// an architecture-specific path (sm90 wgmma/TMA) take the portable mma.sync path instead. This is
// how the code sm100 runs is tested on an H200.
bool force_portable_from_env();

// True when the environment variable `name` is set to a value starting with '0': how the decode
// path's switches (MLA_EXT_DECODE_WGMMA, _PAIRS, _TMA_TILES, _BULK_ROWS) turn a default path off.
bool env_switched_off(const char* name);

}  // namespace mla
