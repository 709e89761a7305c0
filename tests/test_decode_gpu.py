"""decode_mla on the GPU against the fp32 reference: formats, head counts, s_q, block sizes,
edge lengths, NaN in every unused slot, pages in random order, CUDA graphs, torch.compile; and
which split kernel each kind of input reaches (csrc/decode/dispatch.cu), on the architecture's
path and forced portable."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from bad_inputs import DECODE_CASES, decode_inputs
from conftest import (CACHE_FORMAT, SCALAR, assert_close, is_sm90, kernel_is, launched_kernels, set_force_portable,
                      use_path)

import mla_ext
from mla_ext import reference
from mla_ext.bench.decode import make_inputs, run_op, run_reference

pytestmark = pytest.mark.gpu

FORMATS = ("auto", "fp8", "fp8_ds_mla")
SCALE = 192**-0.5


def check(inp, causal, lse_atol=2e-3, **kw):
    out, lse = run_op(inp, causal, **kw)
    check_result(inp, causal, out, lse, lse_atol)
    return out, lse


def check_result(inp, causal, out, lse, lse_atol=2e-3):
    ref_out, ref_lse = run_reference(inp, causal)
    assert out.dtype == inp["q"].dtype and lse.dtype == torch.float32
    # out: bf16/fp16 rounding of P and of the result; lse: fp32 (inputs are exact in bf16).
    assert_close(out, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2, name="out")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=lse_atol, rtol=1e-4, name="lse")


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
    # A cache that contradicts kv_cache_dtype is refused also with a plan of that format.
    for fmt, cache_fmt, msg in (("auto", "fp8_ds_mla", "kv_cache_dtype='auto' needs a kv_cache of q's dtype"),
                                ("fp8_ds_mla", "auto", "kv_cache must be uint8 for kv_cache_dtype='fp8_ds_mla'")):
        other = make_inputs([5, 40], 1, 4, 16, cache_fmt, device="cuda")
        plan = mla_ext.get_decode_plan(other["seq_lens"], 1, 4, fmt)
        with pytest.raises(RuntimeError, match=msg):
            mla_ext.decode_mla(other["q"], other["kv_cache"], other["block_table"], other["seq_lens"], SCALE, fmt,
                               plan=plan)


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
@pytest.mark.parametrize("portable_arg", [True, False])
def test_out_buffers_and_force_portable(h_q, portable_arg, request):
    """out= a strided view and lse= a buffer, written in place and nothing around them (h_q 64 on sm90,
    unforced: the tile-pairs kernel's epilogue); then the same inputs with the portable kernels forced
    for the process (mla_ext._library.set_force_portable)."""
    inp = make_inputs([70, 900], 2, h_q, 64, "auto", device="cuda")
    big = torch.full((2, 2, h_q + 4, 512), 7.0, dtype=torch.bfloat16, device="cuda")
    out = big[:, :, 2:2 + h_q]  # strided view
    lse = torch.empty(2, h_q, 2, device="cuda")
    o, l_ = run_op(inp, True, out=out, lse=lse, force_portable=portable_arg)
    assert o.data_ptr() == out.data_ptr() and l_ is lse
    ref_out, ref_lse = run_reference(inp, True)
    assert_close(out, ref_out, cos_tol=2e-5, atol=2e-2, rtol=2e-2)
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=2e-3, rtol=1e-4, name="lse")
    assert bool((big[:, :, :2] == 7).all()) and bool((big[:, :, 2 + h_q:] == 7).all())
    use_path(request, "portable")
    check(inp, causal=True)


def test_force_portable_hook():
    """set_force_portable(1) runs the kernel that decode_mla(force_portable=True) runs, bit for bit;
    0 the architecture's kernels (on sm90: the tile-pairs kernel for these 64-row tiles) whatever
    MLA_EXT_FORCE_PORTABLE says; -1 the environment's choice again."""
    inp = make_inputs([70, 900, 3], 1, 64, 64, "auto", device="cuda")
    call = lambda **kw: launched_kernels(lambda: run_op(inp, True, **kw), "decode_split")  # noqa: E731
    try:
        set_force_portable(1)
        (out_p, lse_p), forced = call()
        set_force_portable(0)
        (out_a, lse_a), arch = call()
        (out_arg, lse_arg), by_arg = call(force_portable=True)
        set_force_portable(-1)
        _, env = call()
    finally:
        set_force_portable(-1)
    assert by_arg == forced and torch.equal(out_arg, out_p) and torch.equal(lse_arg, lse_p), (by_arg, forced)
    assert len(forced) == 1 and kernel_is(forced[0], "portable::decode_split_kernel",
                                          (SCALAR[torch.bfloat16], CACHE_FORMAT["auto"], 64)), forced
    if is_sm90():
        pairs = ("decode_split_wgmma_pairs_kernel", (SCALAR[torch.bfloat16], CACHE_FORMAT["auto"], False))
        assert len(arch) == 1 and kernel_is(arch[0], *pairs), arch
    env_forced = os.environ.get("MLA_EXT_FORCE_PORTABLE", "") not in ("", "0")
    assert env == (forced if env_forced else arch), (env, env_forced)
    check_result(inp, True, out_a, lse_a)
    check_result(inp, True, out_p, lse_p)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", ["default", "portable"])
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
def test_64_row_tiles(fmt, path, dtype, lens, s_q, h_q, block_size, request):
    """More than 32 query rows (s_q x h_q) per request: 64-row tiles. On sm90 the default runs them on
    wgmma (csrc/decode/sm90/): 16-bit caches whose pages TMA copies (block sizes 8, 16, 32 and
    multiples of 64) on the tile-pairs kernel, the others (block sizes 1, 61) and the fp8 formats
    (dequantised) on decode_split_wgmma.cu with cp.async; "portable" (forced) on the mma.sync kernel.
    Both against the reference, causal and not, unused slots NaN, padded pages, fp8_ds_mla scales
    that are not powers of two, one request long enough to be split (partials + combine)."""
    use_path(request, path)
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
    plan = mla_ext.get_decode_plan(inp["seq_lens"], 1, 16, "fp8_ds_mla")
    torch.library.opcheck(torch.ops.mla_ext.decode_mla.planned,
                          args[:5] + (plan.schedule, plan.split_info, plan.workspace))
    # The planned overload's format is the cache's own; an fp8 cache (which needs its scale) is refused.
    fp8 = make_inputs([10, 100], 1, 16, 16, "fp8", device="cuda")
    with pytest.raises(RuntimeError, match=r"planned overload takes .* kv_cache_dtype='fp8' and its scale"):
        torch.ops.mla_ext.decode_mla.planned(fp8["q"], fp8["kv_cache"], fp8["block_table"], fp8["seq_lens"], 192**-0.5,
                                             plan.schedule, plan.split_info, plan.workspace)


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
    for the sanitizers (-k small); the cp.async copies of the same kernel: test_small_decode_kernels."""
    inp = make_inputs([0, 1, 63, 64, 65, 130, 700], 1, 16, block_size, fmt, arbitrary_scales=fmt == "fp8_ds_mla",
                      device="cuda")
    check(inp, causal=True)
    check(inp, causal=False)


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
@pytest.mark.parametrize("portable", [False, True])
def test_fp8_16_rows_long_pieces(fmt, block_size, portable):
    """A plan for 3 SMs, so that each CTA of the 16-row fp8 kernel walks several pieces of up to ~60
    tiles that start and end mid-request (the two teams' stages are reused across pieces, team 1's for
    the end-of-piece exchange too); pages hold 1-3 tiles (block_size 192: rows 0, 64, 128). On sm90
    unforced: the wgmma QK^T variant with TMA tiles (block size 16: four pages per tile); forced
    portable: the mma.sync variant with raw rows by bulk copies."""
    lens = [0, 1, 64 * 37 + 5, 3000, 64 * 16, 641, 2 * 192]
    inp = make_inputs(lens, 1, 16, block_size, fmt, arbitrary_scales=fmt == "fp8_ds_mla", device="cuda")
    plan = mla_ext.get_decode_plan(inp["seq_lens"], 1, 16, fmt, num_sms=3)
    check(inp, causal=True, force_portable=portable, plan=plan)


# ---- which split kernel each kind of input reaches (csrc/decode/dispatch.cu) -------------------

_BF16, _FP16 = torch.bfloat16, torch.float16
# The fp8 16-row kernel's TMA tile copies (csrc/decode/kernels.h TmaTiles): none (cp.async rows),
# one page of whole tiles (block sizes that are multiples of 64), 2-8 pages per tile (8, 16, 32).
_TMA_NONE, _TMA_WHOLE_PAGE, _TMA_PAGES = 0, 1, 2


def _portable(dtype, fmt, block_m):
    return "portable::decode_split_kernel", (SCALAR[dtype], CACHE_FORMAT[fmt], block_m)


def _fp8_16_rows(dtype, fmt, *, qk_wgmma=False, tma=_TMA_NONE, raw_rows=False):
    # Threads per cache row of the row copies: 8 for fp8_ds_mla, 4 for fp8; 8 where nothing copies rows.
    row_threads = 8 if tma != _TMA_NONE or raw_rows or fmt == "fp8_ds_mla" else 4
    return "decode_split_fp8_kernel", (SCALAR[dtype], CACHE_FORMAT[fmt], row_threads, qk_wgmma, tma, raw_rows)


def _wgmma(dtype, fmt):
    return "hopper::decode_split_wgmma_kernel", (SCALAR[dtype], CACHE_FORMAT[fmt])


def _pairs(dtype, page_boxes, fmt="auto"):
    return "decode_split_wgmma_pairs_kernel", (SCALAR[dtype], CACHE_FORMAT[fmt], page_boxes)


@dataclasses.dataclass(frozen=True)
class DispatchCase:
    """One kind of decode input and the split kernel it runs on sm90 (bf16 q, not forced) and on
    the portable path (forced, or a GPU other than sm90)."""

    id: str
    fmt: str
    block_size: int
    sm90: tuple
    portable: tuple
    s_q: int = 1
    h_q: int = 16
    dtype: torch.dtype = _BF16
    page_pad: int = 0  # extra (NaN) rows per page
    row_pad: int = 0   # extra (NaN) elements per row: rows not packed, strides still multiples of 16 bytes

    def inputs(self):
        return make_inputs([0, 1, 63, 64, 65, 130, 700], self.s_q, self.h_q, self.block_size, self.fmt,
                           dtype=self.dtype, page_pad=self.page_pad, row_pad=self.row_pad, device="cuda")


def _dispatch_cases() -> list[DispatchCase]:
    cases = []

    def add(id, fmt, block_size, sm90, portable=None, **kw):
        cases.append(DispatchCase(id, fmt, block_size, sm90, sm90 if portable is None else portable, **kw))

    # <= 16 query rows, 16-bit cache: the portable 16-row kernel everywhere.
    add("auto_h16_bs64", "auto", 64, _portable(_BF16, "auto", 16))
    add("auto_s3_h5_bs61", "auto", 61, _portable(_BF16, "auto", 16), s_q=3, h_q=5, page_pad=3)
    add("auto_fp16_h16_bs16", "auto", 16, _portable(_FP16, "auto", 16), dtype=_FP16)
    # <= 16 rows, fp8 caches: the fp8 16-row kernel. sm90, bf16 q: QK^T on wgmma, tiles by TMA where
    # the tensor map builds (block sizes 8, 16, 32 and multiples of 64; any strides the binding takes),
    # else cp.async rows (block sizes 1, 48, 61, 100). Forced portable, and fp16 q on sm90: mma.sync,
    # raw rows by bulk copies where rows are packed and block_size % 16 == 0, else row copies.
    for fmt in ("fp8", "fp8_ds_mla"):
        whole = _fp8_16_rows(_BF16, fmt, qk_wgmma=True, tma=_TMA_WHOLE_PAGE)
        pages = _fp8_16_rows(_BF16, fmt, qk_wgmma=True, tma=_TMA_PAGES)
        rows_wgmma = _fp8_16_rows(_BF16, fmt, qk_wgmma=True)
        raw, rows = _fp8_16_rows(_BF16, fmt, raw_rows=True), _fp8_16_rows(_BF16, fmt)
        raw16, rows16 = _fp8_16_rows(_FP16, fmt, raw_rows=True), _fp8_16_rows(_FP16, fmt)
        add(f"{fmt}_bs64", fmt, 64, whole, raw)
        add(f"{fmt}_bs192_pagepad", fmt, 192, whole, raw, page_pad=3)
        add(f"{fmt}_bs128_rowpad", fmt, 128, whole, rows, row_pad=32)
        add(f"{fmt}_bs8", fmt, 8, pages, rows)
        add(f"{fmt}_bs16", fmt, 16, pages, raw)
        add(f"{fmt}_h5_bs16_pagepad", fmt, 16, pages, raw, h_q=5, page_pad=5)
        add(f"{fmt}_bs32_rowpad", fmt, 32, pages, rows, row_pad=16)
        add(f"{fmt}_bs1", fmt, 1, rows_wgmma, rows)
        add(f"{fmt}_bs48", fmt, 48, rows_wgmma, raw)
        add(f"{fmt}_bs61_pagepad", fmt, 61, rows_wgmma, rows, page_pad=3)
        add(f"{fmt}_s2_h8_bs100", fmt, 100, rows_wgmma, rows, s_q=2, h_q=8)
        add(f"{fmt}_fp16_bs64", fmt, 64, raw16, dtype=_FP16)
        add(f"{fmt}_fp16_bs16_rowpad", fmt, 16, rows16, dtype=_FP16, row_pad=16)
        add(f"{fmt}_fp16_bs61_pagepad", fmt, 61, rows16, dtype=_FP16, page_pad=3)
    # 17-32 rows. 16-bit cache: on sm90 the 64-row kernels below (one tile, rows padded), the portable
    # 32-row kernel when forced. fp8 caches: the fp8 16-row kernel, two row blocks.
    add("auto_s2_h16_bs16", "auto", 16, _pairs(_BF16, True), _portable(_BF16, "auto", 32), s_q=2)
    add("auto_fp16_h20_bs61", "auto", 61, _wgmma(_FP16, "auto"), _portable(_FP16, "auto", 32), h_q=20, dtype=_FP16,
        page_pad=3)
    add("auto_h32_bs64", "auto", 64, _pairs(_BF16, False), _portable(_BF16, "auto", 32), h_q=32)
    for fmt in ("fp8", "fp8_ds_mla"):
        add(f"{fmt}_s2_h16_bs16", fmt, 16, _fp8_16_rows(_BF16, fmt, qk_wgmma=True, tma=_TMA_PAGES),
            _fp8_16_rows(_BF16, fmt, raw_rows=True), s_q=2)
        add(f"{fmt}_fp16_h20_bs61", fmt, 61, _fp8_16_rows(_FP16, fmt), h_q=20, dtype=_FP16, page_pad=3)
        add(f"{fmt}_h32_bs64", fmt, 64, _fp8_16_rows(_BF16, fmt, qk_wgmma=True, tma=_TMA_WHOLE_PAGE),
            _fp8_16_rows(_BF16, fmt, raw_rows=True), h_q=32)
        add(f"{fmt}_s2_h13_bs48", fmt, 48, _fp8_16_rows(_BF16, fmt, qk_wgmma=True),
            _fp8_16_rows(_BF16, fmt, raw_rows=True), s_q=2, h_q=13)
    # > 32 rows. sm90, 16-bit cache and fp8_ds_mla with bf16 q: the tile-pairs kernel where the
    # tensor maps build (page boxes for block sizes 8, 16, 32), else decode_split_wgmma.cu; fp8 and
    # fp16 q with fp8_ds_mla: decode_split_wgmma.cu. Forced portable: the portable 64-row kernel.
    for dtype, name in ((_BF16, ""), (_FP16, "_fp16")):
        p64 = _portable(dtype, "auto", 64)
        add(f"auto{name}_h64_bs64", "auto", 64, _pairs(dtype, False), p64, h_q=64, dtype=dtype)
        add(f"auto{name}_h128_bs256_rowpad", "auto", 256, _pairs(dtype, False), p64, h_q=128, dtype=dtype, row_pad=8)
        add(f"auto{name}_h64_bs16", "auto", 16, _pairs(dtype, True), p64, h_q=64, dtype=dtype)
        add(f"auto{name}_s2_h32_bs8_pagepad", "auto", 8, _pairs(dtype, True), p64, s_q=2, h_q=32, dtype=dtype,
            page_pad=1)
        add(f"auto{name}_h40_bs32", "auto", 32, _pairs(dtype, True), p64, h_q=40, dtype=dtype)
        add(f"auto{name}_h64_bs61_pagepad", "auto", 61, _wgmma(dtype, "auto"), p64, h_q=64, dtype=dtype, page_pad=3)
        add(f"auto{name}_h64_bs1", "auto", 1, _wgmma(dtype, "auto"), p64, h_q=64, dtype=dtype)
        add(f"auto{name}_h128_bs48", "auto", 48, _wgmma(dtype, "auto"), p64, h_q=128, dtype=dtype)
        for fmt in ("fp8", "fp8_ds_mla"):
            p64 = _portable(dtype, fmt, 64)
            pairs = fmt == "fp8_ds_mla" and dtype == _BF16
            whole, boxes = (_pairs(dtype, False, fmt), _pairs(dtype, True, fmt)) if pairs else (_wgmma(dtype, fmt),) * 2
            add(f"{fmt}{name}_h64_bs64", fmt, 64, whole, p64, h_q=64, dtype=dtype)
            add(f"{fmt}{name}_h128_bs16_rowpad", fmt, 16, boxes, p64, h_q=128, dtype=dtype, row_pad=16)
            add(f"{fmt}{name}_s2_h20_bs128_pagepad", fmt, 128, whole, p64, s_q=2, h_q=20, dtype=dtype, page_pad=5)
            add(f"{fmt}{name}_s3_h16_bs61_pagepad", fmt, 61, _wgmma(dtype, fmt), p64, s_q=3, dtype=dtype, page_pad=3)
    return cases


DISPATCH_CASES = {c.id: c for c in _dispatch_cases()}


@pytest.mark.parametrize("path", ["arch", "portable"])
@pytest.mark.parametrize("case", DISPATCH_CASES.values(), ids=DISPATCH_CASES.keys())
def test_decode_dispatch(case, path, request):
    """Each kind of input (format, block size, packed or padded rows and pages, q dtype, query rows)
    runs the split kernel csrc/decode/dispatch.cu names for it, on the architecture's path ("arch":
    on sm90 the wgmma / TMA kernels) and forced portable, and matches the reference."""
    use_path(request, path)
    inp = case.inputs()
    (out, lse), names = launched_kernels(lambda: run_op(inp, True), "decode_split")
    want = case.sm90 if path == "arch" and is_sm90() else case.portable
    assert len(names) == 1 and kernel_is(names[0], *want), (names, want)
    check_result(inp, True, out, lse)


# Small cases of the split kernels that test_small_for_sanitizer, test_small_wgmma_64_rows and
# test_small_whole_tile_copies leave out, for the sanitizers (-k small): "default" is the
# environment's path (on sm90 unforced: the architecture's kernels), "portable" forced portable.
SMALL_CASES = [
    ("fp8_bs61_pagepad", "default"),        # sm90: wgmma QK^T, cp.async rows, 4 threads per row
    ("fp8_ds_mla_bs61_pagepad", "default"),  # ... 8 threads per row
    ("fp8_fp16_bs64", "default"),           # mma.sync, raw rows by bulk copies (fp16 q)
    ("fp8_ds_mla_fp16_bs61_pagepad", "default"),  # mma.sync, row copies (fp16 q)
    ("fp8_ds_mla_bs64", "portable"),        # mma.sync, raw rows (bf16 q)
    ("fp8_bs61_pagepad", "portable"),       # mma.sync, row copies (bf16 q)
    ("auto_h64_bs61_pagepad", "default"),   # sm90: decode_split_wgmma.cu on a 16-bit cache
    ("auto_h64_bs64", "portable"),          # the portable 64-row kernel, each format
    ("fp8_h64_bs64", "portable"),
    ("fp8_ds_mla_s3_h16_bs61_pagepad", "portable"),
    ("fp8_ds_mla_s2_h13_bs48", "default"),  # fp8 16-row kernel, two row blocks (26 rows)
    ("fp8_ds_mla_h64_bs64", "default"),     # sm90: tile pairs with the converter warpgroup, whole pages
    ("fp8_ds_mla_h128_bs16_rowpad", "default"),  # ... page boxes, two row tiles
    ("fp8_ds_mla_s2_h20_bs128_pagepad", "default"),  # ... 40 rows: padding rows, causal
    ("fp8_s2_h13_bs48", "portable"),
]


@pytest.mark.parametrize("case,path", [(DISPATCH_CASES[i], p) for i, p in SMALL_CASES],
                         ids=[f"{i}-{p}" for i, p in SMALL_CASES])
def test_small_decode_kernels(case, path, request):
    """The inputs of test_decode_dispatch for the kernels above, checked against the reference without
    the profiler (which does not run under compute-sanitizer)."""
    use_path(request, path)
    inp = case.inputs()
    check(inp, causal=True)
    if case.s_q > 1:
        check(inp, causal=False)
