"""Dense paged decode (decode_mla): input builder shared with the tests, self-check, benchmark."""

from __future__ import annotations

import torch

from .. import reference
from ..decode import decode_mla, get_decode_plan
from ..formats import cache_torch_dtype, canonical_format, row_width
from . import flashmla_peer
from .harness import Roofline, Row, Timer

NAME = "decode_mla"
FORMATS = ("auto", "fp8", "fp8_ds_mla")
SOFTMAX_SCALE = 192**-0.5  # DeepSeek: 1/sqrt(qk_nope + qk_rope) of the un-absorbed head

def make_inputs(seq_lens, s_q: int, h_q: int, block_size: int = 64, fmt: str = "auto", dtype=torch.bfloat16,
                device="cuda", *, arbitrary_scales: bool = False, shuffle: bool = True, extra_blocks: int = 2,
                page_pad: int = 0, row_pad: int = 0) -> dict:
    """A random paged cache holding ``seq_lens[i]`` tokens per request, pages in random order,
    every unused slot NaN (bytes 0xff for the fp8 formats: NaN data and NaN scales), unused
    block-table entries pointing far outside the cache, and random queries.

    ``arbitrary_scales``: fp8_ds_mla tile scales replaced by random non-power-of-two values.
    ``page_pad``: extra (NaN) rows per page, so the page stride exceeds block_size * row.
    ``row_pad``: extra (NaN) elements per row, so the row stride exceeds the row.
    """
    fmt_c = canonical_format(fmt)
    lens = [int(n) for n in seq_lens]
    b = len(lens)
    pages = [max(1, -(-n // block_size)) for n in lens]
    max_blocks = max(pages) + 1
    num_blocks = sum(pages) + extra_blocks
    order = torch.randperm(num_blocks) if shuffle else torch.arange(num_blocks)
    block_table = torch.full((b, max_blocks), 1 << 30, dtype=torch.int32)
    starts = [0]
    for n in pages:
        starts.append(starts[-1] + n)
    for i in range(b):
        block_table[i, : pages[i]] = order[starts[i] : starts[i + 1]].to(torch.int32)
    block_table = block_table.to(device)

    full = torch.empty(num_blocks, block_size + page_pad, row_width(fmt_c) + row_pad, dtype=cache_torch_dtype(fmt_c, dtype),
                       device=device)
    if fmt_c == "auto":
        full.fill_(float("nan"))
    else:
        full.view(torch.uint8).fill_(0xFF)  # e4m3 NaN bytes, NaN fp32 scales, NaN bf16 k_pe
    cache = full[:, :block_size, : row_width(fmt_c)]

    lens_t = torch.tensor(lens, device=device, dtype=torch.long)
    req = torch.repeat_interleave(torch.arange(b, device=device), lens_t)
    pos = torch.arange(int(lens_t.sum()), device=device) - torch.repeat_interleave(torch.cumsum(lens_t, 0) - lens_t, lens_t)
    page = block_table.long()[req, pos // block_size]
    scale = torch.tensor([0.0173], device=device) if fmt_c == "fp8" else None
    kv_c = torch.randn(req.numel(), 512, dtype=dtype, device=device)
    k_pe = torch.randn(req.numel(), 64, dtype=dtype, device=device)
    rows = reference.quantize_cache_rows(kv_c, k_pe, fmt_c, scale)
    if fmt_c == "fp8_ds_mla" and arbitrary_scales:
        tile_scales = torch.rand(req.numel(), 4, device=device) * 0.02 + 0.003  # any finite fp32
        rows[:, 512:528] = tile_scales.view(torch.uint8)
    target = cache if fmt_c == "auto" else cache.view(torch.uint8)
    target[page, pos % block_size] = rows.view(target.dtype)

    q = torch.randn(b, s_q, h_q, 576, dtype=dtype, device=device)
    return dict(q=q, kv_cache=cache, block_table=block_table, seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
                softmax_scale=SOFTMAX_SCALE, kv_cache_dtype=fmt, scale=scale)

def run_reference(inp: dict, causal: bool):
    return reference.decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], inp["softmax_scale"],
                                inp["kv_cache_dtype"], causal, inp["scale"])

def run_op(inp: dict, causal: bool, **kw):
    return decode_mla(inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], inp["softmax_scale"],
                      inp["kv_cache_dtype"], causal, inp["scale"], **kw)

def compare(out, lse, ref_out, ref_lse) -> tuple[float, float]:
    """(cosine difference of out, max abs error of the finite lse); raises on NaN/inf mismatch."""
    if not torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) or bool(torch.isnan(out).any()):
        raise AssertionError(f"{NAME}: inf/NaN in different places than the reference")
    o, r = out.double().flatten(), ref_out.double().flatten()
    denom = (o * o).sum() + (r * r).sum()
    cos = (1 - 2 * (o * r).sum() / denom).item() if denom > 0 else 0.0
    fin = torch.isfinite(ref_lse)
    lse_err = (lse[fin] - ref_lse[fin]).abs().max().item() if bool(fin.any()) else 0.0
    return cos, lse_err

