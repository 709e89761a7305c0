"""The split combine shared by dense and sparse decode (csrc/decode/combine): every CTA layout
(MLA_EXT_COMBINE_CHUNKS), with and without programmatic dependent launch (MLA_EXT_NO_PDL), the
sparse attn_sink factor, and decode plans made for another geometry passed to torch.ops."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close
from sparse_cases import SOFTMAX_SCALE, make_cache, make_indices

import mla_ext
from mla_ext import reference
from mla_ext.bench.decode import make_inputs, run_op, run_reference

pytestmark = pytest.mark.gpu


def _check_dense(inp, out, lse):
    ref_out, ref_lse = run_reference(inp, True)
    assert_close(out, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2, name="out")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=2e-3, rtol=1e-4, name="lse")


@pytest.mark.parametrize("chunks", ["", "1", "2", "4", "8"])
@pytest.mark.parametrize("pdl", [True, False])
def test_dense_layouts(chunks, pdl, monkeypatch):
    """One long request cut over every part, short ones split or whole, an empty one."""
    monkeypatch.setenv("MLA_EXT_COMBINE_CHUNKS", chunks)
    if not pdl:
        monkeypatch.setenv("MLA_EXT_NO_PDL", "1")
    inp = make_inputs([20000, 0, 1, 3000, 65, 700], 2, 16, 64, "auto", device="cuda")
    _check_dense(inp, *run_op(inp, True))


@pytest.mark.parametrize("chunks", ["1", "8"])
def test_dense_fp16_and_strided_out(chunks, monkeypatch):
    monkeypatch.setenv("MLA_EXT_COMBINE_CHUNKS", chunks)
    inp = make_inputs([9000, 40, 2500], 1, 7, 32, "fp8_ds_mla", dtype=torch.float16, device="cuda")
    big = torch.full((3, 1, 9, 514), 7.0, dtype=torch.float16, device="cuda")
    out = big[:, :, 1:8, :512]  # row stride 514: rows only 4-byte aligned
    lse = torch.empty(3, 7, 1, device="cuda")
    run_op(inp, True, out=out, lse=lse)
    _check_dense(inp, out, lse)
    assert bool((big[:, :, 0] == 7).all()) and bool((big[:, :, 8] == 7).all()) and bool((big[..., 512:] == 7).all())


@pytest.mark.parametrize("plan_geom,call_geom", [
    ((1, 16, "auto"), (2, 128, "auto")),       # plan with more parts than the call's geometry
    ((16, 128, "auto"), (1, 16, "auto")),      # plan with 4 parts
    ((1, 3, "fp8_ds_mla"), (3, 64, "fp8")),    # another format
])
def test_plan_for_other_geometry(plan_geom, call_geom):
    """torch.ops.mla_ext.decode_mla with a plan for another s_q / h_q / format (the Python
    wrapper refuses it; the op launches the plan's parts and sizes the partials for it)."""
    s_q, h_q, fmt = call_geom
    inp = make_inputs([30000, 5, 4000, 0, 129], s_q, h_q, 64, fmt, device="cuda")
    sched, info = torch.ops.mla_ext.decode_plan(inp["seq_lens"], plan_geom[0], plan_geom[1], plan_geom[2], 132)
    assert sched.shape == (reference.decode_num_parts(132, plan_geom[0], plan_geom[1]), 8)
    out, lse = torch.ops.mla_ext.decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"],
                                            inp["softmax_scale"], fmt, True, inp["scale"], sched, info, False)
    _check_dense(inp, out, lse)


def _sparse_case(b, s_q, h_q, topk):
    cache, good, _ = make_cache(max(2, b * 400 // 64), 64, "auto", "cuda")
    idx = make_indices(b, s_q, topk, good, cache.shape[0] * cache.shape[1])
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device="cuda")
    return q, cache, idx


@pytest.mark.parametrize("chunks", ["", "1", "2", "8"])
@pytest.mark.parametrize("splits", ["2", "7"])
def test_sparse_layouts_and_sink(chunks, splits, monkeypatch):
    monkeypatch.setenv("MLA_EXT_COMBINE_CHUNKS", chunks)
    monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", splits)
    b, s_q, h_q, topk = 3, 2, 16, 700
    q, cache, idx = _sparse_case(b, s_q, h_q, topk)
    topk_length = torch.tensor([700, 0, 100], dtype=torch.int32, device="cuda")
    sink = torch.randn(h_q, device="cuda")
    sink[3], sink[5] = math.inf, -math.inf
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto", topk_length, sink)
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto", topk_length, sink)
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse")
    assert (out[:, :, 3] == 0).all() and (out[1] == 0).all() and (lse[1] == -math.inf).all()


def test_small_combine_for_sanitizer(monkeypatch):
    """Kept tiny for compute-sanitizer (-k small): both combine users, widest and narrowest CTAs."""
    for chunks in ("1", "8"):
        monkeypatch.setenv("MLA_EXT_COMBINE_CHUNKS", chunks)
        inp = make_inputs([3000, 0, 70], 1, 16, 16, "auto", device="cuda")
        _check_dense(inp, *run_op(inp, True))
        monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", "3")
        q, cache, idx = _sparse_case(2, 1, 16, 300)
        sink = torch.randn(16, device="cuda")
        out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto", None, sink)
        ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto", None, sink)
        assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out")
        assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse")
