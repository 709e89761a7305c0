#include "common/arch.h"

#include <cuda_runtime.h>

#include <atomic>
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

void opt_in_smem(const void* kernel, int bytes, int device) {
  struct Done {
    const void* kernel;
    int bytes, device;
  };
  static std::mutex mutex;
  static std::vector<Done> done;  // a few dozen kernels x devices
  std::lock_guard<std::mutex> lock(mutex);
  for (const Done& d : done)
    if (d.kernel == kernel && d.bytes == bytes && d.device == device) return;
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.push_back({kernel, bytes, device});
}

namespace {
// -1: not decided yet; 0 / 1 after the first force_portable() (from the environment) or an override.
std::atomic<int> g_force_portable{-1};
int force_portable_env() {
  const char* v = std::getenv("MLA_EXT_FORCE_PORTABLE");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0 ? 1 : 0;
}
}  // namespace

bool force_portable() {
  int mode = g_force_portable.load(std::memory_order_relaxed);
  if (mode < 0) {
    mode = force_portable_env();
    g_force_portable.store(mode, std::memory_order_relaxed);
  }
  return mode != 0;
}

void set_force_portable(int mode) { g_force_portable.store(mode < 0 ? force_portable_env() : mode != 0); }

}  // namespace mla

extern "C" __attribute__((visibility("default"))) void mla_ext_set_force_portable(int mode) {
  mla::set_force_portable(mode);
}
