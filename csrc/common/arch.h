// Which GPU we run on (cached per device), and whether the portable path is forced.
#pragma once

namespace mla {

struct DeviceInfo {
  int sm_version;          // major * 10 + minor, e.g. 90 for H100/H200, 100 for B200
  int num_sms;             // multiprocessor count
  int max_smem_per_block;  // opt-in dynamic shared memory limit, bytes
};

// Throws on a CUDA error. Thread-safe; queries each device once.
const DeviceInfo& device_info(int device);

// Opts `kernel` in to at least `bytes` of dynamic shared memory on `device` (the current device):
// the attribute is per device, and setting it is a driver call that would otherwise cost host time
// on every launch, so it is set only when a launch needs more than before. Throws on a CUDA error.
void opt_in_smem(const void* kernel, int bytes, int device);

// Whether ops that have an architecture-specific path (sm90 wgmma/TMA) take the portable one
// (mma.sync: what sm100 runs), so that code is tested on an H200 too. The environment variable
// MLA_EXT_FORCE_PORTABLE (set to a non-empty value other than "0") decides, read once, unless
// set_force_portable overrides it.
bool force_portable();
// mode 1 / 0: force the portable path on / off; -1: back to the environment variable's value.
// (Exported as the C symbols mla_ext_set_force_portable and mla_ext_force_portable, which returns
// force_portable() as 0 / 1, for mla_ext's tests.)
void set_force_portable(int mode);

}  // namespace mla
