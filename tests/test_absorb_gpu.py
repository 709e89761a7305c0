"""Absorbed-projection kernels against the fp32 reference on the GPU."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from bad_inputs import q_absorb_cases, v_up_cases
from conftest import EnumArg, assert_close, is_sm90, kernel_is, launched_kernels, num_sms, use_path

import mla_ext
from mla_ext import reference

pytestmark = pytest.mark.gpu

P, V, L, R = 128, 128, 512, 64
# Token counts per tier of csrc/absorb/absorb.cu tier_for: <= 16 (tier 0), 17..32 (tier 1: BM = 32),
# 33..512 (tier 2), > 512 (tier 3).
TOKENS = (1, 7, 24, 32, 64, 257, 4096)
HEADS = (1, 16, 128)
# Against the reference on the same bf16 weights: one bf16 rounding of the output (2^-9
# relative) plus fp32 summation order. fp8 weights are dequantised in the kernel to bf16(w * s),
# exactly the bf16 weights prepare_absorb_weights returns, so the same tolerance applies; against
# the fp32 dequantised weights the weights' own bf16 rounding adds up to ~0.02 (measured
# on the CPU with these distributions), hence FP32_W_TOL.
TOL = dict(cos_tol=1e-5, atol=2e-3, rtol=8e-3)
FP32_W_TOL = dict(cos_tol=2e-5, atol=6e-2, rtol=2e-2)


def _weights(h: int, fp8: bool) -> mla_ext.AbsorbWeights:
    if fp8:
        w8 = (torch.randn(h * (P + V), L, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
        # scales of very different sizes per block, so a wrong block index shows up
        scales = torch.rand(h * (P + V) // 128, L // 128, device="cuda") * 2e-3 + 1e-4
        return mla_ext.prepare_absorb_weights(w8, h, scales)
    return mla_ext.prepare_absorb_weights((torch.randn(h * (P + V), L, device="cuda") / math.sqrt(L)).bfloat16(), h)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("h", HEADS)
@pytest.mark.parametrize("t", TOKENS)
def test_q_absorb(t, h, fp8):
    w = _weights(h, fp8)
    # q_nope and q_pe as views of one [T, H, 192] tensor, as q_b_proj + RoPE leave them
    q = torch.randn(t, h, P + R, device="cuda", dtype=torch.bfloat16)
    q_nope, q_pe = q[..., :P], q[..., P:]
    w_uk_t, scale = w.uk(fp8)
    out = mla_ext.q_absorb(q_nope, q_pe, w_uk_t, scale)
    assert out.shape == (t, h, L + R) and out.is_contiguous()
    assert torch.equal(out[..., L:], q_pe), "q_pe must be copied bit-exactly"
    ref = reference.q_absorb(q_nope.float(), q_pe.float(), w.w_uk_t)  # fp32 out, bf16 weights
    assert_close(out, ref, name=f"q_absorb T={t} H={h}", **TOL)
    if fp8:
        ref32 = reference.q_absorb(q_nope.float(), q_pe.float(), w_uk_t, scale)
        assert_close(out, ref32, name=f"q_absorb T={t} H={h} vs fp32 weights", **FP32_W_TOL)


# v_up's kernel is a function of T, H, the weight dtype and the path (csrc/absorb/absorb.cu
# pick_v_up_kernel); "default" is the environment's path (on an H200 unforced: the sm90 kernels),
# "portable" forced portable (what sm100 runs: the K-split kernel or the tiles). Token counts: the BM
# boundaries of the kernels (16/17, 32/33, 64/65), the sizes where the K-split and streamed-weight
# kernels change BN at H = 16 (128/129, 256/257), the boundaries of the choice (32/33, 64/65,
# 128/129, 256/257 at H = 128; 128/129, 512/513 at H < 96), odd sizes (7, 257), 4096 and a large T
# with a partial last tile for every BM (4097). Heads: 1, 16 and 128, and 40 and 72 (H < 96 whose
# 64-row tiles do not fit one wave: the resident-weight TMA and the K-split kernels with bf16 weights).
V_UP_TOKENS = (1, 7, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 513, 4096, 4097)
V_UP_HEADS = (1, 16, 40, 72, 128)


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("h", V_UP_HEADS)
@pytest.mark.parametrize("t", V_UP_TOKENS)
def test_v_up(t, h, fp8, path, request):
    use_path(request, path)
    w = _weights(h, fp8)
    # the latent output as a strided view (rows of 640), values of attention-output size
    x = torch.randn(t, h, 640, device="cuda", dtype=torch.bfloat16)[..., :L]
    w_uv, scale = w.uv(fp8)
    out = mla_ext.v_up(x, w_uv, scale)
    assert out.shape == (t, h, V) and out.is_contiguous()
    assert_close(out, reference.v_up(x.float(), w.w_uv), name=f"v_up T={t} H={h} {path}", **TOL)
    if fp8:
        assert_close(out, reference.v_up(x.float(), w_uv, scale), name=f"v_up T={t} H={h} vs fp32 weights", **FP32_W_TOL)


def _ksplit(fp8, bm, bn):
    return "v_up_ksplit_kernel", "KSplitConfig", (fp8, bm, bn)


def _tiles(fp8, bm):  # absorb_gemm.h's v_up tiers: BM x 128 tiles (warps and stages unchecked)
    return "absorb_gemm_kernel", "absorb::Config", (EnumArg(1, "kVUp"), fp8, bm, 128)


def _wgmma(fp8):
    return "v_up_wgmma_kernel", "WgmmaVUpConfig", (fp8,)


def _tma(fp8, bm):  # one consumer warpgroup per 64 rows
    return "v_up_tma_kernel", "TmaVUpConfig", (fp8, bm // 64)


def _stream(bn):  # 64-row tiles: one consumer warpgroup
    return "v_up_tma_stream_kernel", "TmaStreamVUpConfig", (1, bn)


@dataclasses.dataclass(frozen=True)
class VUpCase:
    """A v_up shape and the kernel it runs on an H200 (132 SMs) on its path ("arch": sm90 not forced;
    "portable": forced). ``broadcast``: x the same for every head (head stride 0), which the TMA
    kernels' tensor maps cannot express: the cp.async wgmma kernel runs instead."""

    id: str
    t: int
    h: int
    fp8: bool
    path: str
    kernel: tuple
    broadcast: bool = False

    def x(self, width: int = 520):
        if self.broadcast:
            return torch.randn(self.t, 1, L, device="cuda", dtype=torch.bfloat16).expand(self.t, self.h, L)
        return torch.randn(self.t, self.h, width, device="cuda", dtype=torch.bfloat16)[..., :L]


