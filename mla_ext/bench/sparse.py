"""Sparse top-k decode (sparse_decode_mla): self-check and benchmark.

Cases (DESIGN.md §5, issue 5): DeepSeek V3.2 decode, topk 2048 over a pool of 32K tokens per
request (pages of 64 in random order); b128 s_q2 h_q128 (MTP), b64 s_q1 h_q64, b128 s_q1 h_q16
(TP8) and b128 s_q1 h_q64 on the same indices as the h_q 16 case (the "no padding to 64 heads"
bar: h_q 16 must take at most half the time). fp8_ds_mla and bf16 caches.

FLOPs = 2 * b * s_q * h_q * topk * (576 + 512); bytes = gathered rows (once per query token) + q +
out. FlashMLA runs as a peer on the fp8_ds_mla cases when its library is present
(flashmla_peer.py): same cache, indices and q (padded with zero heads to 64 where h_q < 64, as an
engine pads for it), its output checked against mla_ext's before it is timed.
"""

from __future__ import annotations

import torch

from .. import reference
from ..formats import DS_MLA_ROPE_OFFSET, DS_MLA_ROW_BYTES, DS_MLA_SCALE_OFFSET, LATENT_DIM
from ..sparse import sparse_decode_mla, sparse_indices_to_slots
from . import flashmla_peer
from .harness import Roofline, Row, Timer

NAME = "sparse_decode_mla"
FORMATS = ("fp8_ds_mla", "auto")
SOFTMAX_SCALE = 192**-0.5
POOL_TOKENS = 32768  # per request
BLOCK_SIZE = 64
TOPK = 2048


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


def _pool(num_requests: int, fmt: str):
    """A cache of num_requests * 32K tokens of random (finite) rows, pages shuffled, and the
    block table that maps each request to its pages."""
    pages = num_requests * POOL_TOKENS // BLOCK_SIZE
    if fmt == "auto":
        cache = torch.randn(pages, BLOCK_SIZE, LATENT_DIM, dtype=torch.bfloat16, device="cuda")
    else:
        cache = torch.randint(0, 0x7E, (pages, BLOCK_SIZE, DS_MLA_ROW_BYTES), dtype=torch.uint8, device="cuda")
        cache[..., DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET].view(torch.float32).fill_(0.0123)
        cache[..., DS_MLA_ROPE_OFFSET:].view(torch.bfloat16).normal_()
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(num_requests, -1)
    return cache, table


def _indices(b: int, s_q: int, table: torch.Tensor) -> torch.Tensor:
    """topk distinct positions per query token out of its request's 32K, as global slots."""
    local = torch.rand(b, s_q, POOL_TOKENS, device="cuda").argsort(dim=-1)[..., :TOPK].to(torch.int32)
    return sparse_indices_to_slots(local, table[:b], BLOCK_SIZE)


def _flashmla_us(timer: Timer, ours, q, cache, idx, what: str) -> tuple[float, int] | None:
    """FlashMLA's time on the same case, timed like mla_ext's call (eagerly, same timer), and the head
    count it ran with (64 or 128: q zero-padded as an engine pads it); None when the peer is absent,
    fails or disagrees with mla_ext (then printed)."""
    if not flashmla_peer.supports("sparse"):
        return None
    b, s_q, h_q, _ = q.shape
    h_pad = 64 if h_q <= 64 else 128
    q_peer = q if h_q == h_pad else torch.cat([q, q.new_zeros(b, s_q, h_pad - h_q, q.shape[-1])], dim=2)
    us = flashmla_peer.time_checked(timer, what, lambda: flashmla_peer.sparse_decode(q_peer, cache, idx, SOFTMAX_SCALE),
                                    ours(), heads=h_q)
    return None if us is None else (us, h_pad)


def bench(timer: Timer, roofline: Roofline, quick: bool = False) -> list[Row]:
    rows = []
    for fmt in FORMATS if not quick else FORMATS[:1]:
        cache, table = _pool(128, fmt)
        row_bytes = cache.shape[-1] * cache.element_size()
        idx_b128_s1 = _indices(128, 1, table)
        cases = [
            ("b128 s_q2 h_q128", 128, 2, 128, _indices(128, 2, table)),
            ("b64 s_q1 h_q64", 64, 1, 64, _indices(64, 1, table)),
            ("b128 s_q1 h_q16", 128, 1, 16, idx_b128_s1),
            ("b128 s_q1 h_q64 (same indices)", 128, 1, 64, idx_b128_s1),
        ]
        times = {}
        for label, b, s_q, h_q, idx in cases:
            q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device="cuda")
            fn = lambda: torch.ops.mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, None, None)  # noqa: E731
            us = timer.time_us(fn, f"{NAME}.{fmt}.{label.split(' (')[0].replace(' ', '_')}")
            times[label] = us
            nbytes = b * s_q * TOPK * row_bytes + q.numel() * 2 + b * s_q * h_q * 512 * 2
            flops = 2 * b * s_q * h_q * TOPK * (576 + 512)
            extra = {"format": fmt}
            if label.startswith("b128 s_q1 h_q64"):
                extra["h16_over_h64"] = round(times["b128 s_q1 h_q16"] / us, 3)
            peer = _flashmla_us(timer, fn, q, cache, idx, f"{fmt} {label}") if fmt == "fp8_ds_mla" else None
            if peer is not None:
                extra["flashmla_us_over_mla_ext"] = round(peer[0] / us, 3)
            rows.append(Row(f"{fmt} {label}, topk {TOPK}", us, bytes=nbytes, flops=flops, roofline=roofline, extra=extra))
            if peer is not None:
                padded = f" (q padded to {peer[1]} heads)" if peer[1] != h_q else ""
                rows.append(Row(f"FlashMLA peer: {fmt} {label}, topk {TOPK}{padded}", peer[0], bytes=nbytes, flops=flops,
                                roofline=roofline, extra={"format": fmt, "peer": flashmla_peer.NAME}))
        del cache, table
        torch.cuda.empty_cache()
    return rows
