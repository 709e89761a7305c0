// Pieces of the sm90 64-head sparse kernels (V3 fp8_ds_mla and DeepSeek-V4, sparse_decode_sm90_fp8.cu)
// that do not depend on the cache format: the online softmax of one tile of kKeys keys and the
// epilogue. Both use the wgmma m64nN accumulator layout: element 4 i + e of a thread (kKeys / 2 of
// them) is row 16 wq + lane / 4 + 8 (e / 2), column 8 i + 2 qd + e % 2 (wq = warp in the warpgroup,
// qd = lane % 4), so a row's keys sit in one quad of lanes.
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "common/attn_sink.cuh"
#include "common/sm80.cuh"
#include "common/types.h"
#include "sparse/sparse_decode.h"

namespace mla::sparse::m64 {

// Online softmax of one tile (exp2 domain; sc: kVals = keys / 2 values): S becomes P = 2^(s row_scale - m) in place, masked keys
// (valid[key] == 0) 0; m_run and l_run (this thread's share of the row sum) advance, corr is the
// factor the rows' O must be rescaled by. Scores are scaled first and masked with selects: a masked
// score never turns into NaN, a NaN score of a counted entry propagates through the row sum; the row
// max is the max of the scaled scores, so 2^(s - m) <= 1 holds exactly and the max key's P is 1.
template <int kVals>
__device__ __forceinline__ void online_softmax(float (&sc)[kVals], const int* valid, int qd, const float (&row_scale)[2],
                                               float (&m_run)[2], float (&l_run)[2], float (&corr)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < kVals / 4; ++i) {
    const int2 ok = *reinterpret_cast<const int2*>(valid + 8 * i + 2 * qd);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool k_ok = (e & 1) ? ok.y : ok.x;
      sc[4 * i + e] = k_ok ? sc[4 * i + e] * row_scale[e / 2] : -INFINITY;
      mx[e / 2] = fmaxf(mx[e / 2], sc[4 * i + e]);
    }
  }
  float m_use[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
    mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
    const float m_new = fmaxf(m_run[hh], mx[hh]);
    m_use[hh] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: exp2(-inf - 0) = 0
    corr[hh] = sm80::fast_exp2(m_run[hh] - m_use[hh]);
    m_run[hh] = m_new;
    l_run[hh] *= corr[hh];
  }
#pragma unroll
  for (int i = 0; i < kVals; ++i) {
    sc[i] = sm80::fast_exp2(sc[i] - m_use[i % 4 / 2]);
    l_run[i % 4 / 2] += sc[i];
  }
}

// Epilogue of a CTA of 64 heads from h0: each warpgroup writes its two 128-column value tiles
// (O of tile v times v_scale[v], columns 256 wg + 128 v ..) of the thread's two rows, normalised,
// with the sink applied by whole CTAs; to out (bf16) and lse when the CTA covers the token's whole
// list, else to the split's fp32 partials (partial_row0: its first row).
__device__ __forceinline__ void store_rows(const SparseDecodeParams& p, bool whole, int bs, int b, int s, int64_t partial_row0,
                                           int h0, int r_lo, int wg, int qd, const float (&m_run)[2], float (&l_run)[2],
                                           const float (&o)[2][64], const float (&v_scale)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l_run[hh] += __shfl_xor_sync(0xffffffffu, l_run[hh], 1);
    l_run[hh] += __shfl_xor_sync(0xffffffffu, l_run[hh], 2);
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int h = h0 + r_lo + 8 * hh;
    if (h >= p.h_q) continue;
    const bool any = l_run[hh] != 0.f;  // 0: nothing attended; NaN (a NaN row attended) propagates
    const float inv = any ? 1.f / l_run[hh] : 0.f;
    const float lse = any ? (m_run[hh] + log2f(l_run[hh])) * 0.6931471805599453f : -INFINITY;
    const float sink = whole && p.attn_sink != nullptr ? attn_sink_factor(lse, p.attn_sink[h]) : 1.f;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const float f = inv * sink * v_scale[v];
      const int col = 256 * wg + 128 * v + 2 * qd;
      if (whole) {
        auto* out = static_cast<__nv_bfloat16*>(p.out) + ((int64_t(bs) * p.h_q + h) * kKvLoraRank + col);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * i) = __floats2bfloat162_rn(o[v][4 * i + 2 * hh] * f, o[v][4 * i + 2 * hh + 1] * f);
        }
      } else {
        float* out = p.partial_out + (partial_row0 + h) * kKvLoraRank + col;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          *reinterpret_cast<float2*>(out + 8 * i) = make_float2(o[v][4 * i + 2 * hh] * f, o[v][4 * i + 2 * hh + 1] * f);
        }
      }
    }
    if (wg == 0 && qd == 0) {
      if (whole) p.lse[(int64_t(b) * p.h_q + h) * p.s_q + s] = lse;
      else p.partial_lse[partial_row0 + h] = lse;
    }
  }
}

}  // namespace mla::sparse::m64
