"""decode_mla and decode_plan without a GPU: reference properties, the plan's invariants,
schemas (opcheck on CPU), fakes under torch.compile, and clear errors for bad input."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from bad_inputs import DECODE_CASES, decode_inputs

import mla_ext
from mla_ext import reference
from mla_ext.bench.decode import SOFTMAX_SCALE, make_inputs, run_op, run_reference


def dense_attention(q, rows, scale, limits):
    """Textbook attention for one request: q [s_q, h, 576], rows [n, 576] fp32."""
    s_q = q.shape[0]
    out = torch.zeros(s_q, q.shape[1], 512)
    lse = torch.full((q.shape[1], s_q), float("-inf"))
    for j in range(s_q):
        n = limits[j]
        if n == 0:
            continue
        scores = q[j].float() @ rows[:n].T * scale  # [h, n]
        lse[:, j] = torch.logsumexp(scores, -1)
        out[j] = torch.softmax(scores, -1) @ rows[:n, :512]
    return out, lse


@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_dense_attention(causal):
    inp = make_inputs([0, 1, 5, 70], 3, 4, 16, "auto", device="cpu")
    out, lse = run_reference(inp, causal)
    rows = reference.dequantize_cache(inp["kv_cache"], "auto")
    for i, n in enumerate([0, 1, 5, 70]):
        pos = torch.arange(n)
        seq_rows = rows[inp["block_table"][i].long()[pos // 16], pos % 16] if n else rows[:0, 0]
        limits = reference.decode_key_limits(n, 3, causal)
        ref_o, ref_l = dense_attention(inp["q"][i], seq_rows, SOFTMAX_SCALE, limits)
        torch.testing.assert_close(out[i].float(), ref_o, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse[i], ref_l)


def test_reference_edge_semantics():
    inp = make_inputs([0, 1, 2], 2, 3, 4, "auto", device="cpu")
    out, lse = run_reference(inp, causal=True)
    assert bool((out[0] == 0).all()) and bool(torch.isneginf(lse[0]).all())  # seq_len 0
    # seq_len 1, s_q 2, causal: query 0 sees nothing, query 1 sees position 0 (out = its kv_c)
    assert bool((out[1, 0] == 0).all()) and bool(torch.isneginf(lse[1, :, 0]).all())
    row = reference.dequantize_cache(inp["kv_cache"], "auto")[inp["block_table"][1, 0], 0]
    torch.testing.assert_close(out[1, 1].float(), row[:512].expand(3, 512).to(torch.bfloat16).float())
    torch.testing.assert_close(lse[1, :, 1], inp["q"][1, 1].float() @ row * SOFTMAX_SCALE)
    # s_q = 1: causal and not are the same
    one = make_inputs([9, 40], 1, 2, 8, "fp8_ds_mla", device="cpu")
    for a, b in zip(run_reference(one, True), run_reference(one, False)):
        assert torch.equal(a, b)


def test_reference_softmax_holds_at_huge_scores():
    """At softmax_scale 2^22 (scores ~2^27) the spec's weights still sum to 1 when two positions hold
    the same row (equal top scores): each weighs 1/2, as the same softmax in fp64 gives (an fp32 lse
    cannot hold log 2 there, and exp(scores - lse) gave each 1)."""
    torch.manual_seed(3)
    rows = torch.randn(8, 576).to(torch.bfloat16)
    rows[5] = rows[2]
    cache = rows.view(1, 8, 576)
    q = (rows[2].float() + 0.1 * torch.randn(1, 1, 2, 576)).to(torch.bfloat16)  # rows 2 and 5 score highest
    scale = 2.0**22
    out, lse = reference.decode_mla(q, cache, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([8], dtype=torch.int32),
                                    scale, "auto", False)
    r = rows.double()
    p = torch.softmax(q[0, 0].double() @ r.T * scale, dim=-1)
    want = p @ r[:, :512]
    torch.testing.assert_close(out[0, 0].double(), want.to(torch.bfloat16).double(), atol=0, rtol=1e-2)
    assert lse.abs().min() > 2.0**24


def test_reference_page_order_and_nan_slots():
    """Same tokens in shuffled pages, with NaN everywhere else, give the same result."""
    torch.manual_seed(1)
    inp = make_inputs([33, 90], 2, 4, 8, "auto", device="cpu", shuffle=False)
    perm = torch.randperm(inp["kv_cache"].shape[0])
    shuffled = dict(inp)
    shuffled["kv_cache"] = torch.empty_like(inp["kv_cache"])
    shuffled["kv_cache"][perm] = inp["kv_cache"]
    table = inp["block_table"].clone()
    ok = table < inp["kv_cache"].shape[0]
    table[ok] = perm[table[ok].long()].to(torch.int32)
    shuffled["block_table"] = table
    for a, b in zip(run_reference(inp, True), run_reference(shuffled, True)):
        assert torch.equal(a, b)
        assert not bool(torch.isnan(a).any())


@pytest.mark.parametrize("fmt", ["auto", "fp8", "fp8_ds_mla"])
def test_padded_cache_strides(fmt):
    """A cache whose pages and rows are padded (strided views, as make_inputs' page_pad / row_pad build
    them for the GPU kernels' copy paths) decodes like its contiguous copy; the padding holds NaN."""
    torch.manual_seed(2)
    inp = make_inputs([0, 5, 70], 1, 4, 16, fmt, device="cpu", page_pad=3, row_pad=16)
    assert inp["kv_cache"].stride(1) > inp["kv_cache"].shape[2] and not inp["kv_cache"].is_contiguous()
    dense = dict(inp, kv_cache=inp["kv_cache"].contiguous())
    for a, b in zip(run_op(inp, True), run_op(dense, True)):
        assert torch.equal(a, b) and not bool(torch.isnan(a).any())


@pytest.mark.parametrize("num_sms", [1, 7, 132])
@pytest.mark.parametrize("lens", [[0], [1], [65536], [0, 0, 5], [100] * 300, [70000, 3, 5, 1000, 64, 65]])
@pytest.mark.parametrize("s_q,h_q", [(1, 16), (2, 128), (16, 128)])
def test_plan_covers_every_tile_once(num_sms, lens, s_q, h_q):
    sched, info = reference.decode_plan(torch.tensor(lens, dtype=torch.int32), s_q, h_q, num_sms)
    num_parts = reference.decode_num_parts(num_sms, s_q, h_q)
    assert sched.shape == (num_parts, reference.DECODE_SCHEDULE_FIELDS), "one schedule row per part"
    tiles = [(n + 63) // 64 for n in lens]
    seen = [[0] * t for t in tiles]
    pieces = [[] for _ in lens]
    split_reqs = [r for r in range(len(lens)) if int(info[r, 0]) > 1]
    column = sched[:, 5].tolist()
    assert column == split_reqs + [-1] * (num_parts - len(split_reqs)), "split requests listed in order, then -1"
    for begin_req, begin_tile, end_req, end_tile, begin_split, *_ in sched.tolist():
        for r in range(begin_req, end_req + 1):
            t0 = begin_tile if r == begin_req else 0
            t1 = end_tile if r == end_req else tiles[r]
            pieces[r].append(begin_split if r == begin_req else 0)
            for t in range(t0, t1):
                seen[r][t] += 1
    assert all(c == 1 for s in seen for c in s)
    total_partials = 0
    for r, p in enumerate(pieces):
        assert sorted(p) == list(range(len(p))), "split indices 0..n-1, each once"
        assert int(info[r, 0]) == len(p)
        if len(p) > 1:
            assert int(info[r, 1]) == total_partials
            total_partials += len(p)
        else:
            assert int(info[r, 1]) == -1
    assert total_partials <= num_parts + min(len(lens), num_parts)  # decode::max_partials_for


def _check_plan_invariants(lens, s_q, h_q, num_sms):
    """Every tile covered exactly once; split indices 0..n-1 per request and partial slots in
    request order; the split list; at most max_partials slots; no empty piece of a split request;
    each part's cost (its tiles plus the overhead of the requests it starts) within one request's
    overhead and one tile of the even share."""
    sched, info = reference.decode_plan(torch.tensor(lens, dtype=torch.int32), s_q, h_q, num_sms)
    num_parts = reference.decode_num_parts(num_sms, s_q, h_q)
    assert sched.shape == (num_parts, reference.DECODE_SCHEDULE_FIELDS) and info.shape == (len(lens), 2)
    tiles = [(max(n, 0) + 63) // 64 for n in lens]
    covered = [[] for _ in lens]  # (first tile, end tile) of each piece
    pieces = [[] for _ in lens]
    overhead = reference.DECODE_PLAN_OVERHEAD
    total = sum(tiles) + overhead * len(lens)
    share = -(-total // min(num_parts, total))
    for begin_req, begin_tile, end_req, end_tile, begin_split, _, zero6, zero7 in sched.tolist():
        assert zero6 == 0 and zero7 == 0
        cost = 0
        for r in range(begin_req, end_req + 1):
            t0 = begin_tile if r == begin_req else 0
            t1 = end_tile if r == end_req else tiles[r]
            assert t1 > t0 or tiles[r] == 0, "a piece of a split request is never empty"
            pieces[r].append(begin_split if r == begin_req else 0)
            cost += t1 - t0 + (overhead if t0 == 0 else 0)
            covered[r].append((t0, t1))
        assert cost <= share + overhead, (cost, share)
    for r, spans in enumerate(covered):  # every tile exactly once: the pieces tile [0, tiles[r])
        spans.sort()
        assert spans and spans[0][0] == 0 and spans[-1][1] == tiles[r], (r, spans)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), (r, spans)
    split_reqs = [r for r in range(len(lens)) if int(info[r, 0]) > 1]
    assert sched[:, 5].tolist() == split_reqs + [-1] * (num_parts - len(split_reqs))
    slots = 0
    for r, p in enumerate(pieces):
        assert sorted(p) == list(range(len(p))) and int(info[r, 0]) == len(p)
        assert int(info[r, 1]) == (slots if len(p) > 1 else -1)
        slots += len(p) if len(p) > 1 else 0
    assert slots <= reference.decode_max_partials(num_parts, len(lens))


@pytest.mark.parametrize("kind", ["uniform", "skewed", "zeros", "mixed", "tiny", "huge"])
@pytest.mark.parametrize("b", [1, 3, 64, 256, 1000])
def test_plan_invariants_random(kind, b):
    g = torch.Generator().manual_seed(b * 7 + len(kind))
    if kind == "uniform":
        lens = torch.randint(0, 8192, (b,), generator=g).tolist()
    elif kind == "skewed":  # one long request among short ones (ThunderMLA's imbalanced batches)
        lens = torch.randint(1, 300, (b,), generator=g).tolist()
        lens[int(torch.randint(b, (1,), generator=g))] = 200_000
    elif kind == "zeros":
        lens = [0] * b
    elif kind == "mixed":  # zeros, negatives (treated as 0), tile edges
        choices = [0, -3, 1, 63, 64, 65, 4097]
        lens = [choices[int(i)] for i in torch.randint(len(choices), (b,), generator=g)]
    elif kind == "tiny":  # fewer cost units than parts: empty parts at the end
        lens = torch.randint(0, 3, (b,), generator=g).tolist()
    else:  # near int32: cost sums past int32
        lens = [2**31 - 1 - int(x) for x in torch.randint(0, 1000, (b,), generator=g)]
    for s_q, h_q, num_sms in ((1, 16, 132), (2, 128, 132), (1, 64, 7), (1, 16, 1)):
        _check_plan_invariants(lens, s_q, h_q, num_sms)


def test_plan_evens_out_varied_lengths():
    """Lengths ~N(4096, 2048) over 132 parts: every part's cost (its tiles plus the overhead of the
    requests it starts) is the even share, give or take one request's overhead each way."""
    g = torch.Generator().manual_seed(5)
    lens = (torch.randn(128, generator=g) * 2048 + 4096).clamp(min=1).int()
    sched, info = reference.decode_plan(lens, 1, 16, 132)
    tiles = [(int(n) + 63) // 64 for n in lens]
    overhead = reference.DECODE_PLAN_OVERHEAD
    costs = []
    for begin_req, begin_tile, end_req, end_tile, *_ in sched.tolist():
        cost = 0
        for r in range(begin_req, end_req + 1):
            t0 = begin_tile if r == begin_req else 0
            cost += (end_tile if r == end_req else tiles[r]) - t0 + (overhead if t0 == 0 else 0)
        costs.append(cost)
    total = sum(tiles) + overhead * len(tiles)
    assert sum(costs) == total and len(costs) == 132
    assert max(costs) <= -(-total // 132) + overhead and min(costs) >= total // 132 - overhead, costs


def test_plan_workspace():
    """get_decode_plan returns the split kernels' workspace, sized for the plan (CPU: the same size)."""
    lens = torch.tensor([5, 700, 0], dtype=torch.int32)
    for s_q, h_q, num_sms in ((1, 16, 132), (2, 128, 132), (16, 128, 8)):
        plan = mla_ext.get_decode_plan(lens, s_q, h_q, num_sms=num_sms)
        num_parts = reference.decode_num_parts(num_sms, s_q, h_q)
        assert plan.workspace.dtype == torch.float32 and plan.workspace.is_contiguous()
        assert plan.workspace.shape == (reference.decode_max_partials(num_parts, 3), s_q, h_q, 513)
        sched, info = plan  # unpacks as the pair it always was
        assert sched is plan.schedule and info is plan.split_info


def test_plan_balances_one_long_request():
    sched, info = reference.decode_plan(torch.tensor([65536], dtype=torch.int32), 1, 16, 132)
    sizes = [e - b for b, e in zip(sched[:, 1].tolist(), sched[:, 3].tolist()) if e > 0]
    assert len(sizes) > 100 and max(sizes) <= 2 * (1024 // 132 + 1)


def test_cpu_op_and_wrapper():
    inp = make_inputs([5, 77], 2, 3, 16, "fp8", device="cpu")
    plan = mla_ext.get_decode_plan(inp["seq_lens"], 2, 3, "fp8")
    assert plan.schedule.shape == (132, 8) and plan.split_info.shape == (2, 2)
    out, lse = run_op(inp, True, plan=plan)
    ref_out, ref_lse = run_reference(inp, True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    o = torch.empty(2, 2, 3, 512, dtype=torch.bfloat16)
    res = run_op(inp, True, out=o)
    assert res[0] is o and torch.equal(o, ref_out)


def test_opcheck_cpu():
    inp = make_inputs([5, 40], 1, 2, 16, "fp8_ds_mla", device="cpu")
    args = (inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], SOFTMAX_SCALE, "fp8_ds_mla", True, None)
    torch.library.opcheck(torch.ops.mla_ext.decode_mla.default, args)
    torch.library.opcheck(torch.ops.mla_ext.decode_plan.default, (inp["seq_lens"], 1, 2, "fp8_ds_mla", 16))
    out, lse = torch.empty(2, 1, 2, 512, dtype=torch.bfloat16), torch.empty(2, 2, 1)
    torch.library.opcheck(torch.ops.mla_ext.decode_mla_out.default, args + (None, None, False, out, lse))
    plan = mla_ext.get_decode_plan(inp["seq_lens"], 1, 2, "fp8_ds_mla", 16)
    sched, info, workspace = plan.schedule, plan.split_info, plan.workspace
    torch.library.opcheck(torch.ops.mla_ext.decode_mla.default, args + (sched, info, False, workspace))
    torch.library.opcheck(torch.ops.mla_ext.decode_mla_out.default, args + (sched, info, False, out, lse, workspace))
    torch.library.opcheck(torch.ops.mla_ext.decode_mla.planned, args[:5] + (sched, info, workspace))


def test_planned_overload_matches_default():
    """decode_mla.planned (what the wrapper calls with a plan in the usual case) is decode_mla,
    causal, with the cache format the cache's own: 16-bit 'auto', uint8 'fp8_ds_mla'."""
    for fmt in ("auto", "fp8_ds_mla"):
        inp = make_inputs([5, 40], 2, 3, 16, fmt, device="cpu")
        plan = mla_ext.get_decode_plan(inp["seq_lens"], 2, 3, fmt, 16)
        args = (inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], SOFTMAX_SCALE)
        out, lse = torch.ops.mla_ext.decode_mla.planned(*args, plan.schedule, plan.split_info, plan.workspace)
        ref_out, ref_lse = run_reference(inp, True)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    # An fp8 cache needs its scale: the overload refuses it, naming the format to pass.
    inp = make_inputs([5, 40], 1, 3, 16, "fp8", device="cpu")
    plan = mla_ext.get_decode_plan(inp["seq_lens"], 1, 3, "fp8", 16)
    with pytest.raises(mla_ext.MlaInputError, match=r"planned overload takes .* kv_cache_dtype='fp8' and its scale"):
        torch.ops.mla_ext.decode_mla.planned(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"],
                                             SOFTMAX_SCALE, plan.schedule, plan.split_info, plan.workspace)


def test_fake_under_compile():
    inp = make_inputs([5, 40], 2, 2, 16, "auto", device="cpu")

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, kv_cache, block_table, seq_lens):
        sched, info = torch.ops.mla_ext.decode_plan(seq_lens, 2, 2, "auto", 8)
        workspace = torch.empty(reference.decode_workspace_shape(sched.shape[0], info.shape[0], 2, 2))
        out, lse = torch.ops.mla_ext.decode_mla(q, kv_cache, block_table, seq_lens, SOFTMAX_SCALE, "auto", True,
                                                None, sched, info, False, workspace)
        # a second layer of the step reuses the plan and its workspace
        out2, _ = torch.ops.mla_ext.decode_mla(q, kv_cache, block_table, seq_lens, SOFTMAX_SCALE, "auto", True,
                                               None, sched, info, False, workspace)
        return out * 2, lse, out2

    out, lse, out2 = step(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"])
    ref_out, ref_lse = run_reference(inp, True)
    assert torch.equal(out, ref_out * 2) and torch.equal(lse, ref_lse) and torch.equal(out2, ref_out)


def _bad(inp, **changes):
    args = dict(inp)
    args.update(changes)
    return args


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_bad_input(case):
    change, match = DECODE_CASES[case]
    inp = decode_inputs("cpu")
    with pytest.raises(mla_ext.MlaInputError, match=match):
        run_op(_bad(inp, **change(inp)), True)


def test_bad_values_and_plan():
    # Values: checked mode raises; unchecked, the CPU op skips such positions like the kernel.
    inp = make_inputs([5, 40], 1, 4, 16, "auto", device="cpu")
    inp["seq_lens"][1] = 16 * inp["block_table"].shape[1] + 1
    with pytest.raises(IndexError, match="block_table has only"):
        run_op(inp, True, checked=True)
    out, lse = run_op(inp, True)  # (positions 40..47 are in the table but unwritten: NaN rows)
    ref_out, ref_lse = run_reference(inp, True)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0, equal_nan=True)
    inp = make_inputs([5, 40], 1, 4, 16, "auto", device="cpu")
    inp["block_table"][1, 0] = 10**6
    with pytest.raises(IndexError, match="outside the cache"):
        run_op(inp, True, checked=True)
    # Plans: another batch, another geometry, a hand-made empty schedule.
    inp = make_inputs([5, 40], 1, 4, 16, "auto", device="cpu")
    other = mla_ext.get_decode_plan(torch.tensor([3], dtype=torch.int32), 1, 4)
    with pytest.raises(mla_ext.MlaInputError, match=r"split_info must be int32 \[b=2"):
        run_op(inp, True, plan=other)
    for s_q, h_q, fmt in ((2, 4, "auto"), (1, 128, "auto"), (1, 4, "fp8_ds_mla")):
        wrong = mla_ext.get_decode_plan(inp["seq_lens"], s_q, h_q, fmt)
        with pytest.raises(mla_ext.MlaInputError, match="plan was made for"):
            run_op(inp, True, plan=wrong)
    right = mla_ext.get_decode_plan(inp["seq_lens"], 1, 4, "auto")
    empty = mla_ext.DecodePlan(right.schedule[:0], right.split_info)
    with pytest.raises(mla_ext.MlaInputError, match="schedule must be int32"):
        run_op(inp, True, plan=empty)
    sched, info = right  # unpacks like a pair
    assert sched is right.schedule and info is right.split_info
    with pytest.raises(mla_ext.MlaInputError, match=r"s_q must be in \[1, 16\]"):
        mla_ext.get_decode_plan(inp["seq_lens"], 0, 4)
    with pytest.raises(mla_ext.MlaInputError, match=r"seq_lens must be int32, got int64: convert once per step"):
        mla_ext.get_decode_plan(inp["seq_lens"].long(), 1, 4)
    with pytest.raises(mla_ext.MlaInputError, match=r"seq_lens must be 1-D \[b\] with 1 <= b <= 65535"):
        mla_ext.get_decode_plan(torch.zeros(65536, dtype=torch.int32), 1, 4)
    # A cache that contradicts kv_cache_dtype is refused also with a plan of that format.
    for fmt, cache_fmt, msg in (("auto", "fp8_ds_mla", "kv_cache_dtype='auto' needs a kv_cache of q's dtype"),
                                ("fp8_ds_mla", "auto", "kv_cache must be uint8 for kv_cache_dtype='fp8_ds_mla'")):
        other = make_inputs([5, 40], 1, 4, 16, cache_fmt, device="cpu")
        plan = mla_ext.get_decode_plan(other["seq_lens"], 1, 4, fmt)
        with pytest.raises(mla_ext.MlaInputError, match=msg):
            mla_ext.decode_mla(other["q"], other["kv_cache"], other["block_table"], other["seq_lens"], SOFTMAX_SCALE,
                               fmt, plan=plan)
    # A plan's workspace too small for this call (a plan for fewer heads, passed to the op).
    small = mla_ext.get_decode_plan(inp["seq_lens"], 1, 2, "auto")
    # its workspace's shape records the plan's geometry: the op refuses it for h_q 4 ...
    with pytest.raises(mla_ext.MlaInputError, match=r"plan was made for s_q=1, h_q=2 but this call has s_q=1, h_q=4"):
        torch.ops.mla_ext.decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], SOFTMAX_SCALE,
                                     "auto", True, None, small.schedule, small.split_info, False, small.workspace)
    # ... and a flat workspace too small for the call
    flat = small.workspace.flatten()
    with pytest.raises(mla_ext.MlaInputError, match="workspace must be a contiguous, 16-byte aligned float32 tensor"):
        torch.ops.mla_ext.decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], SOFTMAX_SCALE,
                                     "auto", True, None, small.schedule, small.split_info, False, flat)