BF16, FP8 = False, True
V_UP_CASES = {c.id: c for c in [
    # K split over a CTA's warps (H < 96, T <= 128): BM 16 up to 16 tokens, else 64; BN for about one
    # CTA per SM (132 // (H * M tiles): >= 8 -> 16, >= 4 -> 32, >= 2 -> 64, else 128).
    VUpCase("ksplit_bm16_bn16", 7, 16, BF16, "arch", _ksplit(BF16, 16, 16)),
    VUpCase("ksplit_bm16_bn32", 1, 20, FP8, "arch", _ksplit(FP8, 16, 32)),
    VUpCase("ksplit_bm16_bn64", 16, 40, BF16, "arch", _ksplit(BF16, 16, 64)),
    VUpCase("ksplit_bm16_bn128", 5, 72, FP8, "arch", _ksplit(FP8, 16, 128)),
    VUpCase("ksplit_bm64_bn16", 33, 1, FP8, "arch", _ksplit(FP8, 64, 16)),
    VUpCase("ksplit_bm64_bn32", 100, 16, FP8, "arch", _ksplit(FP8, 64, 32)),
    VUpCase("ksplit_bm64_bn64", 24, 40, FP8, "arch", _ksplit(FP8, 64, 64)),
    VUpCase("ksplit_bm64_bn128", 65, 72, BF16, "arch", _ksplit(BF16, 64, 128)),  # 144 CTAs: no streamed weights
    # bf16 weights, T > 16 (H < 96) or > 32, 64-row tiles of all heads in one wave: streamed weights.
    VUpCase("stream_bn32", 33, 16, BF16, "arch", _stream(32)),
    VUpCase("stream_bn64", 200, 16, BF16, "arch", _stream(64)),
    VUpCase("stream_bn128", 64, 128, BF16, "arch", _stream(128)),
    # Resident weights by TMA: 64-row tiles (H < 96 up to T = 512, H >= 96 up to 64, and the paced
    # schedule at H >= 96, T 129-256, bf16), 128-row tiles beyond.
    VUpCase("tma64_fp8", 130, 3, FP8, "arch", _tma(FP8, 64)),
    VUpCase("tma64_bf16", 257, 40, BF16, "arch", _tma(BF16, 64)),
    VUpCase("tma64_h128_fp8", 64, 128, FP8, "arch", _tma(FP8, 64)),
    VUpCase("tma64_paced", 200, 128, BF16, "arch", _tma(BF16, 64)),
    VUpCase("tma128_fp8", 200, 128, FP8, "arch", _tma(FP8, 128)),
    VUpCase("tma128_bf16", 257, 128, BF16, "arch", _tma(BF16, 128)),
    VUpCase("tma128_h20_fp8", 600, 20, FP8, "arch", _tma(FP8, 128)),
    # cp.async wgmma: H >= 96, T 65-128, and where the tensor maps are refused.
    VUpCase("wgmma_bf16", 100, 128, BF16, "arch", _wgmma(BF16)),
    VUpCase("wgmma_fp8", 65, 100, FP8, "arch", _wgmma(FP8)),
    VUpCase("wgmma_for_tma64", 200, 16, FP8, "arch", _wgmma(FP8), broadcast=True),
    VUpCase("wgmma_for_stream", 33, 16, BF16, "arch", _wgmma(BF16), broadcast=True),
    # The tiles (all of N per CTA): H >= 96 up to T = 32.
    VUpCase("tiles_bm16", 1, 100, BF16, "arch", _tiles(BF16, 16)),
    VUpCase("tiles_bm32", 20, 128, FP8, "arch", _tiles(FP8, 32)),
    # Forced portable: H < 96 the K split up to T = 512, else the tiles; H >= 96 the tiles.
    VUpCase("portable_ksplit_bm16", 9, 16, BF16, "portable", _ksplit(BF16, 16, 16)),
    VUpCase("portable_ksplit_bm64_bn64", 130, 16, BF16, "portable", _ksplit(BF16, 64, 64)),
    VUpCase("portable_ksplit_bm64_bn128", 300, 20, FP8, "portable", _ksplit(FP8, 64, 128)),
    VUpCase("portable_tiles_bm16", 16, 128, FP8, "portable", _tiles(FP8, 16)),
    VUpCase("portable_tiles_bm64", 100, 128, BF16, "portable", _tiles(BF16, 64)),
    VUpCase("portable_tiles_bm128", 600, 16, BF16, "portable", _tiles(BF16, 128)),
    VUpCase("portable_tiles_h128_bm128", 513, 128, FP8, "portable", _tiles(FP8, 128)),
]}


