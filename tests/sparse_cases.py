"""Inputs for the sparse decode tests: a paged cache with NaN in the slots no valid index points
at, index lists mixing valid, -1, out-of-range and duplicate entries, and the batch sizes whose
top-k lists the library splits (partials + combine) or runs whole."""

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


def head_tile(h_q: int, fmt: str = "auto") -> int:
    """Query heads per CTA (csrc/sparse/sparse_decode.cu): 16, 32, else 64; 17-32 heads of an
    fp8_ds_mla cache take two 16-head tiles where sm90's bulk-copy e4m3-fragment kernel runs."""
    if h_q <= 16:
        return 16
    if h_q <= 32:
        return 16 if fmt == "fp8_ds_mla" and sm90_fp8_m16() else 32
    return 64


def sm90_fp8_m16() -> bool:
    """fp8_ds_mla 16-head tiles run the sm90 bulk-copy kernel (an H200 not forced portable)."""
    from conftest import is_sm90
    from mla_ext._library import force_portable

    return is_sm90() and not force_portable()


def _num_sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def split_plan(b: int, s_q: int, h_q: int, topk: int, fmt: str = "auto") -> tuple[int, int]:
    """(first split request, splits per split request), as plan_sparse_decode
    (csrc/sparse/sparse_decode.cu) cuts the top-k lists; (b, 1) when nothing is split. Small batches:
    every list, into as many pieces as the SMs the b * s_q * ceil(h_q / tile) CTAs leave idle allow
    (at most one per 64-key tile, none where that shortens each list by too little). More CTAs than
    SMs with 64-head tiles: the lists of the last requests, whose CTAs would make a mostly idle last
    wave, into as many pieces as fill it (at least 2 tiles each)."""
    sms = _num_sms()
    tiles = max(1, -(-topk // 64))
    tile = head_tile(h_q, fmt)
    per_request = s_q * -(-h_q // tile)
    ctas = b * per_request
    splits = 1 if ctas >= sms else sms // ctas
    splits = min(max(splits, 1), tiles)
    # only when it takes more off each list than the combine costs (weights in half 16-head tiles)
    weight = {16: 2, 32: 3, 64: 4}[tile]
    if splits > 1 and (tiles - -(-tiles // splits)) * weight <= 3:
        splits = 1
    first = 0
    last_wave = ctas % sms
    if tile == 64 and ctas > sms and last_wave:
        tail_requests = -(-last_wave // per_request)
        tail_ctas = tail_requests * per_request
        tail_splits = min((sms + tail_ctas - last_wave) // tail_ctas, tiles // 2)
        if tail_splits > 1 and (b - tail_requests) * s_q + tail_requests * s_q * tail_splits <= 65535:
            splits, first = tail_splits, b - tail_requests
    per_split = -(-tiles // splits)
    splits = -(-tiles // per_split)
    return (first, splits) if splits > 1 else (b, 1)


def num_splits(b: int, s_q: int, h_q: int, topk: int, fmt: str = "auto") -> int:
    """How many pieces the split top-k lists are cut into (1: none is split); see split_plan."""
    return split_plan(b, s_q, h_q, topk, fmt)[1]


def batch_kind(b: int, s_q: int, h_q: int, topk: int, fmt: str = "auto") -> str:
    """"split" (every list split), "tail" (the last requests' lists split) or "whole"."""
    first, splits = split_plan(b, s_q, h_q, topk, fmt)
    return "whole" if splits == 1 else "split" if first == 0 else "tail"


def batch_size(batch: str, s_q: int, h_q: int, split_b: int = 2, fmt: str = "auto") -> int:
    """"split": ``split_b`` requests (a small batch: its top-k lists are split); "whole": the
    smallest batch whose CTAs leave no room for a second split (more than half the SMs busy);
    "tail" (64-head tiles): one request more than the SMs hold, so that its CTAs alone would make
    the last wave and its list is split instead."""
    if batch == "split":
        return split_b
    per_request = s_q * -(-h_q // head_tile(h_q, fmt))
    if batch == "tail":
        return _num_sms() // per_request + 1
    assert batch == "whole", batch
    return _num_sms() // 2 // per_request + 1