def self_check(device: str) -> str:
    """Each format on a small batch (lengths 0, 1, 65, 300, block size 16, causal, s_q 2, h_q 16)
    against the reference."""
    parts = []
    for fmt in FORMATS:
        inp = make_inputs([0, 1, 65, 300], 2, 16, 16, fmt, device=device)
        out, lse = run_op(inp, True)
        cos, lse_err = compare(out, lse, *run_reference(inp, True))
        if cos > 1e-5 or lse_err > 2e-3:
            raise AssertionError(f"{NAME} {fmt}: cosine diff {cos:.2g}, lse error {lse_err:.2g}")
        parts.append(f"{fmt} cos {cos:.0e}")
    return "matches the reference: " + ", ".join(parts)

# (label, b, s_q, h_q, seq_len or (lo, hi) for varlen, block_size, formats)
CASES = [
    ("memory-bound", 128, 1, 16, 4096, 64, ("auto", "fp8", "fp8_ds_mla")),
    ("memory-bound bs16", 128, 1, 16, 4096, 16, ("auto", "fp8_ds_mla")),
    ("memory-bound bs128", 128, 1, 16, 4096, 128, ("auto", "fp8_ds_mla")),
    ("memory-bound", 32, 1, 16, 16384, 64, ("auto", "fp8_ds_mla")),
    ("compute-bound", 128, 1, 128, 4096, 64, ("auto", "fp8_ds_mla")),
    ("compute-bound MTP", 128, 2, 128, (4096, 12288), 64, ("auto",)),
    ("small batch", 4, 1, 128, 32768, 64, ("auto",)),
    ("single long", 1, 1, 16, 65536, 64, ("auto", "fp8_ds_mla")),
    ("compute-bound bs16", 128, 1, 128, 4096, 16, ("auto",)),  # tile pairs with four pages per tile
]
QUICK = {0, 3, 4, 7}

