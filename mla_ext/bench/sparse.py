"""Sparse top-k decode (sparse_decode_mla): a self-check, and the benchmark against FlashMLA that
``bench/bench_sparse.py`` runs.

Benchmark method (DESIGN.md §5): DeepSeek V3.2 decode shapes as in FlashMLA's
tests/test_flash_mla_sparse_decoding.py. One pool of 128 requests of 16K-32K tokens each (length
uniform), 64-token pages at random places, written into an fp8_ds_mla cache by
``concat_and_cache_mla``; a case with b requests uses the first b. Each query's top-k indices are
distinct positions drawn uniformly over its request's tokens, given as global slots ``block *
block_size + offset`` through the request's block table. mla_ext and FlashMLA get the same cache,
indices and q (for FlashMLA zero-padded to 64 heads where h_q < 64, as an engine pads for it); each
case is checked once (cosine similarity of out > 0.999 against FlashMLA) and then timed by CUDA-graph
replay of 20 calls. FLOPs = 2 * h_q * s_q * topk_valid * (576 + 512) per request.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from .. import reference
from ..cache import concat_and_cache_mla
from ..formats import LATENT_DIM, empty_kv_cache
from ..sparse import sparse_decode_mla
from . import flashmla_peer
from .harness import Roofline, Row, Timer, check_outputs, fmt_ratio, fmt_tflops, fmt_us, graph_time_us, markdown_table
from .harness import speedup_summary

NAME = "sparse_decode_mla"
FORMATS = ("fp8_ds_mla", "auto")  # of the self-check; the benchmark runs fp8_ds_mla (FlashMLA's format)
SOFTMAX_SCALE = 192**-0.5
BLOCK_SIZE = 64
POOL_REQUESTS = 128
MIN_LEN, MAX_LEN = 16384, 32768
MIN_COS = 0.999


def self_check(device: str) -> str:
    """Both formats, a small odd case (h_q 20, topk 300, block size 61, -1 and out-of-range
    entries, NaN in unused slots) against the reference."""
    worst = {}
    for fmt in FORMATS:
        g = torch.Generator(device="cpu").manual_seed(1)
        num_blocks, bs = 20, 61
        n = num_blocks * bs
        kv = torch.randn(n, 576, generator=g).to(torch.bfloat16).to(device)
        rows = reference.quantize_cache_rows(kv[:, :512], kv[:, 512:], fmt)
        cache = rows.view(num_blocks, bs, -1).clone()
        q = torch.randn(2, 2, 20, 576, generator=g).to(torch.bfloat16).to(device)
        idx = torch.randint(0, n // 2, (2, 2, 300), generator=g, dtype=torch.int32).to(device)
        idx[:, :, ::7] = -1
        idx[:, :, 3::11] = n + 5
        flat = cache.view(n, -1)
        flat[n // 2:] = float("nan") if fmt == "auto" else 0xFF  # never indexed
        out, lse = sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt)
        ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt)
        if not torch.isfinite(out).all():
            raise AssertionError(f"{NAME} {fmt}: non-finite output")
        rel = ((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
        lse_err = (lse - ref_lse).abs().max().item()
        if rel > 1e-2 or lse_err > 5e-3:
            raise AssertionError(f"{NAME} {fmt}: rel. error {rel:.3g}, lse error {lse_err:.3g}")
        worst[fmt] = rel
    return "vs reference rel. error " + ", ".join(f"{f} {e:.1e}" for f, e in worst.items())


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    b: int
    h_q: int
    s_q: int
    topk: int


CASES = [Case(f"b{b}_h{h_q}_s{s_q}_topk{topk}", b, h_q, s_q, topk) for b, h_q, s_q, topk in (
    (2, 128, 2, 2048), (64, 128, 2, 2048), (74, 128, 2, 2048), (128, 128, 2, 2048),  # V3.2, FlashMLA's batch sizes
    (64, 64, 2, 2048), (128, 64, 2, 2048),  # TP2
    (32, 128, 1, 512),
    (128, 16, 1, 2048), (128, 32, 1, 2048),  # TP8 / TP4: FlashMLA pads q to 64 heads
)]
QUICK = ("b128_h128_s2_topk2048", "b64_h64_s2_topk2048", "b128_h16_s1_topk2048")


def select_cases(quick: bool = False, only: str | None = None) -> list[Case]:
    return [c for c in CASES if (not quick or c.name in QUICK) and (only is None or only in c.name)]


def make_pool(num_requests: int = POOL_REQUESTS, device="cuda", seed: int = 0, chunk: int = 1 << 20) -> dict:
    """num_requests requests of MIN_LEN..MAX_LEN tokens (uniform), their 64-token pages shuffled
    over the pool, every row random bf16 written into an fp8_ds_mla cache by concat_and_cache_mla
    (in chunks of ``chunk`` tokens)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(MIN_LEN, MAX_LEN + 1, (num_requests,), generator=g)
    pages = (lens + BLOCK_SIZE - 1) // BLOCK_SIZE
    num_pages = int(pages.sum())
    order = torch.randperm(num_pages, generator=g).to(torch.int32)
    block_table = torch.zeros(num_requests, int(pages.max()), dtype=torch.int32)
    start = 0
    for i, n in enumerate(pages.tolist()):
        block_table[i, :n] = order[start:start + n]
        start += n
    cache = empty_kv_cache(num_pages, BLOCK_SIZE, "fp8_ds_mla", device=device)
    gd = torch.Generator(device=device).manual_seed(seed)
    num_slots = num_pages * BLOCK_SIZE
    for s in range(0, num_slots, chunk):
        n = min(chunk, num_slots - s)
        kv = torch.randn(n, LATENT_DIM, generator=gd, dtype=torch.bfloat16, device=device)
        slots = torch.arange(s, s + n, dtype=torch.int64, device=device)
        concat_and_cache_mla(kv[:, :512], kv[:, 512:], cache, slots, "fp8_ds_mla")
    return dict(cache=cache, block_table=block_table.to(device), lens=lens.to(device))


