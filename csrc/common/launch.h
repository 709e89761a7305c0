// Kernel launches through the driver's cuLaunchKernelEx, with each kernel's function handle looked up
// once per device. On the H200's host a launch so costs 2.5 us against 3.8 us for the runtime's
// cudaLaunchKernelEx with the same attribute (the runtime maps the host stub to its function on
// every call); an op that launches a split kernel and a combine saves 2.5 us of its ~16.
#pragma once

#include <cuda_runtime.h>

namespace mla {

// Launches the __global__ function whose host stub is `kernel` with `args` (pointers to its
// parameters, as cudaLaunchKernel takes them) on `stream`; with `dependent`, as a programmatic
// dependent of the kernel before it in the stream (common/pdl.cuh). Captured by CUDA graphs as a
// runtime launch is. Throws std::runtime_error naming the driver's error.
void launch_kernel(const void* kernel, dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream, void** args,
                   bool dependent);

}  // namespace mla
