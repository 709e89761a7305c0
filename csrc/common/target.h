// Which device pass is being compiled. Device code for one architecture is guarded by these
// macros and traps in the other passes, so one fat binary builds for every target.
#pragma once

// True in the device pass for sm_90a, where wgmma exists (and where the sm90 kernels' bodies are).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_SM90A 1
#else
#define MLA_SM90A 0
#endif
