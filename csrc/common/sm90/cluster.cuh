// sm90 thread-block clusters: this CTA's rank, peer shared-memory addresses, asynchronous stores into
// a peer CTA's shared memory that complete bytes on its mbarrier (st.async), arrivals on a peer's
// mbarrier, and the cluster-wide barrier. Compiled only into sm_90a code (callers guard with
// MLA_SM90A).
#pragma once

#include <cstdint>

namespace mla::sm90 {

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The shared::cluster address of the same shared-memory location (a shared::cta address) in CTA `rank`.
__device__ __forceinline__ uint32_t peer_smem_addr(uint32_t smem_addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr), "r"(rank));
  return r;
}

// 16 / 4 bytes into another CTA's shared memory (shared::cluster addresses), counted as transaction
// bytes on its mbarrier `bar`.
__device__ __forceinline__ void st_async_128(uint32_t addr, const uint4& v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(addr),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void st_async_32(uint32_t addr, uint32_t v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr), "r"(v), "r"(bar)
               : "memory");
}

// Arrival (release, cluster scope) on an mbarrier of another CTA (shared::cluster address).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Every thread of every CTA of the cluster (release / acquire): before a CTA's shared memory is
// written by its peers (their mbarriers initialised) and before it exits (their last writes done).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

}  // namespace mla::sm90
