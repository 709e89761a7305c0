"""Dense paged decode (decode_mla): the input builder shared with the tests, a self-check, and
the benchmark against FlashMLA that ``bench/bench_decode.py`` runs.

Benchmark method (DESIGN.md §5): both libraries in the same process on the same inputs (q, a bf16
cache in 64-token pages, block table, lengths ~N(len, len/2) as FlashMLA's perf tests draw them);
mla_ext also on the same rows written into an fp8_ds_mla cache by ``concat_and_cache_mla``. The
mla_ext plan and FlashMLA's scheduler metadata are made once per case, outside the timed graph (an
engine plans once per step); GPU time per call by CUDA-graph replay of 20 calls. Each case is
checked once before it is timed: mla_ext's out against FlashMLA's (cosine similarity > 0.999).
"""

from __future__ import annotations

import dataclasses
import random

import torch

from .. import reference
from ..cache import concat_and_cache_mla
from ..decode import decode_mla, get_decode_plan
from ..formats import LATENT_DIM, cache_torch_dtype, canonical_format, empty_kv_cache, row_width
from . import flashmla_peer
from .harness import Roofline, Row, Timer, check_outputs, fmt_ratio, fmt_us, graph_time_us, markdown_table
from .harness import speedup_summary

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

# ---- benchmark against FlashMLA (bench/bench_decode.py) -------------------------------------

BLOCK_SIZE = 64  # page size of every case (FlashMLA's dense decode takes only 64)
BENCH_FORMATS = ("auto", "fp8_ds_mla")
MIN_COS = 0.999  # the check before timing: cosine similarity of out, mla_ext against FlashMLA


@dataclasses.dataclass(frozen=True)
class Case:
    """b requests of s_q queries with h_q heads; lengths drawn around ``mean_len`` (see
    ``draw_lens``) or fixed (``lens``). Causal when s_q > 1."""

    name: str
    b: int
    s_q: int
    h_q: int
    mean_len: int = 0
    lens: tuple[int, ...] = ()

    @property
    def causal(self) -> bool:
        return self.s_q > 1


def _cases() -> list[Case]:
    cases = [Case(f"b{b}_len{n}_h{h_q}_s{s_q}", b, s_q, h_q, mean_len=n)
             for b, n in ((128, 4096), (64, 8192)) for h_q in (16, 32, 64, 128) for s_q in (1, 2)]
    # ThunderMLA's imbalanced small batch, and one long request (the split-KV extremes).
    cases.append(Case("thundermla_b4_h16_s4", 4, 4, 16, lens=(4641, 45118, 1730, 1696)))
    cases.append(Case("single_64k_h16_s1", 1, 1, 16, lens=(65536,)))
    return cases


CASES = _cases()
QUICK = ("b128_len4096_h16_s1", "b64_len8192_h128_s2", "thundermla_b4_h16_s4", "single_64k_h16_s1")


def select_cases(quick: bool = False, only: str | None = None) -> list[Case]:
    return [c for c in CASES if (not quick or c.name in QUICK) and (only is None or only in c.name)]


def draw_lens(case: Case, seed: int = 0) -> list[int]:
    """The request lengths, drawn as FlashMLA's tests/test_flash_mla_dense_decoding.py draws its
    varlen perf cases: ``max(random.normalvariate(len, len / 2), s_q)`` per request, truncated to
    an int (Python's ``random``, seeded): ~N(len, len/2), at least s_q, no upper clip."""
    if case.lens:
        return list(case.lens)
    rng = random.Random(seed)
    return [int(max(rng.normalvariate(case.mean_len, case.mean_len / 2), case.s_q)) for _ in range(case.b)]


