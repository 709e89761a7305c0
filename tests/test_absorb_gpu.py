"""Absorbed-projection kernels against the fp32 reference on the GPU."""

from __future__ import annotations

import math

import pytest
import torch
from bad_inputs import q_absorb_cases, v_up_cases
from conftest import assert_close

import mla_ext
from mla_ext import reference

pytestmark = pytest.mark.gpu

P, V, L, R = 128, 128, 512, 64
# Token counts per tier of csrc/absorb/absorb.cu tier_for: <= 16 (tier 0), 17..32 (tier 1: BM = 32;
# v_up narrow tier 5), 33..512 (tier 2), > 512 (tier 3).
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


# v_up's kernels (csrc/absorb/absorb.cu pick_v_up_kernel): "auto" is the default choice,
# "portable" the default with MLA_EXT_FORCE_PORTABLE=1 (what sm100 runs), the others forced with
# MLA_EXT_VUP_KERNEL so that every kernel meets every size. Token counts: the BM boundaries of the
# kernels (16/17, 32/33, 64/65), the sizes where ksplit picks BN = 32 and 64 at H = 16 (128, 256),
# the boundaries of the automatic choice (32/33, 64/65, 256/257 at H = 128; 128/129, 512/513 at
# H < 96), odd sizes (7, 257), the 4096 and a large T with a partial last tile for every
# BM (4097).
V_UP_TOKENS = (1, 7, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 513, 4096, 4097)
# tmas* are the TMA kernel with streamed weights, BN by T and H or forced (e4m3 weights take the
# resident-weight 64-row TMA kernel); tma128p / tma64p the resident-weight TMA kernel with the
# paced producer schedule (the automatic choice at H >= 96, T = 129-256, bf16 weights).
STREAM_TILES = ("tmas:64x32", "tmas:64x64", "tmas:64x128")
PACED = ("tma128p", "tma64p")
V_UP_KERNELS = ("auto", "portable", "ksplit", "wgmma", "tma128", "tma64", "tiles", "tmas") + STREAM_TILES + PACED
SM90_ONLY = ("wgmma", "tma128", "tma64", "tmas")


def _use_v_up_kernel(monkeypatch, kernel: str):
    if kernel.startswith(SM90_ONLY) and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"the {kernel} kernel is sm90 only")
    if kernel == "portable":
        monkeypatch.setenv("MLA_EXT_FORCE_PORTABLE", "1")
    elif kernel != "auto":
        monkeypatch.setenv("MLA_EXT_VUP_KERNEL", kernel)


@pytest.mark.parametrize("kernel", V_UP_KERNELS)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("h", HEADS)
@pytest.mark.parametrize("t", V_UP_TOKENS)
def test_v_up(t, h, fp8, kernel, monkeypatch):
    _use_v_up_kernel(monkeypatch, kernel)
    w = _weights(h, fp8)
    # the latent output as a strided view (rows of 640), values of attention-output size
    x = torch.randn(t, h, 640, device="cuda", dtype=torch.bfloat16)[..., :L]
    w_uv, scale = w.uv(fp8)
    out = mla_ext.v_up(x, w_uv, scale)
    assert out.shape == (t, h, V) and out.is_contiguous()
    assert_close(out, reference.v_up(x.float(), w.w_uv), name=f"v_up T={t} H={h} {kernel}", **TOL)
    if fp8:
        assert_close(out, reference.v_up(x.float(), w_uv, scale), name=f"v_up T={t} H={h} vs fp32 weights", **FP32_W_TOL)


@pytest.mark.parametrize("kernel", ("ksplit", "wgmma", "tma128", "tma64", "tiles", "tmas") + STREAM_TILES + PACED)
def test_v_up_sanitizer_small(kernel, monkeypatch):
    """Small cases of each v_up kernel for compute-sanitizer (-k sanitizer): partial tiles, a
    head count that is no power of two, a padded out= buffer whose NaN must survive, and
    run-to-run bitwise equality (the split-K reduction has a fixed order)."""
    _use_v_up_kernel(monkeypatch, kernel)
    # (ksplit picks BN = 16, 16, 16, 32, 64, 128 for these on 132 SMs)
    for t, h, fp8 in ((1, 3, False), (33, 1, True), (130, 3, True), (20, 20, True), (100, 20, False), (200, 40, True)):
        w = _weights(h, fp8)
        x = torch.randn(t, h, 520, device="cuda", dtype=torch.bfloat16)[..., :L]
        n = t * h * V
        buf = torch.full((n + 128,), float("nan"), device="cuda", dtype=torch.bfloat16)
        out = buf[64:64 + n].view(t, h, V)
        mla_ext.v_up(x, *w.uv(fp8), out=out)
        assert torch.isnan(buf[:64]).all() and torch.isnan(buf[64 + n:]).all(), f"{kernel}: wrote outside out"
        assert_close(out, reference.v_up(x.float(), w.w_uv), name=f"v_up {kernel} T={t} H={h}", **TOL)
        assert torch.equal(mla_ext.v_up(x, *w.uv(fp8)), out), f"{kernel}: results differ run to run"


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


def test_v_up_kernel_override_is_checked(monkeypatch):
    monkeypatch.setenv("MLA_EXT_VUP_KERNEL", "fastest")
    w = _weights(4, False)
    with pytest.raises(RuntimeError, match="MLA_EXT_VUP_KERNEL must be ksplit, wgmma, tma128, tma64, tiles, tmas"):
        mla_ext.v_up(torch.randn(3, 4, L, device="cuda", dtype=torch.bfloat16), *w.uv())
    monkeypatch.setenv("MLA_EXT_VUP_KERNEL", "tmas:64x16")  # not an instantiated tile
    with pytest.raises(RuntimeError, match="MLA_EXT_VUP_KERNEL must be"):
        mla_ext.v_up(torch.randn(3, 4, L, device="cuda", dtype=torch.bfloat16), *w.uv())
