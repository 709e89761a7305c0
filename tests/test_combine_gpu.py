"""The split combine shared by dense and sparse decode (csrc/decode/combine): every CTA layout (1,
2, 4 or 8 CTAs per query row, picked by run_split_combine from the shape) reached by the shapes that
select it, the sparse attn_sink factor, and decode plans made for another geometry passed to
torch.ops."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import SCALAR, assert_close, kernel_is, launched_kernels, num_sms
from sparse_cases import SOFTMAX_SCALE, make_cache, make_indices, split_plan

import mla_ext
from mla_ext import reference
from mla_ext.bench.decode import make_inputs, run_op, run_reference

pytestmark = pytest.mark.gpu
CHUNKS = [1, 2, 4, 8]


def combine_chunks(rows: int, items: int) -> int:
    """CTAs per query row of run_split_combine (csrc/decode/combine/combine.cu): the fewest of 1, 2,
    4, 8 for which rows x chunks x items covers the SMs twice (items: the requests it may merge)."""
    chunks = 1
    while chunks < 8 and rows * chunks * items < 2 * num_sms():
        chunks *= 2
    return chunks


def dense_batch(s_q: int, h_q: int, chunks: int) -> int:
    """The smallest batch whose dense combine runs ``chunks`` CTAs per row: it may merge one request
    per part of the plan, at most b."""
    parts = reference.decode_num_parts(num_sms(), s_q, h_q)
    for b in range(1, 4 * num_sms()):
        if combine_chunks(s_q * h_q, min(b, parts)) == chunks:
            return b
    raise AssertionError(f"no batch of s_q={s_q}, h_q={h_q} gives {chunks} chunks on {num_sms()} SMs")


def sparse_batch(s_q: int, h_q: int, topk: int, chunks: int, min_splits: int = 3, max_splits: int = 1 << 30) -> int:
    """The smallest batch whose top-k lists are split into min_splits..max_splits pieces and whose
    combine runs ``chunks`` CTAs per row (every request is merged)."""
    for b in range(1, num_sms()):
        first, splits = split_plan(b, s_q, h_q, topk)
        if combine_chunks(s_q * h_q, b) == chunks and first == 0 and min_splits <= splits <= max_splits:
            return b
    raise AssertionError(f"no batch of s_q={s_q}, h_q={h_q} gives {chunks} chunks and {min_splits}+ splits")


def _check_dense(inp, out, lse):
    ref_out, ref_lse = run_reference(inp, True)
    assert_close(out, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2, name="out")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=2e-3, rtol=1e-4, name="lse")


def _dense_lens(b: int) -> list[int]:
    """One request long enough to be cut over every part, then short ones (split or whole) and an
    empty one."""
    lens = [20000, 0, 1, 3000, 65, 700]
    return (lens + torch.randint(1, 2000, (max(0, b - len(lens)),)).tolist())[:b]


def _assert_chunks(names, dtype, chunks):
    assert len(names) == 1 and kernel_is(names[0], "split_combine_kernel", (SCALAR[dtype], chunks)), (names, chunks)


@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("s_q,h_q", [(2, 16), (1, 5)])
def test_dense_layouts(chunks, s_q, h_q):
    """One long request cut over every part, short ones split or whole, an empty one; the batch size
    picks the layout (few requests to merge: more CTAs per row)."""
    b = dense_batch(s_q, h_q, chunks)
    inp = make_inputs(_dense_lens(b), s_q, h_q, 64, "auto", device="cuda")
    (out, lse), names = launched_kernels(lambda: run_op(inp, True), "split_combine_kernel")
    _assert_chunks(names, torch.bfloat16, chunks)
    _check_dense(inp, out, lse)


@pytest.mark.parametrize("chunks", [1, 8])
def test_dense_fp16_and_strided_out(chunks):
    b = dense_batch(1, 7, chunks)
    lens = ([9000, 40, 2500] + torch.randint(1, 3000, (max(0, b - 3),)).tolist())[:b]
    inp = make_inputs(lens, 1, 7, 32, "fp8_ds_mla", dtype=torch.float16, device="cuda")
    big = torch.full((b, 1, 9, 514), 7.0, dtype=torch.float16, device="cuda")
    out = big[:, :, 1:8, :512]  # row stride 514: rows only 4-byte aligned
    lse = torch.empty(b, 7, 1, device="cuda")
    _, names = launched_kernels(lambda: run_op(inp, True, out=out, lse=lse), "split_combine_kernel")
    _assert_chunks(names, torch.float16, chunks)
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
    assert sched.shape == (reference.decode_num_parts(132, *plan_geom), 8)
    out, lse = torch.ops.mla_ext.decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"],
                                            inp["softmax_scale"], fmt, True, inp["scale"], sched, info, False)
    _check_dense(inp, out, lse)


def _sparse_case(b, s_q, h_q, topk):
    cache, good, _ = make_cache(max(2, b * 400 // 64), 64, "auto", "cuda")
    idx = make_indices(b, s_q, topk, good, cache.shape[0] * cache.shape[1])
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device="cuda")
    return q, cache, idx


def _check_sparse(q, cache, idx, topk_length, sink, out, lse):
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto", topk_length, sink)
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse")


@pytest.mark.parametrize("chunks,splits", [(8, "many"), (4, "many"), (2, "many"), (1, "many"), (1, "two")])
def test_sparse_layouts_and_sink(chunks, splits):
    """The sparse combine (every request split the same number of times) in each layout, with
    topk_length (one list empty) and attn_sink (+-inf included); "two": a batch that leaves room for
    two pieces per list only."""
    s_q, h_q, topk = 2, 16, 700
    b = sparse_batch(s_q, h_q, topk, chunks, *((2, 2) if splits == "two" else (3,)))
    q, cache, idx = _sparse_case(b, s_q, h_q, topk)
    topk_length = torch.randint(0, topk + 1, (b,), dtype=torch.int32, device="cuda")
    topk_length[0] = topk
    if b > 1:
        topk_length[1] = 0
    sink = torch.randn(h_q, device="cuda")
    sink[3], sink[5] = math.inf, -math.inf
    call = lambda: mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto", topk_length, sink)  # noqa: E731
    (out, lse), names = launched_kernels(call, "split_combine_kernel")
    _assert_chunks(names, torch.bfloat16, chunks)
    _check_sparse(q, cache, idx, topk_length, sink, out, lse)
    assert (out[:, :, 3] == 0).all()
    if b > 1:
        assert (out[1] == 0).all() and (lse[1] == -math.inf).all()


def test_small_combine_for_sanitizer():
    """Kept tiny for compute-sanitizer (-k small): both combine users, the widest and the narrowest
    CTAs (8 and 1 per query row; test_dense_layouts and test_sparse_layouts_and_sink check that these
    shapes pick them)."""
    for chunks in (1, 8):
        b = dense_batch(1, 16, chunks)
        inp = make_inputs(([3000, 0, 70] + [40] * b)[:b], 1, 16, 16, "auto", device="cuda")
        _check_dense(inp, *run_op(inp, True))
        b = sparse_batch(1, 16, 300, chunks, min_splits=2)
        q, cache, idx = _sparse_case(b, 1, 16, 300)
        sink = torch.randn(16, device="cuda")
        out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto", None, sink)
        _check_sparse(q, cache, idx, None, sink, out, lse)