def graphed(fn):
    """``fn`` captured in a CUDA graph (as engines run decode): returns a replay function, so the
    timing is the GPU time of the kernels, not the Python wrapper's host time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _flashmla_us(timer: Timer, inp: dict, plan, name: str) -> float | None:
    """FlashMLA's dense decode time on the same bf16 case, graphed like mla_ext's, or None when the
    peer is absent, fails or disagrees with mla_ext (then printed). FlashMLA reads the last page's
    unused rows as they are (mla_ext's inputs hold NaN there), so this zeroes NaN in the cache in
    place: call it only after mla_ext's timing of the case."""
    if not flashmla_peer.supports("dense"):
        return None
    torch.nan_to_num_(inp["kv_cache"], nan=0.0)
    args = (inp["q"], inp["kv_cache"], inp["block_table"], inp["seq_lens"], inp["softmax_scale"], True)
    return flashmla_peer.time_checked(timer, name, lambda: flashmla_peer.dense_decode(*args), run_op(inp, True, plan=plan),
                                      graph=graphed)


def bench(timer: Timer, roofline: Roofline, quick: bool = False, only: str | None = None) -> list[Row]:
    """Each case: the plan computed once (as an engine does per step), then one decode call
    (split kernel + combine) captured in a CUDA graph and its replay timed. The plan is timed
    once as its own row."""
    rows = []
    gen = torch.Generator().manual_seed(0)
    for idx, (label, b, s_q, h_q, seq, bs, fmts) in enumerate(CASES):
        if quick and idx not in QUICK:
            continue
        if isinstance(seq, tuple):
            lens = torch.randint(seq[0], seq[1] + 1, (b,), generator=gen).tolist()
        else:
            lens = [seq] * b
        for fmt in fmts:
            name = f"{fmt} {label} b={b} s_q={s_q} h_q={h_q} len={'~' if isinstance(seq, tuple) else ''}{sum(lens) // b} bs={bs}"
            if only is not None and only not in name:
                continue
            inp = make_inputs(lens, s_q, h_q, bs, fmt)
            plan = get_decode_plan(inp["seq_lens"], s_q, h_q, fmt)
            replay = graphed(lambda: run_op(inp, True, plan=plan))
            us = timer.time_us(replay, f"{NAME}.{fmt}.b{b}.s{s_q}.h{h_q}.bs{bs}")
            del replay
            keys = sum(lens)
            nbytes = keys * row_width(fmt) * inp["kv_cache"].element_size() + inp["q"].numel() * 2 * (1 + 512 / 576)
            flops = 2 * h_q * s_q * keys * (576 + 512)
            # (after mla_ext's timing: the peer zeroes the cache's NaN rows)
            peer_us = _flashmla_us(timer, inp, plan, name) if fmt == "auto" and bs == 64 else None
            extra = {} if peer_us is None else {"flashmla_us_over_mla_ext": round(peer_us / us, 3)}
            rows.append(Row(name, us, bytes=nbytes, flops=flops, roofline=roofline, extra=extra))
            if peer_us is not None:
                rows.append(Row(f"FlashMLA peer: {name}", peer_us, bytes=nbytes, flops=flops, roofline=roofline,
                                extra={"peer": flashmla_peer.NAME}))
        if idx == 0 and only is None:
            plan_us = timer.time_us(graphed(lambda: get_decode_plan(inp["seq_lens"], s_q, h_q, fmt)), f"{NAME}.plan.b{b}")
            rows.append(Row(f"plan only b={b}", plan_us))
    return rows

def bandwidth_summary(rows: list[Row]) -> str:
    """The issue's bar: memory-bound fraction of copy bandwidth, single-request fraction, and the
    fp8_ds_mla speed-up over bf16 on the memory-bound cases; then mla_ext against the FlashMLA peer
    where it ran (or why it did not)."""
    by = {r.case: r for r in rows}
    ours = [r for r in rows if "peer" not in r.extra]
    lines = []
    for r in ours:
        if "memory-bound" in r.case or "single long" in r.case:
            lines.append(f"{r.case}: {r.roofline_frac:.0%} of copy bandwidth")
    for r in ours:
        if r.case.startswith("fp8_ds_mla") and "memory-bound" in r.case:
            twin = by.get("auto" + r.case[len("fp8_ds_mla"):])
            if twin is not None:
                lines.append(f"fp8_ds_mla vs bf16, {r.case[len('fp8_ds_mla '):]}: {twin.us / r.us:.2f}x faster")
    for r in ours:
        if "flashmla_us_over_mla_ext" in r.extra:
            lines.append(f"mla_ext vs FlashMLA (same run), {r.case}: {r.extra['flashmla_us_over_mla_ext']:.2f}x as fast")
    if not any("flashmla_us_over_mla_ext" in r.extra for r in ours):
        lines.append(flashmla_peer.status() if not flashmla_peer.available() else "FlashMLA peer: no comparable case timed")
    return "\n".join(lines)

