"""Inputs for the sparse decode tests and benchmark: a paged cache with NaN in the slots no
valid index points at, and index lists mixing valid, -1, out-of-range and duplicate entries."""

from __future__ import annotations

import torch

from mla_ext import reference
from mla_ext.formats import DS_MLA_ROPE_OFFSET, DS_MLA_SCALE_OFFSET

SOFTMAX_SCALE = 192**-0.5


def make_cache(num_blocks: int, block_size: int, fmt: str, device, *, pad_pages: bool = False,
               poison_frac: float = 0.25):
    """Cache of random rows; fp8_ds_mla tile scales are scaled by random non-power-of-two
    factors. A random ``poison_frac`` of the slots (and any page padding) hold NaN.
    Returns (cache, good_slots, poisoned_slots)."""
    n = num_blocks * block_size
    kv = torch.randn(n, 576, dtype=torch.bfloat16, device=device)
    rows = reference.quantize_cache_rows(kv[:, :512], kv[:, 512:], fmt)
    if fmt == "fp8_ds_mla":
        scales = rows[:, DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32)
        scales = scales * (0.6 + 1.1 * torch.rand(n, 4, device=device))
        rows[:, DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET] = scales.view(torch.uint8)
    poisoned = torch.rand(n, device=device) < poison_frac
    if fmt == "auto":
        rows[poisoned] = float("nan")
    else:
        rows[poisoned] = 0xFF  # e4m3 NaN bytes, NaN scales, NaN k_pe
    width = rows.shape[1]
    if pad_pages:
        storage = torch.empty(num_blocks, block_size + 3, width, dtype=rows.dtype, device=device)
        storage.view(torch.uint8).fill_(0xFF)
        cache = storage[:, :block_size]
    else:
        cache = torch.empty(num_blocks, block_size, width, dtype=rows.dtype, device=device)
    cache.copy_(rows.view(num_blocks, block_size, width))
    slots = torch.arange(n, device=device)
    return cache, slots[~poisoned], slots[poisoned]


def make_indices(b: int, s_q: int, topk: int, good: torch.Tensor, num_slots: int, *, invalid_frac: float = 0.15):
    """Valid slots drawn with replacement (so duplicates occur), with -1, other negative and
    out-of-range entries mixed in, and one forced duplicate per row."""
    device = good.device
    idx = good[torch.randint(good.numel(), (b, s_q, topk), device=device)].to(torch.int32)
    r = torch.rand(b, s_q, topk, device=device)
    idx = torch.where(r < invalid_frac / 3, torch.full_like(idx, -1), idx)
    idx = torch.where((r >= invalid_frac / 3) & (r < 2 * invalid_frac / 3), num_slots + (idx % 97), idx)
    idx = torch.where((r >= 2 * invalid_frac / 3) & (r < invalid_frac), torch.full_like(idx, -(2**31) + 5), idx)
    if topk > 2:
        idx[..., -1] = idx[..., 0]
        idx[..., 1] = 2**31 - 1
    return idx
