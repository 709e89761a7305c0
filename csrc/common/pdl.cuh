// Programmatic dependent launch (sm90 and newer; no-ops before): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization (the split combine) may be scheduled while the
// kernel before it in the stream (a split kernel) still runs, once every CTA of that one has called
// pdl_launch_dependents or exited, and must call pdl_wait_prerequisites before it reads what that
// kernel writes. Only CTAs already running can have called it, so an early call cannot keep a later
// CTA of the primary grid from being scheduled. The dense split kernels call it first thing, so the
// combine's launch, its reads of the plan and its CTAs with nothing to merge overlap them. They are
// launched with the attribute too (a cheaper launch on the host), so they call
// pdl_wait_prerequisites just before it: a CTA lets the combine launch only once the kernels before
// the split kernel (the plan's among them) have completed and their writes are visible, since the
// combine reads the plan before its own wait.
#pragma once

namespace mla {

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