@pytest.mark.parametrize("case", V_UP_CASES.values(), ids=V_UP_CASES.keys())
def test_v_up_dispatch(case, request):
    """Each v_up kernel and tile size is what pick_v_up_kernel chooses for some (T, H, weight dtype)
    on its path, and matches the reference there."""
    if num_sms() != 132 or (case.path == "arch" and not is_sm90()):
        pytest.skip("the expected kernels are an H200's (sm90, 132 SMs)")
    use_path(request, case.path)
    w = _weights(case.h, case.fp8)
    x = case.x()
    out, names = launched_kernels(lambda: mla_ext.v_up(x, *w.uv(case.fp8)), "mla::absorb::")
    kernel, config, args = case.kernel
    assert len(names) == 1 and kernel in names[0], (names, case.kernel)
    assert kernel_is(names[0], config, args, prefix=True), (names, case.kernel)
    assert_close(out, reference.v_up(x.float(), w.w_uv), name=f"v_up {case.id}", **TOL)


@pytest.mark.parametrize("case", V_UP_CASES.values(), ids=V_UP_CASES.keys())
def test_v_up_sanitizer_small(case, request):
    """Small cases of each v_up kernel (the shapes of test_v_up_dispatch; "arch" ones on the
    environment's path) for compute-sanitizer (-k sanitizer): partial tiles, head counts that are no
    powers of two, a padded out= buffer whose NaN must survive, and run-to-run bitwise equality
    (the split-K reduction has a fixed order)."""
    use_path(request, "portable" if case.path == "portable" else "default")
    w = _weights(case.h, case.fp8)
    x = case.x()
    n = case.t * case.h * V
    buf = torch.full((n + 128,), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = buf[64:64 + n].view(case.t, case.h, V)
    mla_ext.v_up(x, *w.uv(case.fp8), out=out)
    assert torch.isnan(buf[:64]).all() and torch.isnan(buf[64 + n:]).all(), f"{case.id}: wrote outside out"
    assert_close(out, reference.v_up(x.float(), w.w_uv), name=f"v_up {case.id}", **TOL)
    assert torch.equal(mla_ext.v_up(x, *w.uv(case.fp8)), out), f"{case.id}: results differ run to run"


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_small_out_buffer_and_4d(fp8):
    """out= into a padded buffer (NaN around it stays), 4-D x, odd strides copied by the op."""
    t, h = 37, 16
    w = _weights(h, fp8)
    q = torch.randn(t, h, P + R, device="cuda", dtype=torch.bfloat16)
    buf = torch.full((t + 2, h, 640), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = buf[1:t + 1, :, :L + R]
    mla_ext.q_absorb(q[..., :P], q[..., P:], *w.uk(fp8), out=out)
    assert torch.isfinite(out).all()
    assert torch.isnan(buf[0]).all() and torch.isnan(buf[-1]).all() and torch.isnan(buf[..., L + R:]).all()
    assert_close(out, reference.q_absorb(q[..., :P].float(), q[..., P:].float(), w.w_uk_t), name="out=", **TOL)
    # a view whose rows are not 16-byte aligned: the op copies it (the wrapper does nothing)
    q_odd = torch.randn(t, h, P + R + 1, device="cuda", dtype=torch.bfloat16)[..., 1:]
    got = mla_ext.q_absorb(q_odd[..., :P], q_odd[..., P:], *w.uk(fp8))
    assert_close(got, reference.q_absorb(q_odd[..., :P].float(), q_odd[..., P:].float(), w.w_uk_t), name="odd", **TOL)
    assert torch.equal(torch.ops.mla_ext.q_absorb(q_odd[..., :P], q_odd[..., P:], *w.uk(fp8)), got)
    # v_up with [b, s_q, H, 512] and out=
    x = torch.randn(5, 3, h, L, device="cuda", dtype=torch.bfloat16)
    o = torch.full((5, 3, h, V), float("nan"), device="cuda", dtype=torch.bfloat16)
    mla_ext.v_up(x, *w.uv(fp8), out=o)
    assert_close(o, reference.v_up(x.float(), w.w_uv), name="v_up 4-D", **TOL)


def test_opcheck_cuda():
    t, h = 9, 16
    for fp8 in (False, True):
        w = _weights(h, fp8)
        q = torch.randn(t, h, P + R, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(t, h, L, device="cuda", dtype=torch.bfloat16)
        # test_schema compares with ops torch lacks for float8; the rest runs for fp8 too
        utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
        utils = utils if fp8 else ("test_schema",) + utils
        torch.library.opcheck(torch.ops.mla_ext.q_absorb, (q[..., :P], q[..., P:], *w.uk(fp8)), test_utils=utils)
        out = torch.empty(t, h, L + R, device="cuda", dtype=torch.bfloat16)
        torch.library.opcheck(torch.ops.mla_ext.q_absorb_out, (q[..., :P], q[..., P:], *w.uk(fp8), out), test_utils=utils)
        torch.library.opcheck(torch.ops.mla_ext.v_up, (x, *w.uv(fp8)), test_utils=utils)
        torch.library.opcheck(torch.ops.mla_ext.v_up_out, (x, *w.uv(fp8), torch.empty(t, h, V, device="cuda", dtype=torch.bfloat16)),
                              test_utils=utils)


def test_cuda_graph_replay():
    t, h = 4, 128
    w = _weights(h, False)
    q = torch.randn(t, h, P + R, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, h, L, device="cuda", dtype=torch.bfloat16)
    q_lat = torch.empty(t, h, L + R, device="cuda", dtype=torch.bfloat16)
    o = torch.empty(t, h, V, device="cuda", dtype=torch.bfloat16)
    mla_ext.q_absorb(q[..., :P], q[..., P:], *w.uk(), out=q_lat)  # warm-up (kernel attributes)
    mla_ext.v_up(x, *w.uv(), out=o)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_ext.q_absorb(q[..., :P], q[..., P:], *w.uk(), out=q_lat)
        mla_ext.v_up(x, *w.uv(), out=o)
    q.copy_(torch.randn_like(q))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(q_lat, reference.q_absorb(q[..., :P].float(), q[..., P:].float(), w.w_uk_t), name="graph q", **TOL)
    assert_close(o, reference.v_up(x.float(), w.w_uv), name="graph v", **TOL)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_misaligned_contiguous_views(fp8):
    """Contiguous views starting at element 1 (.contiguous() returns them unchanged): the ops copy
    the inputs and write out= through an aligned temporary (the wrappers do nothing)."""
    t, h = 24, 16
    w = _weights(h, fp8)

    def odd(*shape, fill=None):
        n = math.prod(shape)
        flat = torch.randn(1 + n, device="cuda", dtype=torch.bfloat16) if fill is None else \
            torch.full((1 + n,), fill, device="cuda", dtype=torch.bfloat16)
        v = flat[1:].view(shape)
        assert v.is_contiguous() and v.data_ptr() % 16 != 0
        return v

    q_nope, q_pe, out = odd(t, h, P), odd(t, h, R), odd(t, h, L + R, fill=float("nan"))
    ref = reference.q_absorb(q_nope.float(), q_pe.float(), w.w_uk_t)
    assert_close(mla_ext.q_absorb(q_nope, q_pe, *w.uk(fp8)), ref, name="q_absorb odd inputs", **TOL)
    assert mla_ext.q_absorb(q_nope, q_pe, *w.uk(fp8), out=out) is out
    assert_close(out, ref, name="q_absorb odd out=", **TOL)
    x, o = odd(t, h, L), odd(t, h, V, fill=float("nan"))
    ref = reference.v_up(x.float(), w.w_uv)
    assert_close(mla_ext.v_up(x, *w.uv(fp8)), ref, name="v_up odd x", **TOL)
    assert mla_ext.v_up(x, *w.uv(fp8), out=o) is o
    assert_close(o, ref, name="v_up odd out=", **TOL)
    o2 = odd(t, h, V, fill=float("nan"))
    torch.ops.mla_ext.v_up_out(x.clone(), *w.uv(fp8), o2)
    assert torch.equal(o2, o)


@pytest.mark.parametrize("case", [c[0] for c in q_absorb_cases("cpu")])
def test_q_absorb_bad_input_gpu(case):
    """The binding refuses what the reference path refuses, with the same message (RuntimeError)."""
    _, call, message = next(c for c in q_absorb_cases("cuda") if c[0] == case)
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("case", [c[0] for c in v_up_cases("cpu")])
def test_v_up_bad_input_gpu(case):
    _, call, message = next(c for c in v_up_cases("cuda") if c[0] == case)
    with pytest.raises(RuntimeError, match=message):
        call()
