// Division by a runtime divisor that is fixed for a whole launch (the cache's block_size), as a
// multiply-high and a shift instead of the ~20-instruction integer division sequence the compiler
// emits for `n / d`. The kernels divide every key position by block_size to find its page.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MLA_HOST_DEVICE __host__ __device__
#else
#define MLA_HOST_DEVICE
#endif

namespace mla {

// Exact for 0 <= n < 2^31 and 1 <= d < 2^31 (round-up method: with l = ceil(log2 d) and
// mul = floor(2^32 (2^l - d) / d) + 1, n / d = (mulhi(n, mul) + n) >> l; the sum fits in 32 bits
// because mulhi(n, mul) < n < 2^31).
struct FastDivmod {
  int32_t divisor = 1;
  uint32_t mul = 0;
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(int32_t d) : divisor(d) {
    uint32_t l = 0;
    while (l < 31 && (uint64_t{1} << l) < static_cast<uint64_t>(d)) ++l;
    shift = l;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << l) - static_cast<uint64_t>(d))) /
                                    static_cast<uint64_t>(d) + 1);
  }

  MLA_HOST_DEVICE int32_t div(int32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(static_cast<uint32_t>(n), mul);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{static_cast<uint32_t>(n)} * mul) >> 32);
#endif
    return static_cast<int32_t>((hi + static_cast<uint32_t>(n)) >> shift);
  }
  MLA_HOST_DEVICE int32_t mod(int32_t n, int32_t quotient) const { return n - quotient * divisor; }
};

}  // namespace mla
