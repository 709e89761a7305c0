"""Cache write (concat_and_cache_mla): self-check and benchmark."""

from __future__ import annotations

import torch

from .. import reference
from ..cache import concat_and_cache_mla
from ..formats import empty_kv_cache, row_width
from .harness import Roofline, Row, Timer

NAME = "concat_and_cache_mla"
FORMATS = ("auto", "fp8", "fp8_ds_mla")


def _inputs(num_tokens: int, block_size: int, fmt: str, device, extra_blocks: int = 3, fp8_scale: float = 0.0173):
    num_blocks = (num_tokens + block_size - 1) // block_size + extra_blocks
    # kv_c and k_pe as strided views of one [T, 576] projection output, as engines produce them.
    kv = torch.randn(num_tokens, 576, dtype=torch.bfloat16, device=device)
    kv_c, k_pe = kv[:, :512], kv[:, 512:]
    cache = empty_kv_cache(num_blocks, block_size, fmt, device=device)
    # What an engine writes: each token at the next offset of its request's pages, the pages in
    # random order in the pool.
    pages = torch.randperm(num_blocks, device=device)
    token = torch.arange(num_tokens, device=device)
    slots = pages[token // block_size] * block_size + token % block_size
    scale = torch.tensor([fp8_scale], device=device) if fmt == "fp8" else None
    return kv_c, k_pe, cache, slots, scale


def self_check(device: str) -> str:
    """Each format on a small case: the written rows decode back to the inputs within the
    format's rounding, and on a GPU the kernel's bytes equal the reference's."""
    worst = {}
    for fmt in FORMATS:
        kv_c, k_pe, cache, slots, scale = _inputs(77, 64, fmt, device)
        cache.view(torch.uint8).fill_(0x5A)
        expected = cache.clone()
        concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt, scale)
        if device != "cpu":
            reference.concat_and_cache_mla(kv_c, k_pe, expected, slots, fmt, scale)
            if not torch.equal(cache.view(torch.uint8), expected.view(torch.uint8)):
                raise AssertionError(f"{NAME} {fmt}: kernel and reference bytes differ")
        rows = reference.dequantize_cache(cache, fmt, scale).flatten(0, 1)[slots]
        ref_rows = torch.cat([kv_c, k_pe], dim=-1).float()
        rel = ((rows - ref_rows).norm() / ref_rows.norm()).item()
        if rel > (1e-6 if fmt == "auto" else 0.05):  # e4m3 keeps 3 mantissa bits: ~2-4% rms
            raise AssertionError(f"{NAME} {fmt}: rows decode back with relative error {rel:.3g}")
        worst[fmt] = rel
    what = "kernel bytes equal the reference; " if device != "cpu" else ""
    return what + "round trip rel. error " + ", ".join(f"{f} {e:.1e}" for f, e in worst.items())


def bench(timer: Timer, roofline: Roofline, quick: bool = False) -> list[Row]:
    rows = []
    token_counts = (1, 4096, 65536) if quick else (1, 16, 256, 4096, 16384, 65536)
    # fp8 with an arbitrary calibrated scale (division) and with scale 1.0 (an exact multiply).
    variants = [("auto", None), ("fp8", 0.0173), ("fp8", 1.0), ("fp8_ds_mla", None)]
    for fmt, fp8_scale in variants:
        label = fmt if fp8_scale is None else f"{fmt} scale={fp8_scale:g}"
        for t in token_counts:
            kv_c, k_pe, cache, slots, scale = _inputs(t, 64, fmt, "cuda", fp8_scale=fp8_scale or 1.0)
            fn = lambda: torch.ops.mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt, scale)  # noqa: E731
            us = timer.time_us(fn, f"{NAME}.{label.replace(' ', '_')}.T{t}")
            # bytes: inputs read (576 bf16 + slot) + cache rows written
            nbytes = t * (576 * 2 + 8 + row_width(fmt) * cache.element_size())
            rows.append(Row(f"{label} T={t}", us, bytes=nbytes, roofline=roofline))
    return rows


def profile_case(num_tokens: int = 65536, fmt: str = "fp8_ds_mla") -> None:
    """A few calls of one case inside the NVTX range ``mla_ext.profile`` (for ncu/nsys)."""
    kv_c, k_pe, cache, slots, scale = _inputs(num_tokens, 64, fmt, "cuda")
    for _ in range(3):
        torch.ops.mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt, scale)
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("mla_ext.profile"):
        torch.ops.mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt, scale)
        torch.cuda.synchronize()
