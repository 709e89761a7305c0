"""DeepSeek-V4 sparse decode (sparse_decode_mla_v4) against FlashMLA, as ``bench/bench_sparse_v4.py``
runs it.

Cases ``v4_h{h_q}_extra{extra_topk}_page{extra page}_b{b}``: FlashMLA's own V4 ("MODEL1")
performance configurations (its tests/test_flash_mla_sparse_decoding.py): s_q 2, topk 128 in a main
fp8_ds_mla cache of 256-token pages, extra_topk 512 or 1024 in an extra cache of 64- or 2-token
pages (with extra_topk_length in the page-2 ones), h_q 64 and 128, b in 2, 64, 74, 128, 148, 256.
Every request owns 16384 tokens of each cache on pages shuffled over the pool, written from random
bf16 rows by concat_and_cache_mla_v4; each query's indices are distinct positions uniform over its
request's tokens (extra_topk_length uniform in [extra_topk / 2, extra_topk]), as global slots. Same
q, caches and indices for both; each case is checked once (cosine similarity of out > 0.999 against
FlashMLA) and timed by CUDA-graph replay of 20 calls.
"""

from __future__ import annotations

import dataclasses

import torch

from .. import reference
from ..formats import empty_kv_cache_v4
from ..v4 import concat_and_cache_mla_v4, sparse_decode_mla_v4
from . import flashmla_peer
from .harness import check_outputs, fmt_ratio, fmt_tflops, fmt_us, graph_time_us, markdown_table, speedup_summary

S_Q, TOPK, MAIN_PAGE, TOKENS = 2, 128, 256, 16384
SOFTMAX_SCALE = 512**-0.5
MIN_COS = 0.999


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    b: int
    h_q: int
    extra_topk: int
    extra_page: int

    @property
    def extra_lengths(self) -> bool:
        return self.extra_page == 2


CASES = [Case(f"v4_h{h}_extra{x}_page{p}_b{b}", b, h, x, p)
         for h, x, p in ((64, 512, 64), (128, 1024, 64), (64, 1024, 2), (128, 1024, 2))
         for b in (2, 64, 74, 128, 148, 256)]


def select_cases(quick: bool = False, only: str | None = None) -> list[Case]:
    return [c for c in CASES if (not quick or c.b == 128) and (only is None or only in c.name)]


