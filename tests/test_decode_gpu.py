"""decode_mla on the GPU against the fp32 reference: formats, head counts, s_q, block sizes,
edge lengths, NaN in every unused slot, pages in random order, CUDA graphs, torch.compile."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from bad_inputs import DECODE_CASES, decode_inputs
from conftest import assert_close

import mla_ext
from mla_ext import reference
from mla_ext.bench.decode import make_inputs, run_op, run_reference

pytestmark = pytest.mark.gpu

FORMATS = ("auto", "fp8", "fp8_ds_mla")
SCALE = 192**-0.5


def check(inp, causal, lse_atol=2e-3, **kw):
    out, lse = run_op(inp, causal, **kw)
    ref_out, ref_lse = run_reference(inp, causal)
    assert out.dtype == inp["q"].dtype and lse.dtype == torch.float32
    # out: bf16/fp16 rounding of P and of the result; lse: fp32 (inputs are exact in bf16).
    assert_close(out, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2, name="out")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=lse_atol, rtol=1e-4, name="lse")
    return out, lse


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h_q", [1, 3, 16, 32, 63, 64, 126, 128])
def test_heads(fmt, h_q):
    inp = make_inputs([0, 1, 63, 64, 65, 300, 1000], 1, h_q, 64, fmt, device="cuda")
    check(inp, causal=True)


@pytest.mark.parametrize("fmt", ["auto", "fp8_ds_mla"])
@pytest.mark.parametrize("s_q,h_q", [(2, 16), (3, 16), (4, 32), (16, 16), (2, 128), (16, 128), (5, 7)])
@pytest.mark.parametrize("causal", [True, False])
def test_s_q(fmt, s_q, h_q, causal):
    inp = make_inputs([0, 1, 2, 15, 16, 17, 200, 777], s_q, h_q, 32, fmt, device="cuda")
    check(inp, causal)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size", [1, 16, 32, 61, 64, 128, 256])
def test_block_sizes(fmt, block_size):
    inp = make_inputs([1, 64, 65, 129, 700], 2, 16, block_size, fmt, device="cuda")
    check(inp, causal=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp16(fmt):
    inp = make_inputs([0, 5, 100, 1500], 2, 64, 64, fmt, dtype=torch.float16, device="cuda")
    check(inp, causal=True)


@pytest.mark.parametrize("h_q", [16, 64])
def test_ds_mla_arbitrary_scales(h_q):
    """Non-power-of-two tile scales. 16 rows (the fp8 kernel): scales stay out of the MMA operands
    (e4m3 -> fp16 is exact), so the result matches the exact fp32 reference as tightly as a bf16
    cache does. 32/64 rows: kv_c * scale is rounded once to bf16 for the MMAs, so the kernel must
    match the reference on that bf16-rounded cache tightly, and the exact one within that rounding."""
    inp = make_inputs([3, 300, 2000], 1, h_q, 64, "fp8_ds_mla", device="cuda", arbitrary_scales=True)
    if h_q <= 16:
        check(inp, causal=True)
    else:
        check_rounded_tiles(inp, causal=True)


def check_rounded_tiles(inp, causal, **kw):
    """fp8_ds_mla with non-power-of-two scales on 32/64-row tiles: kv_c * scale is rounded once to q's
    type for the MMAs, so the result must match the reference on that rounded cache tightly and the
    exact reference within that rounding (bf16: 2^-9 relative per value; the largest single-element
    difference seen, 0.066 of ~1M outputs at h_q 128 s_q 2, sets the elementwise bound, the cosine
    bound holds the whole)."""
    out, lse = run_op(inp, causal, **kw)
    rounded = dict(inp, kv_cache=reference.dequantize_cache(inp["kv_cache"], "fp8_ds_mla").to(inp["q"].dtype),
                   kv_cache_dtype="auto")
    ref_out, ref_lse = run_reference(rounded, causal)
    assert_close(out, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2, name="out")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=2e-3, rtol=1e-4, name="lse")
    exact_out, exact_lse = run_reference(inp, causal)
    assert_close(out, exact_out, cos_tol=1e-4, atol=1e-1, rtol=5e-2, name="out vs exact")
    assert_close(lse, exact_lse, cos_tol=1e-6, atol=3e-2, rtol=1e-3, name="lse vs exact")


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("h_q", [1, 5, 16])
def test_fp8_wide_ranges(fmt, dtype, h_q):
    """The 16-row fp8 kernel normalises each query row by a power of two (fp16 MMAs) and keeps a
    running reference per 128-wide value tile: query rows 2^-12 .. 2^12 apart (2^-6 .. 2^6 for
    fp16 q) and fp8_ds_mla tile scales spread over 2^16 within every tile must not lose precision."""
    inp = make_inputs([1, 64, 65, 1000, 3001], 1, h_q, 64, fmt, dtype=dtype, device="cuda")
    span = 12 if dtype == torch.bfloat16 else 6
    inp["q"] = inp["q"] * torch.exp2(torch.randint(-span, span + 1, (1, 1, h_q, 1), device="cuda").to(dtype))
    if fmt == "fp8_ds_mla":
        cache = inp["kv_cache"].view(torch.uint8)
        scales = cache[..., 512:528].contiguous().view(torch.float32)
        spread = torch.exp2(torch.randint(-8, 9, scales.shape, device="cuda").float())
        factor = torch.where(torch.isnan(scales), torch.ones_like(scales), spread * (1 + 0.37 * torch.rand_like(scales)))
        cache[..., 512:528] = (scales * factor).view(torch.uint8)
    out, lse = run_op(inp, True)
    ref_out, ref_lse = run_reference(inp, True)
    assert_close(out, ref_out, cos_tol=2e-5, atol=float("inf"), rtol=0, name="out")
    # Output magnitudes vary by 2^8 with the scales: abs/rel error relative to each row's scale.
    row_mag = ref_out.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    assert_close(out.float() / row_mag, ref_out.float() / row_mag, cos_tol=2e-5, atol=2e-2, rtol=2e-2, name="out / row max")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=2e-3 * 2**span, rtol=1e-4, name="lse")


@pytest.mark.parametrize("h_q", [16, 64])
def test_ds_mla_scale_outlier(h_q):
    """An early token whose tile scales are 2^20 above the rest, with zero values (so it adds
    nothing but its scale): the 16-row kernel's value reference R must come back down for the
    later tiles, or their P' = P scale / R fall into fp16 subnormals."""
    bs = 64
    inp = make_inputs([100, 1000, 3001], 1, h_q, bs, "fp8_ds_mla", device="cuda")
    cache = inp["kv_cache"].view(torch.uint8)
    for i in range(inp["seq_lens"].numel()):
        page = int(inp["block_table"][i, 0])
        cache[page, :, :512] = 0  # positions 0..63: e4m3 zeros (k_pe kept)
        scales = cache[page, 0, 512:528].clone().view(torch.float32) * 2.0**20
        cache[page, 0, 512:528] = scales.view(torch.uint8)
    check(inp, causal=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_padded_pages(fmt):
    inp = make_inputs([10, 333], 1, 16, 16, fmt, device="cuda", page_pad=5)
    assert inp["kv_cache"].stride(0) > 16 * inp["kv_cache"].stride(1)
    check(inp, causal=True)


@pytest.mark.parametrize("fmt", ["auto", "fp8_ds_mla"])
def test_long_128k(fmt):
    inp = make_inputs([128 * 1024 + 7], 1, 16, 64, fmt, device="cuda")
    check(inp, causal=True)


@pytest.mark.parametrize("b", [74, 1024])
def test_large_batch(b):
    lens = torch.randint(0, 300, (b,)).tolist()
    inp = make_inputs(lens, 1, 16, 16, "auto", device="cuda")
    check(inp, causal=True)


def test_one_long_many_short():
    lens = [20000] + torch.randint(1, 200, (40,)).tolist()
    inp = make_inputs(lens, 2, 32, 64, "fp8_ds_mla", device="cuda")
    check(inp, causal=True)


@pytest.mark.parametrize("kind", ["uniform", "skewed", "zeros", "tiny"])
def test_plan_matches_reference(kind):
    """The GPU planner gives the reference's plan exactly: one chunk (b <= 4096) and several
    (4097: two, 65535: sixteen), one long request among short ones, all-zero lengths, and fewer
    cost units than parts (empty parts)."""
    for b in (1, 7, 128, 256, 1000, 4097, 65535):
        if kind == "uniform":
            lens = torch.randint(0, 70000 if b < 10 else 5000, (b,), dtype=torch.int32)
        elif kind == "skewed":
            lens = torch.randint(1, 300, (b,), dtype=torch.int32)
            lens[b // 2] = 2**31 - 1
        elif kind == "zeros":
            lens = torch.zeros(b, dtype=torch.int32)
        else:
            lens = torch.randint(-2, 3, (b,), dtype=torch.int32)
        for s_q, h_q, num_sms in ((1, 16, 132), (2, 128, 132), (16, 128, 132), (1, 16, 4096)):
            sched, info = mla_ext.get_decode_plan(lens.cuda(), s_q, h_q, "auto", num_sms=num_sms)
            ref_sched, ref_info = reference.decode_plan(lens, s_q, h_q, num_sms)
            assert torch.equal(sched.cpu(), ref_sched) and torch.equal(info.cpu(), ref_info), (b, s_q, h_q, num_sms)


def test_plan_workspace_is_reused():
    """Two layers given one plan (and its workspace) compute what calls without a workspace (each
    allocating its own) and the reference compute."""
    inp = make_inputs([3000, 5, 0, 70000, 64], 2, 16, 64, "auto", device="cuda")
    plan = mla_ext.get_decode_plan(inp["seq_lens"], 2, 16)
    assert plan.workspace.shape == reference.decode_workspace_shape(plan.schedule.shape[0], 5, 2, 16)
    first = run_op(inp, True, plan=plan)
    second = run_op(inp, True, plan=plan)
    bare = torch.ops.mla_ext.decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"],
                                        inp["softmax_scale"], "auto", True, None, plan.schedule, plan.split_info)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    for a, b in zip(first, bare):
        assert torch.equal(a, b)
    check(inp, causal=True, plan=plan)


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_bad_input_gpu(case):
    """The binding refuses what the reference path refuses, with the same message (RuntimeError)."""
    change, match = DECODE_CASES[case]
    inp = decode_inputs("cuda")
    bad = dict(inp)
    bad.update(change(inp))
    with pytest.raises(RuntimeError, match=match):
        run_op(bad, True)
    with pytest.raises(RuntimeError, match=match):  # the op itself
        torch.ops.mla_ext.decode_mla(bad["q"], bad["kv_cache"], bad["block_table"], bad["seq_lens"], SCALE,
                                     bad["kv_cache_dtype"], True, bad["scale"])


def test_bad_plans_and_buffers_gpu():
    inp = decode_inputs("cuda")
    other = mla_ext.get_decode_plan(torch.tensor([3], dtype=torch.int32, device="cuda"), 1, 4)
    with pytest.raises(RuntimeError, match=r"split_info must be int32 \[b=2"):
        run_op(inp, True, plan=other)
    with pytest.raises(RuntimeError, match="plan was made for"):
        run_op(inp, True, plan=mla_ext.get_decode_plan(inp["seq_lens"], 1, 16))
    right = mla_ext.get_decode_plan(inp["seq_lens"], 1, 4)
    with pytest.raises(RuntimeError, match="schedule must be int32"):
        run_op(inp, True, plan=mla_ext.DecodePlan(right.schedule[:0], right.split_info))
    small = mla_ext.get_decode_plan(inp["seq_lens"], 1, 2)
    # its workspace's shape records the plan's geometry: the op refuses it for h_q 4 ...
    with pytest.raises(RuntimeError, match=r"plan was made for s_q=1, h_q=2 but this call has s_q=1, h_q=4"):
        torch.ops.mla_ext.decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], SCALE,
                                     "auto", True, None, small.schedule, small.split_info, False, small.workspace)
    # ... and a flat workspace too small for the call
    flat = small.workspace.flatten()
    with pytest.raises(RuntimeError, match="workspace must be a contiguous, 16-byte aligned float32 tensor"):
        torch.ops.mla_ext.decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], SCALE,
                                     "auto", True, None, small.schedule, small.split_info, False, flat)
    with pytest.raises(RuntimeError, match="out must not have zero strides"):
        run_op(inp, True, out=torch.empty(1, 1, 1, 512, dtype=torch.bfloat16, device="cuda").expand(2, 1, 4, 512))
    with pytest.raises(RuntimeError, match="lse must not have zero strides"):
        run_op(inp, True, lse=torch.empty(1, 1, 1, device="cuda").expand(2, 4, 1))
    with pytest.raises(RuntimeError, match=r"seq_lens must be int32, got int64: convert once per step"):
        mla_ext.get_decode_plan(inp["seq_lens"].long(), 1, 4)


