#include "common/launch.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "common/cuda_check.h"
#include "common/driver_entry.h"

namespace mla {
namespace {

PFN_cuLaunchKernelEx_v11060 launcher() {
  static const PFN_cuLaunchKernelEx_v11060 fn = driver_entry<PFN_cuLaunchKernelEx_v11060>("cuLaunchKernelEx", 11060);
  return fn;
}

[[noreturn]] void throw_launch_error(CUresult err) {
  static const PFN_cuGetErrorName_v6000 name_of = driver_entry<PFN_cuGetErrorName_v6000>("cuGetErrorName", 6000);
  const char* name = nullptr;
  if (name_of == nullptr || name_of(err, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown error";
  throw std::runtime_error(std::string("mla_ext: kernel launch failed: ") + name + " (CUresult " +
                           std::to_string(static_cast<int>(err)) + ")");
}

// The kernel's function handle in the current context of `device` (cudaGetFuncBySymbol loads it
// there on first use). Entries are never removed: a few dozen kernels x devices.
CUfunction function_of(const void* kernel, int device) {
  struct KeyHash {
    size_t operator()(const std::pair<const void*, int>& k) const {
      return std::hash<const void*>()(k.first) ^ (static_cast<size_t>(k.second) << 1);
    }
  };
  static std::mutex mutex;
  static std::unordered_map<std::pair<const void*, int>, CUfunction, KeyHash> functions;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = functions.try_emplace({kernel, device}, nullptr);
  if (inserted) {
    cudaFunction_t f = nullptr;
    const cudaError_t err = cudaGetFuncBySymbol(&f, kernel);
    if (err != cudaSuccess) {
      functions.erase(it);
      MLA_CUDA_CHECK(err);
    }
    it->second = reinterpret_cast<CUfunction>(f);
  }
  return it->second;
}

}  // namespace

void launch_kernel(const void* kernel, dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream, void** args,
                   bool dependent) {
  const PFN_cuLaunchKernelEx_v11060 launch = launcher();
  if (launch == nullptr) {  // a driver without the entry point: the runtime's launch
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = dependent ? 1 : 0;
    MLA_CUDA_CHECK(cudaLaunchKernelExC(&cfg, kernel, args));
    return;
  }
  int device = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device));
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg{};
  cfg.gridDimX = grid.x;
  cfg.gridDimY = grid.y;
  cfg.gridDimZ = grid.z;
  cfg.blockDimX = block.x;
  cfg.blockDimY = block.y;
  cfg.blockDimZ = block.z;
  cfg.sharedMemBytes = static_cast<unsigned>(smem_bytes);
  cfg.hStream = reinterpret_cast<CUstream>(stream);
  cfg.attrs = &attr;
  cfg.numAttrs = dependent ? 1 : 0;
  const CUresult err = launch(&cfg, function_of(kernel, device), args, nullptr);
  if (err != CUDA_SUCCESS) throw_launch_error(err);
}

}  // namespace mla
