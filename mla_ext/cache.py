"""The MLA cache write: ``concat_and_cache_mla``."""

from __future__ import annotations

import torch

from . import reference
from ._validate import check, check_dtype, check_index_dtype, check_kv_cache_rows, check_last_dim_contiguous
from ._validate import check_same_device, checked_from_env, fail, raise_first_out_of_range
from .formats import KV_LORA_RANK, ROPE_DIM, canonical_format

_OP = "concat_and_cache_mla"


def _validate(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale) -> None:
    """Metadata checks of the CPU implementation, the fake and checked mode; on CUDA
    csrc/bindings/cache_write.cpp checks the same, with the same messages."""
    try:
        fmt = canonical_format(kv_cache_dtype)
    except ValueError as e:
        fail(_OP, str(e))
    check_same_device(_OP, kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping, scale=scale)
    check(kv_c.dim() == 2 and kv_c.shape[1] == KV_LORA_RANK, _OP,
          f"kv_c must be [num_tokens, {KV_LORA_RANK}], got {list(kv_c.shape)}")
    k_pe_ok = (k_pe.dim() == 2 and k_pe.shape[1] == ROPE_DIM) or (
        k_pe.dim() == 3 and k_pe.shape[1] == 1 and k_pe.shape[2] == ROPE_DIM)
    check(k_pe_ok, _OP, f"k_pe must be [num_tokens, {ROPE_DIM}] or [num_tokens, 1, {ROPE_DIM}], got {list(k_pe.shape)}")
    check(k_pe.shape[0] == kv_c.shape[0], _OP,
          f"kv_c and k_pe must have the same number of tokens, got {kv_c.shape[0]} and {k_pe.shape[0]}")
    check_dtype(kv_c, "kv_c", (torch.bfloat16, torch.float16), _OP)
    check(k_pe.dtype == kv_c.dtype, _OP, f"k_pe must have kv_c's dtype {kv_c.dtype}, got {k_pe.dtype}")
    check_last_dim_contiguous(kv_c, "kv_c", _OP)
    check_last_dim_contiguous(k_pe, "k_pe", _OP)
    check_index_dtype(slot_mapping, "slot_mapping", torch.int64, _OP)
    check(slot_mapping.dim() == 1, _OP,
          f"slot_mapping must be 1-D [num_tokens], contiguous, got {list(slot_mapping.shape)}")
    check(slot_mapping.shape[0] <= kv_c.shape[0], _OP,
          f"slot_mapping has {slot_mapping.shape[0]} entries but kv_c only {kv_c.shape[0]} tokens")
    check_kv_cache_rows(kv_cache, kv_cache_dtype, fmt, scale, kv_c.dtype, "kv_c", _OP)


def _check_slots_in_range(kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Checked mode: raise on a slot past the cache (syncs with the GPU, so not for graphs)."""
    num_slots = kv_cache.shape[0] * kv_cache.shape[1]
    raise_first_out_of_range(_OP, "slot_mapping", slot_mapping, slot_mapping >= num_slots,
                             f"the cache ({kv_cache.shape[0]} blocks x {kv_cache.shape[1]} = {num_slots} slots)",
                             "such tokens are skipped")


def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    scale: torch.Tensor | None = None,
    *,
    checked: bool | None = None,
) -> None:
    """Write each new token's latent row ``[kv_c | k_pe]`` into its slot of the paged cache.

    Parameters
    ----------
    kv_c : Tensor ``[T, 512]`` bfloat16 or float16
        Compressed KV after its RMSNorm. Rows may be strided (last dim contiguous).
    k_pe : Tensor ``[T, 64]`` or ``[T, 1, 64]``, kv_c's dtype
        The shared key, roped by the same function (at its position) as ``q_pe``: attention
        scores ``q_pe . k_pe`` as given, so both must come out in one layout. Hugging Face
        DeepSeek's ``apply_rotary_pos_emb`` permutes the 64 dims before rotating; a key roped
        by another RoPE implementation (e.g. an in-place interleaved one) gives wrong scores
        and no error.
    kv_cache : Tensor ``[num_blocks, block_size, row]``, written in place
        ``auto``: kv_c's dtype, row 576. ``fp8``/``fp8_e4m3``: uint8 or float8_e4m3fn, row 576.
        ``fp8_ds_mla``: uint8, row 656 (see :mod:`mla_ext.formats`). Pages may be padded
        (block stride larger than ``block_size * row``).
    slot_mapping : Tensor ``[T']`` int64, ``T' <= T``
        ``slot = block * block_size + offset`` per token; only the first ``T'`` tokens are
        written (CUDA-graph padding). Negative slots are skipped; so are slots past the cache,
        unless checked mode raises for them. int32 is refused (convert once per step with
        ``slot_mapping.to(torch.int64)``).
    kv_cache_dtype : str
        ``'auto'``, ``'fp8'``, ``'fp8_e4m3'`` or ``'fp8_ds_mla'``.
    scale : Tensor ``[1]`` float32, optional
        Per-tensor scale for ``fp8``: the cache holds ``sat_e4m3(x / scale)``.
    checked : bool, optional
        Raise ``IndexError`` for slots past the cache instead of skipping them. Defaults to the
        environment variable ``MLA_EXT_CHECK_SLOTS`` (set and not "0"). Syncs with the GPU.

    Duplicate slots within one call leave one of the tokens' rows there (which one is unspecified).

    Examples
    --------
    >>> import torch, mla_ext
    >>> cache = mla_ext.empty_kv_cache(4, 16, "fp8_ds_mla")
    >>> kv_c, k_pe = torch.randn(3, 512, dtype=torch.bfloat16), torch.randn(3, 64, dtype=torch.bfloat16)
    >>> mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([5, -1, 17]), "fp8_ds_mla")
    """
    # The op validates (C++ on CUDA, _validate on CPU); checked mode reads the slots first.
    if checked or (checked is None and checked_from_env()):
        _validate(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
        _check_slots_in_range(kv_cache, slot_mapping)
    _cache_op(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


_cache_op = torch.ops.mla_ext.concat_and_cache_mla.default


# The reference is the CPU implementation; it validates like the CUDA binding does.
@torch.library.register_kernel("mla_ext::concat_and_cache_mla", "cpu")
def _concat_and_cache_mla_cpu(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale=None):
    _validate(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    reference.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


@torch.library.register_fake("mla_ext::concat_and_cache_mla")
def _concat_and_cache_mla_fake(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale=None):
    _validate(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