def test_misaligned_q_is_copied():
    """A contiguous q starting at element 1 (.contiguous() returns it unchanged): the op itself
    copies it to aligned rows (the wrapper does nothing)."""
    inp = make_inputs([70, 900], 2, 16, 64, "auto", device="cuda")
    flat = torch.empty(1 + inp["q"].numel(), dtype=torch.bfloat16, device="cuda")
    q_odd = flat[1:].view(inp["q"].shape)
    q_odd.copy_(inp["q"])
    assert q_odd.is_contiguous() and q_odd.data_ptr() % 16 != 0
    want = run_op(inp, True)
    got = run_op(dict(inp, q=q_odd), True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("h_q,block_size,fmt", [(16, 16, "auto"), (128, 64, "auto"), (128, 16, "auto"), (128, 61, "auto"),
                                                 (64, 64, "fp8_ds_mla")])
def test_seq_lens_past_block_table(h_q, block_size, fmt):
    """Request 0 fills its 6 pages; its seq_len then claims 7 pages + 40 tokens: page 6 is a table
    entry pointing outside the cache, the rest lies past the table. Unchecked, both are skipped (on
    sm90 at 128 / 64 heads: the wgmma kernels, whose TMA copies arrive without bytes for that page and
    zero its rows: at block size 16 one page of four in a tile; at block size 61 cp.async loads)."""
    inp = make_inputs([6 * block_size, 50], 1, h_q, block_size, fmt, device="cuda")
    assert inp["block_table"].shape[1] == 7
    inp["seq_lens"][0] = block_size * 7 + 40
    check(inp, causal=False)
    with pytest.raises(IndexError, match="block_table has only"):
        run_op(inp, False, checked=True)
    inp["seq_lens"][0] = 6 * block_size + 4  # within the table, but page 6 is outside the cache
    with pytest.raises(IndexError, match="outside the cache"):
        run_op(inp, False, checked=True)


@pytest.mark.parametrize("h_q", [16, 64])
@pytest.mark.parametrize("force_portable", [True, False])
def test_out_buffers_and_force_portable(h_q, force_portable, monkeypatch):
    """out= a strided view and lse= a buffer, written in place and nothing around them (h_q 64 on sm90,
    unforced: the wgmma kernel's epilogue)."""
    inp = make_inputs([70, 900], 2, h_q, 64, "auto", device="cuda")
    big = torch.full((2, 2, h_q + 4, 512), 7.0, dtype=torch.bfloat16, device="cuda")
    out = big[:, :, 2:2 + h_q]  # strided view
    lse = torch.empty(2, h_q, 2, device="cuda")
    o, l_ = run_op(inp, True, out=out, lse=lse, force_portable=force_portable)
    assert o.data_ptr() == out.data_ptr() and l_ is lse
    ref_out, ref_lse = run_reference(inp, True)
    assert_close(out, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2)
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=2e-3, rtol=1e-4, name="lse")
    assert bool((big[:, :, :2] == 7).all()) and bool((big[:, :, 2 + h_q:] == 7).all())
    monkeypatch.setenv("MLA_EXT_FORCE_PORTABLE", "1")
    check(inp, causal=True)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", ["default", "split_tiles", "portable64"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lens,s_q,h_q,block_size", [
    ([0, 1, 63, 64, 65, 300, 1000, 4097], 1, 128, 64),
    ([0, 1, 63, 64, 65, 300, 1000, 4097], 2, 128, 61),
    ([5, 64, 129, 2000], 3, 16, 1),
    ([0, 17, 700], 1, 40, 16),
    ([0, 40, 333, 1500], 2, 64, 32),
    ([3, 64, 200], 1, 128, 8),
    ([20000], 2, 64, 256),
])
def test_64_row_tiles(fmt, path, dtype, lens, s_q, h_q, block_size, monkeypatch):
    """More than 32 query rows (s_q x h_q) per request: 64-row tiles. On sm90 the default runs them on
    wgmma (csrc/decode/sm90/; 16-bit cache pages by TMA at block sizes 8, 16, 32, 64 and 256, fp8
    formats dequantised), MLA_EXT_DECODE_WGMMA=0 on the portable mma.sync kernel; both
    against the reference, causal and not, unused slots NaN, padded pages, fp8_ds_mla scales that are
    not powers of two, one request long enough to be split (partials + combine). 16-bit caches that
    TMA copies (block sizes that are multiples of 64, or 8, 16, 32) take the tile-pairs kernel
    (decode_split_wgmma_pairs.cu) by default; "split_tiles" (MLA_EXT_DECODE_PAIRS=0) runs them on
    decode_split_wgmma.cu instead (its TMA path in whole pages, else cp.async)."""
    if path == "split_tiles" and (fmt != "auto" or not (block_size % 64 == 0 or block_size in (8, 16, 32))):
        pytest.skip("the same kernel as the default path: only 16-bit caches copied by TMA have two")
    if path == "split_tiles":
        monkeypatch.setenv("MLA_EXT_DECODE_PAIRS", "0")
    if path == "portable64":
        monkeypatch.setenv("MLA_EXT_DECODE_WGMMA", "0")
    inp = make_inputs(lens, s_q, h_q, block_size, fmt, dtype=dtype, page_pad=3 if block_size == 61 else 0,
                      arbitrary_scales=fmt == "fp8_ds_mla", device="cuda")
    for causal in (True, False):
        if fmt == "fp8_ds_mla":
            check_rounded_tiles(inp, causal)
        else:
            check(inp, causal)


