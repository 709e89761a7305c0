#include "common/arch.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/cuda_check.h"

namespace mla {

namespace {
// Enough for any node; device_info refuses higher indices. Entries never move, so the references
// device_info hands out stay valid while other threads fill other devices' entries.
constexpr int kMaxDevices = 64;
}  // namespace

const DeviceInfo& device_info(int device) {
  static DeviceInfo cache[kMaxDevices];
  static std::once_flag known[kMaxDevices];
  MLA_HOST_CHECK(device >= 0 && device < kMaxDevices, "device index out of range");
  std::call_once(known[device], [device] {
    DeviceInfo info{};
    int major = 0, minor = 0;
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, device));
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&info.max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    info.sm_version = major * 10 + minor;
    cache[device] = info;
  });
  return cache[device];
}

void opt_in_smem(const void* kernel, int bytes, int device) {
  // The attribute is one value per (kernel, device): remember the largest set, and raise it when a
  // launch needs more (a smaller request is already covered).
  struct Set {
    const void* kernel;
    int device, bytes;
  };
  static std::mutex mutex;
  static std::vector<Set> set;  // a few dozen kernels x devices
  std::lock_guard<std::mutex> lock(mutex);
  for (Set& e : set) {
    if (e.kernel != kernel || e.device != device) continue;
    if (bytes > e.bytes) {
      MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      e.bytes = bytes;
    }
    return;
  }
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  set.push_back({kernel, device, bytes});
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

extern "C" __attribute__((visibility("default"))) int mla_ext_force_portable() { return mla::force_portable() ? 1 : 0; }
