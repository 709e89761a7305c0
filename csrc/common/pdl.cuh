// Programmatic dependent launch (sm90 and newer; no-ops before): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization (launch_dependent below) may be scheduled while
// the kernel before it in the stream still runs, once every CTA of that one has called
// pdl_launch_dependents or exited, and must call pdl_wait_prerequisites before it reads what that
// kernel writes. Only CTAs already running can have called it, so an early call cannot keep a later
// CTA of the primary grid from being scheduled.
//
// The split combine is launched so after the dense split kernels and the sparse decode kernels,
// which call pdl_launch_dependents first thing: the combine's launch, its reads of the plan and its
// CTAs with nothing to merge overlap them. Those kernels are launched with the attribute too (a
// cheaper launch on the host, and their start overlaps the kernel before), so they call
// pdl_wait_prerequisites just before it: a CTA lets the combine launch only once the kernels before
// it (the plan's, a V4 gather) have completed and their writes are visible, since the combine reads
// the plan before its own wait.
#pragma once

#include <cuda_runtime.h>

#include "common/launch.h"

namespace mla {

// Launches `kernel<<<grid, block, smem_bytes, stream>>>(params)` as a programmatic dependent of the
// kernel before it in the stream (through the driver: common/launch.h). Every target built (sm90,
// sm100) has PDL.
template <typename Params>
void launch_dependent(void (*kernel)(Params), dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream,
                      const Params& params) {
  void* args[] = {const_cast<Params*>(&params)};
  launch_kernel(reinterpret_cast<const void*>(kernel), grid, block, smem_bytes, stream, args, /*dependent=*/true);
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the prerequisite grids have completed and their memory operations are visible.
__device__ __forceinline__ void pdl_wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace mla
