"""The executable spec: plain-PyTorch, fp32-math implementations of every mla_ext op.

These functions define the semantics the CUDA kernels are tested against, and they are
registered as the ops' CPU implementations, so the whole API runs without a GPU. They are
written to be read, not to be fast. They work on tensors of any device.
"""

from __future__ import annotations

import torch

from .formats import (
    DS_MLA_NUM_TILES,
    DS_MLA_ROPE_OFFSET,
    DS_MLA_ROW_BYTES,
    DS_MLA_SCALE_OFFSET,
    DS_MLA_TILE,
    FP8_E4M3_MAX,
    KV_LORA_RANK,
    LATENT_DIM,
    ROPE_DIM,
    canonical_format,
)

# --------------------------------------------------------------------------------------------
# fp8 helpers
# --------------------------------------------------------------------------------------------


def sat_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round to nearest even, saturating to +-448 (NaN stays NaN)."""
    return x.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def ds_mla_tile_scale(amax: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla writer scale: ``2 ** ceil(log2(max(amax / 448, 1e-4)))``, exactly.

    Computed from frexp (v = m * 2**e, m in [0.5, 1)), not from a rounded log2: ceil(log2 v) is
    e - 1 when v is a power of two (m == 0.5), else e.
    """
    v = torch.clamp(amax.float() / FP8_E4M3_MAX, min=1e-4)
    mantissa, exponent = torch.frexp(v)
    ceil_log2 = torch.where(mantissa == 0.5, exponent - 1, exponent)
    return torch.ldexp(torch.ones_like(v), ceil_log2)


# --------------------------------------------------------------------------------------------
# Cache write
# --------------------------------------------------------------------------------------------


def quantize_cache_rows(
    kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows ``[T, 576]`` (auto, in kv_c's dtype; fp8 as float8_e4m3fn) or ``[T, 656]`` uint8."""
    fmt = canonical_format(kv_cache_dtype)
    kv_c = kv_c.reshape(-1, KV_LORA_RANK)
    k_pe = k_pe.reshape(-1, ROPE_DIM)
    if fmt == "auto":
        return torch.cat([kv_c, k_pe], dim=-1)
    if fmt == "fp8":
        if scale is None:
            raise ValueError("kv_cache_dtype='fp8' needs scale")
        return sat_e4m3(torch.cat([kv_c, k_pe], dim=-1).float() / scale.float().reshape(()))
    # fp8_ds_mla
    tiles = kv_c.float().reshape(-1, DS_MLA_NUM_TILES, DS_MLA_TILE)
    tile_scale = ds_mla_tile_scale(tiles.abs().amax(dim=-1))  # [T, 4]
    q = sat_e4m3(tiles / tile_scale.unsqueeze(-1)).reshape(-1, KV_LORA_RANK)
    rows = torch.empty(kv_c.shape[0], DS_MLA_ROW_BYTES, dtype=torch.uint8, device=kv_c.device)
    rows[:, :DS_MLA_SCALE_OFFSET] = q.view(torch.uint8)
    rows[:, DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET] = tile_scale.contiguous().view(torch.uint8)
    rows[:, DS_MLA_ROPE_OFFSET:] = k_pe.to(torch.bfloat16).contiguous().view(torch.uint8)
    return rows


def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    scale: torch.Tensor | None = None,
) -> None:
    """Write token t's row into slot ``slot_mapping[t]`` of the paged cache, in place.

    ``slot = block * block_size + offset``; tokens with a negative slot (padding) or a slot past
    the cache are skipped. Only the first ``slot_mapping.numel()`` tokens are written.
    """
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    num_tokens = slot_mapping.shape[0]
    slots = slot_mapping.long()
    keep = (slots >= 0) & (slots < num_blocks * block_size)
    tokens = torch.nonzero(keep).flatten()
    rows = quantize_cache_rows(kv_c[:num_tokens][tokens], k_pe[:num_tokens][tokens], kv_cache_dtype, scale)
    slots = slots[tokens]
    # fp8 caches are written through a uint8 view (index_put has no float8 kernels on every device)
    target = kv_cache if canonical_format(kv_cache_dtype) == "auto" else kv_cache.view(torch.uint8)
    target[slots // block_size, slots % block_size] = rows.view(target.dtype)


# --------------------------------------------------------------------------------------------
# Cache read (used by the attention references)
# --------------------------------------------------------------------------------------------


def dequantize_cache(kv_cache: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The cache as fp32 ``[..., 576]`` rows: what attention reads. Readers compute ``q * s`` for
    any finite fp32 ``s`` (not only the powers of two the writer makes)."""
    fmt = canonical_format(kv_cache_dtype)
    if fmt == "auto":
        return kv_cache.float()
    if fmt == "fp8":
        if scale is None:
            raise ValueError("kv_cache_dtype='fp8' needs scale")
        return kv_cache.view(torch.float8_e4m3fn).float() * scale.float().reshape(())
    raw = kv_cache.view(torch.uint8)
    lead = raw.shape[:-1]
    q = raw[..., :KV_LORA_RANK].contiguous().view(torch.float8_e4m3fn).float()
    s = raw[..., DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32)
    kv_c = (q.reshape(*lead, DS_MLA_NUM_TILES, DS_MLA_TILE) * s.unsqueeze(-1)).reshape(*lead, KV_LORA_RANK)
    k_pe = raw[..., DS_MLA_ROPE_OFFSET:DS_MLA_ROW_BYTES].contiguous().view(torch.bfloat16).float()
    out = torch.cat([kv_c, k_pe], dim=-1)
    assert out.shape[-1] == LATENT_DIM
    return out
