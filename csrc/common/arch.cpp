#include "common/arch.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/cuda_check.h"

namespace mla {

const DeviceInfo& device_info(int device) {
  static std::mutex mutex;
  static std::vector<DeviceInfo> cache;
  static std::vector<bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(cache.size())) {
    cache.resize(device + 1);
    known.resize(device + 1, false);
  }
  if (!known[device]) {
    DeviceInfo info{};
    int major = 0, minor = 0;
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, device));
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&info.max_smem_per_block,
                                          cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    info.sm_version = major * 10 + minor;
    cache[device] = info;
    known[device] = true;
  }
  return cache[device];
}

bool env_switched_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '0';
}

bool force_portable_from_env() {
  const char* v = std::getenv("MLA_EXT_FORCE_PORTABLE");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace mla