def _pool(b: int, page: int, g: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp8_ds_mla V4 cache of b * TOKENS random rows on shuffled pages, and each request's
    block table [b, TOKENS / page]."""
    pages = TOKENS // page
    cache = empty_kv_cache_v4(b * pages, page, "fp8_ds_mla", device=device)
    chunk = 1 << 20
    for s in range(0, b * TOKENS, chunk):
        n = min(chunk, b * TOKENS - s)
        rows = torch.randn(n, 512, generator=g, device=device).to(torch.bfloat16)
        concat_and_cache_mla_v4(rows, cache, torch.arange(s, s + n, device=device), "fp8_ds_mla")
    table = torch.randperm(b * pages, generator=g, device=device).view(b, pages)
    return cache, table


def _indices(table: torch.Tensor, page: int, topk: int, g: torch.Generator) -> torch.Tensor:
    b = table.shape[0]
    pos = torch.rand(b, S_Q, TOKENS, generator=g, device=table.device).topk(topk, dim=-1).indices  # distinct
    blocks = torch.gather(table.unsqueeze(1).expand(b, S_Q, -1), 2, pos // page)
    return (blocks * page + pos % page).to(torch.int32).contiguous()


def case_flops(case: Case, extra_topk_length: torch.Tensor | None) -> float:
    """2 * h_q * s_q * (topk + extra entries counted) * (512 + 512), summed over the requests."""
    extra = case.b * case.extra_topk if extra_topk_length is None else int(extra_topk_length.sum())
    return 2.0 * case.h_q * S_Q * (case.b * TOPK + extra) * 1024


def run_case(case: Case, use_peer: bool = True, seed: int = 0, calls: int = 20) -> dict:
    device = "cuda"
    g = torch.Generator(device=device).manual_seed(seed)
    main, main_table = _pool(case.b, MAIN_PAGE, g, device)
    extra, extra_table = _pool(case.b, case.extra_page, g, device)
    idx = _indices(main_table, MAIN_PAGE, TOPK, g)
    xidx = _indices(extra_table, case.extra_page, case.extra_topk, g)
    xlen = None
    if case.extra_lengths:
        xlen = torch.randint(case.extra_topk // 2, case.extra_topk + 1, (case.b,), generator=g, device=device,
                             dtype=torch.int32)
    q = torch.randn(case.b, S_Q, case.h_q, 512, generator=g, device=device).to(torch.bfloat16)

    def call():
        return sparse_decode_mla_v4(q, main, idx, SOFTMAX_SCALE, "fp8_ds_mla", extra_kv_cache=extra,
                                    extra_indices=xidx, extra_topk_length=xlen)

    out, lse = call()
    peer_run = expected = None
    against = "reference"
    if use_peer and flashmla_peer.supports("sparse"):
        peer_run = flashmla_peer.attempt(case.name, lambda: flashmla_peer.sparse_v4(
            q, main, idx, SOFTMAX_SCALE, extra, xidx, xlen))
        got = peer_run and flashmla_peer.attempt(case.name, peer_run)
        if got is not None:
            expected = (got[0], flashmla_peer.lse_as_mla_ext(got[1]))
            against = "FlashMLA"
    if expected is None:
        expected = reference.sparse_decode_mla_v4(q, main, idx, SOFTMAX_SCALE, "fp8_ds_mla", extra_kv_cache=extra,
                                                  extra_indices=xidx, extra_topk_length=xlen)
    cos, problem = check_outputs(out, lse, *expected, MIN_COS)
    del out, lse, expected
    us = graph_time_us(call, f"sparse_v4.{case.name}", calls=calls)
    peer_us = None
    if peer_run is not None:
        peer_us = flashmla_peer.attempt(case.name, lambda: graph_time_us(peer_run, f"flashmla.v4.{case.name}",
                                                                         calls=calls))
    flops = case_flops(case, xlen)
    row = {"case": case.name, "format": "fp8_ds_mla_v4", "mla_ext_us": round(us, 3),
           "peer_us": None if peer_us is None else round(peer_us, 3), "flops": flops, "cos_sim": round(cos, 6),
           "checked_against": against}
    if problem:
        row["check_failed"] = problem
    print(f"{case.name:28s} mla_ext {fmt_us(us):>8s} us  FlashMLA {fmt_us(peer_us):>8s} us  cos {cos:.6f} vs "
          f"{against}{'  CHECK FAILED: ' + problem if problem else ''}", flush=True)
    del q, main, extra, idx, xidx, peer_run, call
    torch.cuda.empty_cache()
    return row


def bench_vs_peer(quick: bool = False, only: str | None = None, use_peer: bool = True) -> list[dict]:
    return [run_case(c, use_peer, seed=CASES.index(c)) for c in select_cases(quick, only)]


def table(rows: list[dict]) -> str:
    body = [[r["case"] + (" (!)" if "check_failed" in r else ""), fmt_us(r["mla_ext_us"]),
             fmt_tflops(r["flops"], r["mla_ext_us"]), fmt_us(r["peer_us"]), fmt_tflops(r["flops"], r["peer_us"]),
             fmt_ratio(r["peer_us"], r["mla_ext_us"])] for r in rows]
    return markdown_table(["case", "mla_ext us", "mla_ext TFLOPS", "FlashMLA us", "FlashMLA TFLOPS", "speed-up"], body)


def summary(rows: list[dict]) -> str:
    return speedup_summary({"fp8_ds_mla_v4": rows})


NOTES = (
    "DeepSeek-V4 fp8_ds_mla caches (584-byte tokens): main cache of 256-token pages, extra cache of 64- or "
    "2-token pages; every request owns 16384 tokens of each, on shuffled pages. s_q 2, topk 128 (main), "
    "extra_topk 512 or 1024 (extra_topk_length uniform in [extra_topk / 2, extra_topk] in the page-2 cases); "
    "indices distinct and uniform over each request's tokens. Same q, caches and indices for both. On sm90 "
    "mla_ext runs its fused kernel (the rows of both caches read once and dequantised in shared memory; the "
    "gather and the V3 sparse decode on the portable path). "
    "speed-up = FlashMLA us / mla_ext us; FLOPs = 2 * h_q * s_q * (topk + extra entries) * (512 + 512). GPU time "
    "per call: one CUDA graph of 20 calls, replayed; median replay / 20. Each row is checked once before "
    "timing: cosine similarity of out > 0.999 against FlashMLA (the fp32 reference where FlashMLA did not "
    "run); (!) marks a row that failed.")
