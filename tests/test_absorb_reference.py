"""Absorbed projections on the CPU: the algebra (absorbed == un-absorbed attention), weight
preparation (bf16 and fp8 block-scaled), the ops' schemas (opcheck) and their error messages."""

from __future__ import annotations

import math

import pytest
import torch
from bad_inputs import q_absorb_cases, v_up_cases
from conftest import assert_close

import mla_ext
from mla_ext import reference
from mla_ext.absorb import AbsorbWeights

P, V, L, R = 128, 128, 512, 64
SCALE = 1 / math.sqrt(P + R)  # the un-absorbed head's scale (DESIGN.md §1), not 1/sqrt(576)


def _kv_b(num_heads: int) -> torch.Tensor:
    """A kv_b_proj weight whose outputs have about unit variance for unit-variance kv_c."""
    return torch.randn(num_heads * (P + V), L) / math.sqrt(L)


def _fp8_kv_b(num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic fp8 checkpoint: e4m3 weight and 128x128 block scales of varied magnitude."""
    w = (torch.randn(num_heads * (P + V), L) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    scales = torch.rand(num_heads * (P + V) // 128, L // 128) * 1e-3 + 1e-4
    return w, scales


def _layer(t: int, s: int, h: int, dtype=torch.float32):
    q = torch.randn(t, h, P + R, dtype=dtype)
    kv_c = torch.randn(s, L, dtype=dtype)
    k_pe = torch.randn(s, R, dtype=dtype)
    return q[..., :P], q[..., P:], kv_c, k_pe


# ---- the algebra --------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_absorbed_equals_unabsorbed_fp32(causal):
    h, t, s = 4, 5, 37
    kv_b = _kv_b(h)
    q_nope, q_pe, kv_c, k_pe = _layer(t, s, h)
    ref = reference.mla_attention_unabsorbed(q_nope, q_pe, kv_c, k_pe, kv_b, SCALE, causal)
    w_uk_t, w_uv = reference.split_kv_b_proj(kv_b, h)
    out = reference.mla_attention_absorbed(q_nope, q_pe, kv_c, k_pe, w_uk_t, w_uv, SCALE, causal)
    assert_close(out, ref, cos_tol=1e-10, atol=1e-5, rtol=1e-4, name="absorbed")
    # The test can fail: the latent width's scale gives a different attention.
    wrong = reference.mla_attention_absorbed(q_nope, q_pe, kv_c, k_pe, w_uk_t, w_uv, 1 / math.sqrt(576), causal)
    assert (wrong - ref).abs().max() > 1e-2


def test_absorbed_path_through_ops_bf16():
    """The whole absorbed path with the public ops (CPU = reference), bf16 activations and
    weights, against the fp32 un-absorbed computation: bf16-level agreement."""
    h, t, s = 8, 3, 29
    kv_b = _kv_b(h)
    q_nope, q_pe, kv_c, k_pe = _layer(t, s, h)
    ref = reference.mla_attention_unabsorbed(q_nope, q_pe, kv_c, k_pe, kv_b, SCALE)
    w = mla_ext.prepare_absorb_weights(kv_b.to(torch.bfloat16), h)
    q_lat = mla_ext.q_absorb(q_nope.bfloat16(), q_pe.bfloat16(), *w.uk())
    assert q_lat.shape == (t, h, L + R) and q_lat.dtype == torch.bfloat16
    rows = torch.cat([kv_c, k_pe], dim=-1)
    probs = reference._causal_softmax(torch.einsum("thc,sc->hts", q_lat.float(), rows) * SCALE, True)
    o_lat = torch.einsum("hts,sl->thl", probs, kv_c).bfloat16()
    out = mla_ext.v_up(o_lat, *w.uv())
    assert out.is_contiguous() and out.view(t, h * V).shape == (t, h * V)
    assert_close(out, ref, cos_tol=1e-4, atol=0.05, rtol=0.05, name="absorbed bf16")


# ---- weight preparation -------------------------------------------------------------------------


def test_prepare_bf16_layouts():
    h = 3
    kv_b = _kv_b(h).to(torch.bfloat16)
    w = mla_ext.prepare_absorb_weights(kv_b, h)
    uk, uv = reference.split_kv_b_proj(kv_b, h)
    assert w.w_uk_t.shape == (h, P, L) and w.w_uk_t.is_contiguous()
    assert w.w_uv.shape == (h, L, V) and w.w_uv.stride() == (L * V, 1, L)
    assert torch.equal(w.w_uk_t.float(), uk) and torch.equal(w.w_uv.float(), uv)
    # Head 1's W_UK is rows 256..383 of kv_b_proj, its W_UV^T rows 384..511.
    assert torch.equal(w.w_uk_t[1], kv_b[256:384]) and torch.equal(w.w_uv[1].t(), kv_b[384:512])
    assert not w.has_fp8 and w.num_heads == h


def test_dequantize_block_fp8_explicit_blocks():
    w, s = _fp8_kv_b(2)
    deq = reference.dequantize_block_fp8(w, s)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = w[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)].float() * s[i, j]
            assert torch.equal(deq[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)], blk)


def test_prepare_fp8_equals_dequantise_then_split():
    h = 4
    w8, s = _fp8_kv_b(h)
    w = mla_ext.prepare_absorb_weights(w8, h, s)
    uk, uv = reference.split_kv_b_proj(reference.dequantize_block_fp8(w8, s), h)
    assert torch.equal(w.w_uk_t, uk.to(torch.bfloat16)) and torch.equal(w.w_uv, uv.to(torch.bfloat16))
    assert w.w_uv.stride() == (L * V, 1, L) and w.w_uv_fp8.stride() == (L * V, 1, L)
    assert w.w_uk_t_scale.shape == (h, 4) and w.w_uv_scale.shape == (h, 4)
    # The kept fp8 weights with their [H, 4] scales are exactly the dequantised split.
    assert torch.equal(reference.dequantize_w_uk_t(w.w_uk_t_fp8, w.w_uk_t_scale), uk)
    assert torch.equal(reference.dequantize_w_uv(w.w_uv_fp8, w.w_uv_scale), uv)


def test_ops_with_fp8_weights_match_dequantised():
    h, t = 4, 6
    w8, s = _fp8_kv_b(h)
    w = mla_ext.prepare_absorb_weights(w8, h, s)
    uk, uv = reference.split_kv_b_proj(reference.dequantize_block_fp8(w8, s), h)
    q = torch.randn(t, h, P + R, dtype=torch.bfloat16)
    got = mla_ext.q_absorb(q[..., :P], q[..., P:], *w.uk(fp8=True))
    want = torch.cat([torch.einsum("thp,hpl->thl", q[..., :P].float(), uk), q[..., P:].float()], -1)
    assert_close(got, want, cos_tol=1e-5, atol=1e-2, rtol=1e-2, name="q_absorb fp8")
    x = torch.randn(t, h, L, dtype=torch.bfloat16)
    assert_close(mla_ext.v_up(x, *w.uv(fp8=True)), torch.einsum("thl,hlv->thv", x.float(), uv),
                 cos_tol=1e-5, atol=1e-2, rtol=1e-2, name="v_up fp8")


# ---- op semantics on CPU: strided views, out=, 4-D x ---------------------------------------------


def test_q_absorb_out_and_strided_views():
    h, t = 2, 5
    w = mla_ext.prepare_absorb_weights(_kv_b(h).bfloat16(), h)
    q = torch.randn(t, h, P + R, dtype=torch.bfloat16)
    buf = torch.full((t, h, 600), float("nan"), dtype=torch.bfloat16)
    out = buf[..., :L + R]
    got = mla_ext.q_absorb(q[..., :P], q[..., P:], *w.uk(), out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(out, reference.q_absorb(q[..., :P], q[..., P:], w.w_uk_t))
    assert torch.equal(out[..., L:], q[..., P:])
    assert torch.isnan(buf[..., L + R:]).all()  # nothing written past the view


def test_v_up_4d_and_out():
    h, b, s_q = 2, 3, 2
    w = mla_ext.prepare_absorb_weights(_kv_b(h).bfloat16(), h)
    x = torch.randn(b, s_q, h, L, dtype=torch.bfloat16)
    got = mla_ext.v_up(x, *w.uv())
    assert got.shape == (b, s_q, h, V) and got.is_contiguous()
    assert torch.equal(got.view(b * s_q, h, V), mla_ext.v_up(x.view(b * s_q, h, L), *w.uv()))
    out = torch.empty(b, s_q, h, V, dtype=torch.bfloat16)
    assert mla_ext.v_up(x, *w.uv(), out=out) is out and torch.equal(out, got)


# ---- schemas and fakes ------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [False, True])
def test_opcheck_cpu(fp8):
    h, t = 2, 3
    if fp8:
        w8, s = _fp8_kv_b(h)
        w = mla_ext.prepare_absorb_weights(w8, h, s)
    else:
        w = mla_ext.prepare_absorb_weights(_kv_b(h).bfloat16(), h)
    q = torch.randn(t, h, P + R, dtype=torch.bfloat16)
    q_nope, q_pe = q[..., :P], q[..., P:]
    uk, uk_s = w.uk(fp8)
    uv, uv_s = w.uv(fp8)
    x = torch.randn(t, h, L, dtype=torch.bfloat16)
    # test_schema compares tensors with ops that CPU torch lacks for float8 (mul); the other
    # checks (fake, autograd registration, dynamic shapes) run for fp8 weights too.
    all_utils = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    utils = all_utils[1:] if fp8 else all_utils
    out_q = torch.empty(t, h, L + R, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.mla_ext.q_absorb, (q_nope, q_pe, uk, uk_s), test_utils=utils)
    torch.library.opcheck(torch.ops.mla_ext.q_absorb_out, (q_nope, q_pe, uk, uk_s, out_q), test_utils=utils)
    torch.library.opcheck(torch.ops.mla_ext.v_up, (x, uv, uv_s), test_utils=utils)
    torch.library.opcheck(torch.ops.mla_ext.v_up, (x.view(1, t, h, L), uv, uv_s), test_utils=utils)
    torch.library.opcheck(torch.ops.mla_ext.v_up_out, (x, uv, uv_s, torch.empty(t, h, V, dtype=torch.bfloat16)),
                          test_utils=utils)


def test_compile_fullgraph_cpu():
    h, t = 2, 4
    w = mla_ext.prepare_absorb_weights(_kv_b(h).bfloat16(), h)

    def step(q, x):
        return mla_ext.q_absorb(q[..., :P], q[..., P:], *w.uk()), mla_ext.v_up(x, *w.uv())

    q = torch.randn(t, h, P + R, dtype=torch.bfloat16)
    x = torch.randn(t, h, L, dtype=torch.bfloat16)
    eager = step(q, x)
    compiled = torch.compile(step, fullgraph=True, backend="eager")(q, x)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


# ---- error messages -----------------------------------------------------------------------------


def _weights(h=2):
    return mla_ext.prepare_absorb_weights(_kv_b(h).bfloat16(), h)


def test_prepare_errors():
    w8, s = _fp8_kv_b(2)
    with pytest.raises(mla_ext.MlaInputError, match=r"kv_b_weight must be \[num_heads \* \(P \+ V\), 512\] = \[768, 512\]"):
        mla_ext.prepare_absorb_weights(_kv_b(2), 3)
    with pytest.raises(mla_ext.MlaInputError, match="needs weight_scale_inv"):
        mla_ext.prepare_absorb_weights(w8, 2)
    with pytest.raises(mla_ext.MlaInputError, match=r"weight_scale_inv must be \[4, 4\]"):
        mla_ext.prepare_absorb_weights(w8, 2, s[:, :3])
    with pytest.raises(mla_ext.MlaInputError, match="weight_scale_inv is only for float8_e4m3fn"):
        mla_ext.prepare_absorb_weights(_kv_b(2), 2, s)
    with pytest.raises(mla_ext.MlaInputError, match="qk_nope_head_dim=v_head_dim=128"):
        mla_ext.prepare_absorb_weights(_kv_b(2), 2, qk_nope_head_dim=64)


@pytest.mark.parametrize("case", [c[0] for c in q_absorb_cases("cpu")])
def test_q_absorb_errors(case):
    _, call, message = next(c for c in q_absorb_cases("cpu") if c[0] == case)
    with pytest.raises(mla_ext.MlaInputError, match=message):
        call()


@pytest.mark.parametrize("case", [c[0] for c in v_up_cases("cpu")])
def test_v_up_errors(case):
    _, call, message = next(c for c in v_up_cases("cpu") if c[0] == case)
    with pytest.raises(mla_ext.MlaInputError, match=message):
        call()


def test_input_errors_are_runtime_errors():
    """MlaInputError is a RuntimeError (what the CUDA bindings raise) and a ValueError."""
    w = _weights()
    q = torch.randn(3, 2, P + R, dtype=torch.bfloat16)
    for kind in (RuntimeError, ValueError):
        with pytest.raises(kind, match="q_nope must be bfloat16"):
            mla_ext.q_absorb(q[..., :P].half(), q[..., P:].half(), *w.uk())


def test_absorb_weights_fp8_request_on_bf16():
    with pytest.raises(mla_ext.MlaInputError, match="bf16 checkpoint"):
        _weights().uk(fp8=True)
    assert isinstance(_weights(), AbsorbWeights)


def test_single_head_weights():
    """H = 1 (stride of the head dim is irrelevant; prepare may keep kv_b_proj's storage)."""
    w8, s = _fp8_kv_b(1)
    w = mla_ext.prepare_absorb_weights(w8, 1, s)
    q = torch.randn(2, 1, P + R, dtype=torch.bfloat16)
    for fp8 in (False, True):
        assert mla_ext.q_absorb(q[..., :P], q[..., P:], *w.uk(fp8)).shape == (2, 1, L + R)
        assert mla_ext.v_up(torch.randn(2, 1, L, dtype=torch.bfloat16), *w.uv(fp8)).shape == (2, 1, V)
