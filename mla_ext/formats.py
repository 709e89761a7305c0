"""MLA dimensions and the byte layouts of the three cache formats (DESIGN.md §2).

=============  ============================  ==============================================
name           cache tensor                  one token's row
=============  ============================  ==============================================
``auto``       bf16/fp16 ``[nb, bs, 576]``   ``kv_c`` (512) then ``k_pe`` (64)
``fp8``        uint8 or float8_e4m3fn        every element ``sat_e4m3(x / scale)``, one fp32
``fp8_e4m3``   ``[nb, bs, 576]``             per-tensor ``scale`` (a device tensor)
``fp8_ds_mla`` uint8 ``[nb, bs, 656]``       bytes 0-511 e4m3 of ``kv_c``; 512-527 four fp32
                                             tile scales (tile i = elements 128i..128i+127);
                                             528-655 ``k_pe`` as 64 bf16, not quantised
=============  ============================  ==============================================
"""

from __future__ import annotations

import torch

KV_LORA_RANK = 512  # L: width of kv_c, and of the attention output in latent space
ROPE_DIM = 64  # R: width of k_pe / q_pe
LATENT_DIM = KV_LORA_RANK + ROPE_DIM  # 576: one cache row, one latent query

DS_MLA_TILE = 128
DS_MLA_NUM_TILES = KV_LORA_RANK // DS_MLA_TILE  # 4
DS_MLA_SCALE_OFFSET = KV_LORA_RANK  # 512
DS_MLA_ROPE_OFFSET = DS_MLA_SCALE_OFFSET + 4 * DS_MLA_NUM_TILES  # 528
DS_MLA_ROW_BYTES = DS_MLA_ROPE_OFFSET + 2 * ROPE_DIM  # 656

FP8_E4M3_MAX = 448.0

CACHE_FORMATS = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")


def canonical_format(kv_cache_dtype: str) -> str:
    """'auto' | 'fp8' | 'fp8_ds_mla' ('fp8_e4m3' is an alias of 'fp8')."""
    if kv_cache_dtype not in CACHE_FORMATS:
        raise ValueError(f"kv_cache_dtype must be one of {CACHE_FORMATS}, got {kv_cache_dtype!r}")
    return "fp8" if kv_cache_dtype == "fp8_e4m3" else kv_cache_dtype


def row_width(kv_cache_dtype: str) -> int:
    """Last dim of the cache tensor: 576 elements, or 656 bytes for fp8_ds_mla."""
    return DS_MLA_ROW_BYTES if canonical_format(kv_cache_dtype) == "fp8_ds_mla" else LATENT_DIM


def cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype = torch.bfloat16) -> torch.dtype:
    """The dtype of a cache tensor in this format (uint8 for both fp8 formats)."""
    return model_dtype if canonical_format(kv_cache_dtype) == "auto" else torch.uint8


def empty_kv_cache(
    num_blocks: int,
    block_size: int,
    kv_cache_dtype: str = "auto",
    model_dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Allocate an (uninitialised) paged cache ``[num_blocks, block_size, row]``."""
    return torch.empty(
        num_blocks,
        block_size,
        row_width(kv_cache_dtype),
        dtype=cache_torch_dtype(kv_cache_dtype, model_dtype),
        device=device,
    )
