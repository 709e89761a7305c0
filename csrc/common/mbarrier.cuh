// mbarriers and the asynchronous copies that complete on them: cp.async arrivals, bulk copies
// (cp.async.bulk, counted in bytes), and the fence between generic and async proxies. These are
// sm90+ instructions that every target of the build has (sm90 and sm100), so kernels of every
// target may use them (the portable fp8 16-row decode kernel does); what only sm_90a has (wgmma,
// the TMA tensor copies of the sm90 kernels) is in common/sm90/.
#pragma once

#include <cstdint>

namespace mla {

// A phase of `bar` (8 bytes of shared memory) completes after `count` arrivals (plus, with
// transaction counts, the announced bytes).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (bulk copies complete transactions on them).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and announces `bytes` of copy transactions that complete the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// The thread's arrival once all the cp.async it issued before have landed (.noinc: this arrival
// is one of the `count`).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Whether the phase with parity `parity` has completed (acquire: what completed it is visible to this
// thread when it has), without waiting.
__device__ __forceinline__ bool mbar_test_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Spins until the phase with parity `parity` has completed. A fresh barrier counts as having
// completed the phase of parity 1, so a producer's first wait on an "empty" barrier passes.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Bulk copy global -> shared of `bytes` (a multiple of 16, both addresses 16-byte aligned),
// completing `bytes` transactions on mbarrier `bar`: one instruction per contiguous run instead
// of one 16-byte cp.async per thread and chunk.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// Generic-proxy accesses to shared memory (st.shared, cp.async) are ordered with the async proxy
// (bulk copies into the same bytes, wgmma reading them) only after this fence (then a barrier
// orders them across threads).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace mla