@pytest.mark.parametrize("fmt,block_size", [("auto", 16), ("auto", 64), ("auto", 128), ("fp8", 16), ("fp8_ds_mla", 16)])
def test_small_wgmma_64_rows(fmt, block_size):
    """Small cases of the sm90 64-row wgmma kernels for the sanitizers (-k small): split and whole
    requests, rows past the sequence in the last tile (16-bit caches: the tile-pairs kernel, TMA
    pages whose unused rows hold NaN and are zeroed, four pages per tile at block size 16; fp8
    formats: the tile-splitting kernel, cp.async rows through the staging buffer)."""
    inp = make_inputs([0, 1, 65, 130, 300], 2, 64, block_size, fmt, arbitrary_scales=fmt == "fp8_ds_mla", device="cuda")
    if fmt == "fp8_ds_mla":
        check_rounded_tiles(inp, causal=True)
    else:
        check(inp, causal=True)


def _decode_kernels_run(fn):
    """Names of the decode split kernels one call of fn launches (torch profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if "decode_split" in e.name}


@pytest.mark.parametrize("fmt", FORMATS)
def test_wgmma_env_selects_kernel(fmt, monkeypatch):
    """On sm90 64-row tiles run the wgmma kernel, MLA_EXT_DECODE_WGMMA=0 (and MLA_EXT_FORCE_PORTABLE=1)
    the portable one: so "portable64" above tests what it names."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel is the sm90 path")
    for var in ("MLA_EXT_DECODE_WGMMA", "MLA_EXT_DECODE_PAIRS", "MLA_EXT_FORCE_PORTABLE"):
        monkeypatch.delenv(var, raising=False)
    inp = make_inputs([300, 70], 1, 128, 64, fmt, device="cuda")
    call = lambda: run_op(inp, True)  # noqa: E731
    default = _decode_kernels_run(call)
    monkeypatch.setenv("MLA_EXT_DECODE_WGMMA", "0")
    portable = _decode_kernels_run(call)
    assert len(default) == 1 and any("wgmma" in n for n in default), default
    assert len(portable) == 1 and not any("wgmma" in n for n in portable), portable
    # 16-bit pages of 64 keys: the tile-pairs kernel, MLA_EXT_DECODE_PAIRS=0 the tile-splitting one.
    assert any("pairs" in n for n in default) == (fmt == "auto"), default
    monkeypatch.delenv("MLA_EXT_DECODE_WGMMA")
    monkeypatch.setenv("MLA_EXT_DECODE_PAIRS", "0")
    split = _decode_kernels_run(call)
    assert len(split) == 1 and any("wgmma" in n for n in split) and not any("pairs" in n for n in split), split
    monkeypatch.delenv("MLA_EXT_DECODE_PAIRS")
    # Pages of 16 keys (four per tile): the tile-pairs kernel too.
    small_pages = _decode_kernels_run(lambda: run_op(make_inputs([300, 70], 1, 128, 16, fmt, device="cuda"), True))
    assert any("pairs" in n for n in small_pages) == (fmt == "auto"), small_pages
    monkeypatch.setenv("MLA_EXT_FORCE_PORTABLE", "1")
    assert _decode_kernels_run(call) == portable


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("block_size,row_pad,packed", [(64, 0, True), (16, 0, True), (64, 16, False), (61, 0, False)])
def test_fp8_raw_rows_selected(fmt, block_size, row_pad, packed):
    """The mma.sync fp8 kernels copy raw rows (the second-last template argument) when rows are packed
    (656 / 576 bytes) and block_size is a multiple of 16: by bulk copies (the last argument) on sm90
    and newer unless MLA_EXT_DECODE_BULK_ROWS=0, else by cp.async (fp8_ds_mla only); otherwise rows
    with 4 (fp8) or 8 (fp8_ds_mla) threads each."""
    if os.environ.get("MLA_EXT_DECODE_ROW_THREADS"):
        pytest.skip("MLA_EXT_DECODE_ROW_THREADS asks for row copies")
    bulk = packed and torch.cuda.get_device_capability() >= (9, 0) and os.environ.get("MLA_EXT_DECODE_BULK_ROWS") != "0"
    raw = bulk or (packed and fmt == "fp8_ds_mla")
    inp = make_inputs([300, 70], 1, 16, block_size, fmt, row_pad=row_pad, device="cuda")
    names = _decode_kernels_run(lambda: check(inp, causal=True, force_portable=True))
    fp8 = [n for n in names if "decode_split_fp8_kernel" in n]
    assert len(fp8) == 1, names
    flags = [a.strip() for a in fp8[0].split(">(")[0].split(",")[-2:]]
    assert flags == [str(raw).lower(), str(bulk).lower()], names