def test_expanded_out_buffers_are_refused():
    inp = make_inputs([5, 40], 1, 4, 16, "auto", device="cpu")
    out = torch.empty(1, 1, 1, 512, dtype=torch.bfloat16).expand(2, 1, 4, 512)
    with pytest.raises(mla_ext.MlaInputError, match="out must not have zero strides"):
        run_op(inp, True, out=out)
    lse = torch.empty(1, 1, 1).expand(2, 4, 1)
    with pytest.raises(mla_ext.MlaInputError, match="lse must not have zero strides"):
        run_op(inp, True, lse=lse)


def _flash_mla_package(root, body: str) -> str:
    """A folder holding a ``flash_mla`` package whose __init__.py is ``body``."""
    (root / "flash_mla").mkdir(parents=True)
    (root / "flash_mla" / "__init__.py").write_text(body)
    return str(root)


def test_flashmla_peer_absent_is_reported(monkeypatch, tmp_path):
    """The benchmarks' FlashMLA peer (mla_ext/bench/flashmla_peer.py) is optional: a folder without
    flash_mla, a flash_mla that fails to import or one without the API gives a status line that
    says why, and the peer is not available for any op."""
    from mla_ext.bench import flashmla_peer

    monkeypatch.setattr(flashmla_peer, "_state", {})
    monkeypatch.setattr(sys, "path", list(sys.path))  # load() puts its folder first on sys.path
    cases = [  # (folder, what the status line must name)
        (str(tmp_path / "nowhere"), "nowhere"),
        (_flash_mla_package(tmp_path / "broken", "raise ImportError('built for sm_80 only')\n"), "built for sm_80 only"),
        (_flash_mla_package(tmp_path / "partial", "def get_mla_metadata():\n    return None, None\n"),
         "flash_mla_with_kvcache"),
    ]
    try:
        for folder, why in cases:
            sys.modules.pop("flash_mla", None)
            status = flashmla_peer.load(folder)
            assert status == flashmla_peer.status() and status.startswith("peer not available"), status
            assert why in status, status
            assert not flashmla_peer.available()
            for op in ("dense", "sparse"):
                assert not flashmla_peer.supports(op) and flashmla_peer.why_not(op) == status
                assert flashmla_peer.describe(op) == f"{flashmla_peer.NAME}: {status}"
    finally:
        sys.modules.pop("flash_mla", None)


