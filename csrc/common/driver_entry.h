// CUDA driver functions, looked up through the runtime (the library needs no -lcuda).
#pragma once

#include <cuda_runtime.h>

namespace mla {

// The driver entry point `name` of ABI `version` as a `Fn` (a PFN_... type of cudaTypedefs.h), or
// nullptr when the driver has none. Callers look it up once (a function-local static).
template <typename Fn>
Fn driver_entry(const char* name, int version) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &found);
  return err == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<Fn>(f) : nullptr;
}

}  // namespace mla
