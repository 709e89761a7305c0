// Error checking for host code that launches kernels. No torch headers: errors are thrown as
// std::runtime_error, which the stable-ABI binding layer turns into a Python RuntimeError.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace mla {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string("mla_ext: CUDA error '") + cudaGetErrorString(err) + "' (" +
                           cudaGetErrorName(err) + ") from `" + expr + "` at " + file + ":" +
                           std::to_string(line));
}

}  // namespace mla

#define MLA_CUDA_CHECK(expr)                                              \
  do {                                                                    \
    cudaError_t mla_err_ = (expr);                                        \
    if (mla_err_ != cudaSuccess) {                                        \
      mla::throw_cuda_error(mla_err_, #expr, __FILE__, __LINE__);         \
    }                                                                     \
  } while (0)

// Call right after a <<<...>>> launch: reports bad launch configurations at the call site.
#define MLA_CHECK_LAUNCH() MLA_CUDA_CHECK(cudaGetLastError())

// Host-side precondition in kernel launchers (bindings validate user input first; this guards
// the launcher's own assumptions).
#define MLA_HOST_CHECK(cond, msg)                                                             \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw std::runtime_error(std::string("mla_ext: ") + (msg) + " (" #cond ") at " __FILE__); \
    }                                                                                         \
  } while (0)