def make_indices(pool: dict, b: int, s_q: int, topk: int, seed: int = 0) -> torch.Tensor:
    """int32 [b, s_q, topk]: per query, topk distinct positions uniform over its request's tokens
    (the first b requests of the pool), as global slots through the request's block table."""
    device = pool["cache"].device
    g = torch.Generator(device=device).manual_seed(seed)
    lens = pool["lens"][:b]
    r = torch.rand(b, s_q, MAX_LEN, generator=g, device=device)
    r.masked_fill_(torch.arange(MAX_LEN, device=device).view(1, 1, -1) >= lens.view(-1, 1, 1), -1.0)
    pos = r.topk(topk, dim=-1).indices  # distinct, inside the request as long as topk <= MIN_LEN
    del r
    table = pool["block_table"][:b].long().unsqueeze(1).expand(b, s_q, -1)
    page = torch.gather(table, 2, pos // BLOCK_SIZE)
    return (page * BLOCK_SIZE + pos % BLOCK_SIZE).to(torch.int32).contiguous()


def case_flops(case: Case, indices: torch.Tensor) -> float:
    """2 * h_q * s_q * topk_valid * (576 + 512) per request, summed: every valid index of every query."""
    return 2.0 * case.h_q * (576 + 512) * int((indices >= 0).sum())


def run_case(pool: dict, case: Case, use_peer: bool = True, seed: int = 0, calls: int = 20) -> dict:
    """One case: checked once, then mla_ext and FlashMLA timed on the same q, cache and indices."""
    device = pool["cache"].device
    g = torch.Generator(device=device).manual_seed(1000 + seed)
    q = torch.randn(case.b, case.s_q, case.h_q, LATENT_DIM, generator=g, dtype=torch.bfloat16, device=device)
    indices = make_indices(pool, case.b, case.s_q, case.topk, seed)
    cache = pool["cache"]

    def call():
        return sparse_decode_mla(q, cache, indices, SOFTMAX_SCALE, "fp8_ds_mla")

    out, lse = call()
    h_peer = flashmla_peer.peer_heads(case.h_q)
    peer_run = expected = None
    against = "reference"
    if use_peer and flashmla_peer.supports("sparse"):
        q_peer = flashmla_peer.pad_heads(q, h_peer)
        peer_run = flashmla_peer.attempt(case.name, lambda: flashmla_peer.sparse(q_peer, cache, indices, SOFTMAX_SCALE))
        got = peer_run and flashmla_peer.attempt(case.name, peer_run)
        if got is not None:
            expected = (got[0][:, :, :case.h_q], flashmla_peer.lse_as_mla_ext(got[1][:, :case.h_q]))
            against = "FlashMLA"
    if expected is None:
        expected = reference.sparse_decode_mla(q, cache, indices, SOFTMAX_SCALE, "fp8_ds_mla")
    cos, problem = check_outputs(out, lse, *expected, MIN_COS)
    del out, lse, expected
    us = graph_time_us(call, f"sparse.{case.name}", calls=calls)
    peer_us = None
    if peer_run is not None:
        peer_us = flashmla_peer.attempt(case.name, lambda: graph_time_us(peer_run, f"flashmla.sparse.{case.name}",
                                                                         calls=calls))
    flops = case_flops(case, indices)
    row = {"case": case.name, "format": "fp8_ds_mla", "mla_ext_us": round(us, 3),
           "peer_us": None if peer_us is None else round(peer_us, 3), "peer_h_q": h_peer, "flops": flops,
           "cos_sim": round(cos, 6), "checked_against": against}
    if problem:
        row["check_failed"] = problem
    padded = f" (q padded to {h_peer} heads)" if h_peer != case.h_q and peer_us is not None else ""
    print(f"{case.name:24s} mla_ext {fmt_us(us):>8s} us {flops / us / 1e6:6.0f} TFLOPS  FlashMLA{padded} "
          f"{fmt_us(peer_us):>8s} us  cos {cos:.6f} vs {against}{'  CHECK FAILED: ' + problem if problem else ''}",
          flush=True)
    del q, indices, peer_run, call
    torch.cuda.empty_cache()
    return row


def bench_vs_peer(quick: bool = False, only: str | None = None, use_peer: bool = True) -> list[dict]:
    cases = select_cases(quick, only)
    if not cases:
        return []
    pool = make_pool()  # always the full pool, so a case gets the same inputs however it was selected
    rows = [run_case(pool, case, use_peer, seed=CASES.index(case)) for case in cases]
    del pool
    torch.cuda.empty_cache()
    return rows


def table(rows: list[dict]) -> str:
    """case, mla_ext us and TFLOPS, FlashMLA us and TFLOPS (the same FLOPs: the h_q heads' work, also
    where FlashMLA ran padded heads), speed-up (FlashMLA / mla_ext). (!) marks a failed check."""
    h_q = {r["case"]: int(re.search(r"_h(\d+)_", r["case"]).group(1)) for r in rows}
    body = [[r["case"] + (" (!)" if "check_failed" in r else ""), fmt_us(r["mla_ext_us"]),
             fmt_tflops(r["flops"], r["mla_ext_us"]),
             fmt_us(r["peer_us"]) + (f" (h {r['peer_h_q']})" if r["peer_us"] is not None
                                     and r["peer_h_q"] != h_q.get(r["case"]) else ""),
             fmt_tflops(r["flops"], r["peer_us"]), fmt_ratio(r["peer_us"], r["mla_ext_us"])] for r in rows]
    return markdown_table(["case", "mla_ext us", "mla_ext TFLOPS", "FlashMLA us", "FlashMLA TFLOPS", "speed-up"], body)


def summary(rows: list[dict]) -> str:
    return speedup_summary({"fp8_ds_mla": rows})


NOTES = (
    "fp8_ds_mla cache, page size 64; one pool of 128 requests of 16K-32K tokens (uniform), a case with b "
    "requests uses the first b; top-k indices distinct and uniform over each request's tokens, as global "
    "slots. Same q, cache and indices for both; FlashMLA runs 64 or 128 heads, so for h_q 16 and 32 its q "
    "is zero-padded to 64 heads (\"(h 64)\"; TFLOPS count the h_q heads' work for both). speed-up = "
    "FlashMLA us / mla_ext us. TFLOPS: FLOPs = 2 * h_q * s_q * topk_valid * (576 + 512) per request. GPU "
    "time per call: one CUDA graph of 20 calls on one set of inputs, replayed; median replay / 20. Each row "
    "is checked once before timing: cosine similarity of out > 0.999 against FlashMLA (the fp32 reference "
    "where FlashMLA did not run); (!) marks a row that failed.")


def bench(timer: Timer | None, roofline: Roofline, quick: bool = False) -> list[Row]:
    """mla_ext alone (checked against the reference), as Rows with bytes and FLOPs, for ``python -m
    mla_ext``. ``timer`` is not used: GPU time per call by CUDA-graph replay, as in bench_vs_peer."""
    by_name = {c.name: c for c in CASES}
    out = []
    for r in bench_vs_peer(quick=quick, use_peer=False):
        c = by_name[r["case"]]
        nbytes = r["flops"] / (2 * c.h_q * (576 + 512)) * 656 + c.b * c.s_q * c.h_q * (576 + 512) * 2
        out.append(Row(f"{r['case']} fp8_ds_mla", r["mla_ext_us"], bytes=nbytes, flops=r["flops"], roofline=roofline,
                       extra={"cos_sim_vs_reference": r["cos_sim"]}))
    return out