def test_cuda_graph_replay():
    """Capture plan + two layers' decode once; replay with new seq_lens values and cache contents."""
    b, s_q, h_q, fmt = 6, 2, 16, "fp8_ds_mla"
    static = make_inputs([300] * b, s_q, h_q, 64, fmt, device="cuda")
    cap = {k: v for k, v in static.items()}
    run = lambda: (lambda plan: (run_op(cap, True, plan=plan), run_op(cap, True, plan=plan)))(  # noqa: E731
        mla_ext.get_decode_plan(cap["seq_lens"], s_q, h_q, fmt))
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (o1, l1), (o2, l2) = run()
    for lens in ([1, 0, 300, 64, 65, 299], [300, 300, 17, 1, 2, 250]):
        fresh = make_inputs(lens, s_q, h_q, 64, fmt, device="cuda")
        # same shapes: copy everything into the captured buffers
        nb = fresh["kv_cache"].shape[0]
        assert nb <= static["kv_cache"].shape[0]
        cap["q"].copy_(fresh["q"])
        cap["kv_cache"][:nb].copy_(fresh["kv_cache"])
        cap["block_table"].fill_(1 << 30)
        cap["block_table"][:, : fresh["block_table"].shape[1]].copy_(fresh["block_table"])
        cap["seq_lens"].copy_(fresh["seq_lens"])
        graph.replay()
        torch.cuda.synchronize()
        eager_out, eager_lse = run_op(cap, True)
        assert torch.equal(o1, eager_out) and torch.equal(o2, eager_out)
        assert torch.equal(l1, eager_lse) and torch.equal(l2, eager_lse)
        ref_out, ref_lse = run_reference(cap, True)
        assert_close(o1, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2)