def bench_inputs(case: Case, device="cuda", seed: int = 0) -> dict:
    """What both libraries get: random q, a bf16 cache of random (finite) rows in 64-token pages,
    each request's pages at random places in the pool, the block table (entries past a request's
    pages are 0, never read) and seq_lens."""
    lens = draw_lens(case, seed)
    pages = [-(-n // BLOCK_SIZE) for n in lens]
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    block_table = torch.zeros(case.b, max(pages), dtype=torch.int32)
    start = 0
    for i, n in enumerate(pages):
        block_table[i, :n] = order[start:start + n]
        start += n
    g = torch.Generator(device=device).manual_seed(seed)
    kv_cache = torch.randn(sum(pages), BLOCK_SIZE, LATENT_DIM, generator=g, dtype=torch.bfloat16, device=device)
    q = torch.randn(case.b, case.s_q, case.h_q, LATENT_DIM, generator=g, dtype=torch.bfloat16, device=device)
    return dict(q=q, kv_cache=kv_cache, block_table=block_table.to(device),
                seq_lens=torch.tensor(lens, dtype=torch.int32, device=device))


def to_fp8_ds_mla(kv_cache: torch.Tensor) -> torch.Tensor:
    """The same rows in an fp8_ds_mla cache of the same pages, written by concat_and_cache_mla
    (slot i = row i of the bf16 cache)."""
    num_pages, page, _ = kv_cache.shape
    cache = empty_kv_cache(num_pages, page, "fp8_ds_mla", device=kv_cache.device)
    rows = kv_cache.view(-1, LATENT_DIM)
    slots = torch.arange(rows.shape[0], dtype=torch.int64, device=kv_cache.device)
    concat_and_cache_mla(rows[:, :512], rows[:, 512:], cache, slots, "fp8_ds_mla")
    return cache


def work(case: Case, fmt: str) -> tuple[float, float]:
    """(bytes, FLOPs) of a case: cache rows read + q + out; 2 * h_q * (576 + 512) per attended key
    and query (causal: query j of a request sees len - s_q + 1 + j keys)."""
    lens = draw_lens(case)
    row_bytes = row_width(fmt) * (1 if canonical_format(fmt) == "fp8_ds_mla" else 2)
    nbytes = sum(lens) * row_bytes + case.b * case.s_q * case.h_q * (576 + 512) * 2
    per_req = [n * case.s_q - (case.s_q * (case.s_q - 1) // 2 if case.causal else 0) for n in lens]
    return float(nbytes), 2.0 * case.h_q * (576 + 512) * sum(per_req)


def _expected(inp: dict, cache: torch.Tensor, fmt: str, case: Case, peer_out) -> tuple[tuple | None, str]:
    """What mla_ext's output is compared with: FlashMLA's (on the bf16 cache for auto; on the
    dequantised fp8_ds_mla rows, the exact values mla_ext reads, for fp8_ds_mla), or without the
    peer the fp32 reference."""
    if fmt == "auto" and peer_out is not None:
        return peer_out, "FlashMLA"
    if fmt != "auto" and flashmla_peer.supports("dense") and peer_out is not None:
        deq = reference.dequantize_cache(cache, fmt).to(torch.bfloat16)
        run = flashmla_peer.attempt(f"{case.name} check", lambda: flashmla_peer.dense(
            inp["q"], deq, inp["block_table"], inp["seq_lens"], SOFTMAX_SCALE, case.causal))
        got = run and flashmla_peer.attempt(f"{case.name} check", run)
        del deq
        if got is not None:
            return got, "FlashMLA"
    return reference.decode_mla(inp["q"], cache, inp["block_table"], inp["seq_lens"], SOFTMAX_SCALE, fmt,
                                case.causal), "reference"


def run_case(case: Case, use_peer: bool = True, force_portable: bool = False, calls: int = 20) -> list[dict]:
    """Rows of one case: format auto (bf16 cache) then fp8_ds_mla (same rows), each checked once
    then timed; FlashMLA (bf16 cache) checked against the auto row and timed once for both rows."""
    inp = bench_inputs(case)
    q, block_table, seq_lens, causal = inp["q"], inp["block_table"], inp["seq_lens"], case.causal
    peer_run = peer_out = peer_us = None
    if use_peer and flashmla_peer.supports("dense"):
        peer_run = flashmla_peer.attempt(case.name, lambda: flashmla_peer.dense(
            q, inp["kv_cache"], block_table, seq_lens, SOFTMAX_SCALE, causal))
        peer_out = peer_run and flashmla_peer.attempt(case.name, peer_run)
        if peer_out is not None:
            peer_out = (peer_out[0], flashmla_peer.lse_as_mla_ext(peer_out[1]))
    rows: list[dict] = []
    bf16_us = None
    for fmt in BENCH_FORMATS:
        cache = inp["kv_cache"] if fmt == "auto" else to_fp8_ds_mla(inp["kv_cache"])
        plan = get_decode_plan(seq_lens, case.s_q, case.h_q, fmt)

        def call(cache=cache, plan=plan, fmt=fmt):
            return decode_mla(q, cache, block_table, seq_lens, SOFTMAX_SCALE, fmt, causal, plan=plan,
                              force_portable=force_portable)

        out, lse = call()
        (ref_out, ref_lse), against = _expected(inp, cache, fmt, case, peer_out)
        cos, problem = check_outputs(out, lse, ref_out, ref_lse, MIN_COS)
        del out, lse, ref_out, ref_lse
        us = graph_time_us(call, f"decode.{case.name}.{fmt}", calls=calls)
        if fmt == "auto":
            bf16_us = us
            if peer_run is not None:
                peer_us = flashmla_peer.attempt(case.name, lambda: graph_time_us(
                    peer_run, f"flashmla.decode.{case.name}", calls=calls))
        row = {"case": case.name, "format": fmt, "mla_ext_us": round(us, 3),
               "peer_us": None if peer_us is None else round(peer_us, 3), "mla_ext_bf16_us": round(bf16_us, 3),
               "cos_sim": round(cos, 6), "checked_against": against}
        if problem:
            row["check_failed"] = problem
        rows.append(row)
        print(f"{case.name:24s} {fmt:10s} mla_ext {fmt_us(us):>8s} us  FlashMLA {fmt_us(peer_us):>8s} us  "
              f"cos {cos:.6f} vs {against}{'  CHECK FAILED: ' + problem if problem else ''}", flush=True)
        del cache, plan, call
    del inp, peer_run, peer_out
    torch.cuda.empty_cache()
    return rows


def bench_vs_peer(quick: bool = False, only: str | None = None, use_peer: bool = True,
                  force_portable: bool = False) -> list[dict]:
    rows: list[dict] = []
    for case in select_cases(quick, only):
        rows += run_case(case, use_peer, force_portable)
    return rows


def table(rows: list[dict]) -> str:
    """case, format, mla_ext us, FlashMLA us, speed-up (FlashMLA / mla_ext), and for fp8_ds_mla
    mla_ext's bf16 time over its fp8_ds_mla time. (!) marks a row whose check failed."""
    body = [[r["case"] + (" (!)" if "check_failed" in r else ""), r["format"], fmt_us(r["mla_ext_us"]),
             fmt_us(r["peer_us"]), fmt_ratio(r["peer_us"], r["mla_ext_us"]),
             fmt_ratio(r["mla_ext_bf16_us"], r["mla_ext_us"]) if r["format"] != "auto" else ""] for r in rows]
    return markdown_table(["case", "format", "mla_ext us", "FlashMLA us", "speed-up", "bf16 / fp8"], body, "llrrrr")


def summary(rows: list[dict]) -> str:
    """Geometric-mean speed-up over FlashMLA (which reads bf16) per format, and how many rows mla_ext wins."""
    return speedup_summary({fmt: [r for r in rows if r["format"] == fmt] for fmt in BENCH_FORMATS},
                           peer="FlashMLA (bf16)")


NOTES = (
    "speed-up = FlashMLA us / mla_ext us (> 1: mla_ext is faster); FlashMLA always reads the bf16 cache. "
    "bf16 / fp8 = mla_ext's time on the bf16 cache over its time on the same rows in fp8_ds_mla. "
    "GPU time per call: one CUDA graph of 20 calls on one set of inputs, replayed; median replay / 20. "
    "Same process and inputs for both; page size 64; lengths ~N(len, len/2), at least s_q (as FlashMLA's "
    "dense decoding perf tests draw them); causal for s_q > 1; softmax scale 1/sqrt(192); the mla_ext plan "
    "and FlashMLA's metadata made once per case outside the graph. Each row is checked once before timing: "
    "cosine similarity of out > 0.999 against FlashMLA (fp8_ds_mla rows: FlashMLA on the dequantised "
    "fp8_ds_mla rows; the fp32 reference where FlashMLA did not run); (!) marks a row that failed.")


def bench(timer: Timer | None, roofline: Roofline, quick: bool = False) -> list[Row]:
    """mla_ext alone (checked against the reference), as Rows with bytes and FLOPs, for ``python -m
    mla_ext``. ``timer`` is not used: GPU time per call by CUDA-graph replay, as in bench_vs_peer."""
    by_name = {c.name: c for c in CASES}
    out = []
    for r in bench_vs_peer(quick=quick, use_peer=False):
        nbytes, flops = work(by_name[r["case"]], r["format"])
        out.append(Row(f"{r['case']} {r['format']}", r["mla_ext_us"], bytes=nbytes, flops=flops, roofline=roofline,
                       extra={"cos_sim_vs_reference": r["cos_sim"]}))
    return out
