// The attention-sink factor of DeepSeek V3.2-style sinks, shared by the decode kernels, the sparse
// kernels and the split combine: a sink adds e^sink to a row's softmax denominator, so the output
// is scaled by e^lse / (e^lse + e^sink) and lse is reported unchanged.
#pragma once

#include <cmath>

namespace mla {

// 1 / (1 + e^(sink - lse)) with lse in natural log: +inf sink -> 0, -inf sink -> 1; a row that
// attended nothing (lse -inf) -> 0 (its output is 0 anyway).
__device__ __forceinline__ float attn_sink_factor(float lse, float sink) {
  if (lse == -INFINITY) return 0.f;
  return 1.f / (1.f + expf(sink - lse));
}

}  // namespace mla