def test_torch_compile_fullgraph():
    inp = make_inputs([10, 400], 1, 16, 64, "auto", device="cuda")

    @torch.compile(fullgraph=True)
    def step(q, kv_cache, block_table, seq_lens):
        out, lse = torch.ops.mla_ext.decode_mla(q, kv_cache, block_table, seq_lens, 192**-0.5, "auto", True)
        return out.float() * 2, lse

    out, lse = step(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"])
    ref_out, ref_lse = run_reference(inp, True)
    assert_close(out / 2, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2)
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=2e-3, rtol=1e-4)


def test_opcheck():
    inp = make_inputs([10, 100], 1, 16, 16, "fp8_ds_mla", device="cuda")
    args = (inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], 192**-0.5, "fp8_ds_mla", True, None)
    torch.library.opcheck(torch.ops.mla_ext.decode_mla.default, args)
    torch.library.opcheck(torch.ops.mla_ext.decode_plan.default, (inp["seq_lens"], 1, 16, "fp8_ds_mla", 132))
    out = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(2, 16, 1, device="cuda")
    torch.library.opcheck(torch.ops.mla_ext.decode_mla_out.default, args + (None, None, False, out, lse))


def test_small_for_sanitizer():
    """Kept tiny for compute-sanitizer (memcheck / racecheck): -k small."""
    for fmt in FORMATS:
        for s_q in (1, 2):  # 16- and 32-row tiles (the fp8 formats pipeline them differently)
            inp = make_inputs([0, 3, 130], s_q, 16, 16, fmt, device="cuda")
            check(inp, causal=True)
    inp = make_inputs([70], 1, 64, 64, "auto", device="cuda")
    check(inp, causal=True)


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
def test_small_whole_tile_copies(fmt, block_size):
    """On sm90 the fp8 kernel copies tiles with TMA, one box per page (a tile is 1, 2, 4 or 8 pages):
    rows past the sequence arrive as the page holds them (NaN here) and must be zeroed. Kept small
    for the sanitizers (-k small); the cp.async copies of the same kernel: test_fp8_16_row_loaders."""
    inp = make_inputs([0, 1, 63, 64, 65, 130, 700], 1, 16, block_size, fmt, arbitrary_scales=fmt == "fp8_ds_mla",
                      device="cuda")
    check(inp, causal=True)
    check(inp, causal=False)