def test_flashmla_peer_loaded_and_helpers(monkeypatch, tmp_path, capsys):
    """A flash_mla with the API loads (status names the peer); a failing peer call gives None and
    a printed line instead of an exception; the helpers that line FlashMLA up with mla_ext: heads
    padded to 64 / 128, +inf lse (nothing attended) read as -inf."""
    from mla_ext.bench import flashmla_peer

    monkeypatch.setattr(flashmla_peer, "_state", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    body = ("def get_mla_metadata(*args):\n    return None, None\n\n"
            "def flash_mla_with_kvcache(*args):\n    return None\n")
    try:
        sys.modules.pop("flash_mla", None)
        status = flashmla_peer.load(_flash_mla_package(tmp_path / "fake", body))
        assert status.startswith(flashmla_peer.NAME) and flashmla_peer.available(), status
    finally:
        sys.modules.pop("flash_mla", None)
    for op in ("dense", "sparse"):
        described = flashmla_peer.describe(op)
        if flashmla_peer.supports(op):
            assert described == flashmla_peer.NAME
        else:
            assert described.startswith(flashmla_peer.NAME + ": "), described

    def broken():
        raise RuntimeError("no kernel image for this GPU")

    assert flashmla_peer.attempt("case b1", broken) is None
    assert "case b1" in capsys.readouterr().out
    assert flashmla_peer.attempt("case b2", lambda: 42) == 42

    lse = torch.tensor([[0.5, math.inf], [-math.inf, 2.0]])
    mapped = flashmla_peer.lse_as_mla_ext(lse)
    assert torch.equal(mapped, torch.tensor([[0.5, -math.inf], [-math.inf, 2.0]]))
    assert [flashmla_peer.peer_heads(h) for h in (1, 16, 64, 65, 128)] == [64, 64, 64, 128, 128]
    q = torch.randn(2, 1, 16, 576)
    padded = flashmla_peer.pad_heads(q, 64)
    assert padded.shape == (2, 1, 64, 576) and torch.equal(padded[:, :, :16], q)
    assert bool((padded[:, :, 16:] == 0).all())
    assert flashmla_peer.pad_heads(padded, 64) is padded