_ROW_THREADS_CHECK = """
import torch
from conftest import assert_close
from mla_ext.bench.decode import make_inputs, run_op, run_reference
torch.manual_seed(7)
for fmt in ("fp8", "fp8_ds_mla"):
    # (raw rows need packed rows (656 / 576 bytes) and 16-row pieces of pages: bs 16, 64, 48; bs 61 and
    # padded rows take the row copies whatever the environment says; fp8 raw rows only by bulk copies)
    for block_size, page_pad, row_pad in ((16, 0, 0), (61, 3, 0), (64, 0, 0), (48, 0, 0), (32, 0, 16)):
        for h_q in (5, 16):
            inp = make_inputs([0, 1, 63, 64, 65, 300, 1000], 1, h_q, block_size, fmt, page_pad=page_pad, row_pad=row_pad,
                              arbitrary_scales=fmt == "fp8_ds_mla")
            ref_out, ref_lse = run_reference(inp, True)
            for portable in (False, True):  # on sm90: the wgmma QK^T kernel, then the mma.sync one
                out, lse = run_op(inp, True, force_portable=portable)
                name = f"{fmt} bs{block_size} pad{page_pad},{row_pad} h{h_q} portable={portable}"
                assert_close(out, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2, name="out " + name)
                assert_close(lse, ref_lse, cos_tol=1e-7, atol=2e-3, rtol=1e-4, name="lse " + name)
print("ok")
"""


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("h_q", [1, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_16_rows_portable_kernel(fmt, h_q, dtype):
    """The mma.sync fp8 kernel that sm100 runs; on an H200 the default is the one with QK^T on wgmma."""
    inp = make_inputs([0, 1, 63, 64, 65, 300, 1000, 4097], 1, h_q, 64, fmt, dtype=dtype,
                      arbitrary_scales=fmt == "fp8_ds_mla", device="cuda")
    check(inp, causal=True, force_portable=True)


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("block_size", [16, 64, 128, 192])
def test_fp8_16_rows_long_pieces(fmt, block_size):
    """A plan for 3 SMs, so that each CTA of the 16-row fp8 kernel walks several pieces of up to ~60
    tiles that start and end mid-request (the two teams' stages are reused across pieces, team 1's for
    the end-of-piece exchange too); pages hold 1-3 tiles (block_size 192: rows 0, 64, 128)."""
    lens = [0, 1, 64 * 37 + 5, 3000, 64 * 16, 641, 2 * 192]
    inp = make_inputs(lens, 1, 16, block_size, fmt, arbitrary_scales=fmt == "fp8_ds_mla", device="cuda")
    plan = mla_ext.get_decode_plan(inp["seq_lens"], 1, 16, fmt, num_sms=3)
    check(inp, causal=True, force_portable=True, plan=plan)


@pytest.mark.parametrize("row_threads,tma_tiles,bulk_rows",
                         [("4", "1", "1"), ("8", "1", "1"), ("4", "0", "1"), ("8", "0", "1"), ("0", "0", "1"), ("0", "0", "0")])
def test_fp8_16_row_loaders(row_threads, tma_tiles, bulk_rows):
    """Every tile loader of the fp8 16-row kernel: cp.async with 4 or 8 threads per cache row (fp8 uses
    4 by default, MLA_EXT_DECODE_ROW_THREADS forces either), raw fp8_ds_mla rows on the mma.sync path
    (its default where the layout allows; row threads "0" = unset), by bulk copies on sm90 and newer
    or by cp.async (MLA_EXT_DECODE_BULK_ROWS=0), and, on sm90 where a tile is one page, TMA
    (MLA_EXT_DECODE_TMA_TILES=0 turns it off); env read once per process."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, MLA_EXT_DECODE_ROW_THREADS=row_threads, MLA_EXT_DECODE_TMA_TILES=tma_tiles,
               MLA_EXT_DECODE_BULK_ROWS=bulk_rows,
               PYTHONPATH=os.pathsep.join([os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _ROW_THREADS_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-2000:] + res.stderr[-4000:]
