"""DeepSeek-V4 ops: ``concat_and_cache_mla_v4`` (the cache write of both V4 cache formats) and
``sparse_decode_mla_v4`` (sparse top-k decode over the main and the extra cache). The layouts are in
:mod:`mla_ext.formats`; the spec is the reference (:mod:`mla_ext.reference`), also the ops' CPU
implementation.
"""

from __future__ import annotations

import torch

from . import reference
from ._validate import checked_from_env
from ._validate_v4 import check_indices_in_range_v4, check_slots_in_range_v4, validate_cache_write_v4
from ._validate_v4 import validate_sparse_decode_v4
from .formats import KV_LORA_RANK


def concat_and_cache_mla_v4(
    kv: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    *,
    checked: bool | None = None,
) -> None:
    """Write each new token's DeepSeek-V4 row into its slot of a V4 paged cache, in place.

    Parameters
    ----------
    kv : Tensor ``[T, 512]`` bfloat16 or float16
        448 NoPE dims then the 64 roped dims (roped by the same function as q's). Rows may be
        strided (last dim contiguous).
    kv_cache : Tensor
        From :func:`mla_ext.formats.empty_kv_cache_v4`. ``auto``: ``[num_blocks, block_size, 512]``
        in kv's dtype (pages may be padded). ``fp8_ds_mla``: uint8 ``[num_blocks, block_size, 584]``
        whose pages hold the tokens' 576-byte data parts then their 8-byte scale parts, each page
        padded to a multiple of 576 bytes (the layout byte by byte: :mod:`mla_ext.formats`).
    slot_mapping : Tensor ``[T']`` int64, ``T' <= T``
        ``slot = block * block_size + offset`` per token; only the first ``T'`` tokens are written.
        Negative slots are skipped; so are slots past the cache, unless checked mode raises.
    kv_cache_dtype : str
        ``'auto'`` or ``'fp8_ds_mla'`` (NoPE in e4m3 with one UE8M0 scale per 64 dims, RoPE bf16;
        bit-exact with :func:`mla_ext.reference.quantize_v4_rows`).
    checked : bool, optional
        Raise ``IndexError`` for slots past the cache instead of skipping them (syncs; default
        from ``MLA_EXT_CHECK_SLOTS``).

    Nothing else in a page (other tokens, page padding) is written. Duplicate slots in one call
    leave one of the tokens there (which one is unspecified). One kernel launch, no allocation:
    CUDA-graph safe.

    Examples
    --------
    >>> import torch, mla_ext
    >>> from mla_ext.formats import empty_kv_cache_v4
    >>> cache = empty_kv_cache_v4(4, 64, "fp8_ds_mla")
    >>> kv = torch.randn(3, 512, dtype=torch.bfloat16)
    >>> mla_ext.concat_and_cache_mla_v4(kv, cache, torch.tensor([5, -1, 130]), "fp8_ds_mla")
    """
    # The op validates (C++ on CUDA, the reference on CPU); checked mode reads the slots first.
    if checked or (checked is None and checked_from_env()):
        validate_cache_write_v4(kv, kv_cache, slot_mapping, kv_cache_dtype)
        check_slots_in_range_v4(kv_cache, slot_mapping)
    _cache_v4_op(kv, kv_cache, slot_mapping, kv_cache_dtype)


_cache_v4_op = torch.ops.mla_ext.concat_and_cache_mla_v4.default


# The reference is the CPU implementation; it validates like the CUDA binding does.
@torch.library.register_kernel("mla_ext::concat_and_cache_mla_v4", "cpu")
def _concat_and_cache_mla_v4_cpu(kv, kv_cache, slot_mapping, kv_cache_dtype):
    reference.concat_and_cache_mla_v4(kv, kv_cache, slot_mapping, kv_cache_dtype, checked=False)


@torch.library.register_fake("mla_ext::concat_and_cache_mla_v4")
def _concat_and_cache_mla_v4_fake(kv, kv_cache, slot_mapping, kv_cache_dtype):
    validate_cache_write_v4(kv, kv_cache, slot_mapping, kv_cache_dtype)


def sparse_decode_mla_v4(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    kv_cache_dtype: str = "auto",
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    *,
    checked: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 sparse decode: query token ``(i, j)`` attends to the slots ``indices[i, j, :]``
    of ``kv_cache`` and, when given, ``extra_indices[i, j, :]`` of ``extra_kv_cache`` (the
    sliding-window pool, with its own page size), all in one softmax. The semantics (validity of
    entries, lengths, sinks, NaN, what FlashMLA does differently) are those of
    :func:`mla_ext.reference.sparse_decode_mla_v4`.

    Parameters
    ----------
    q : Tensor ``[b, s_q, h_q, 512]`` bfloat16
        448 NoPE dims then 64 roped dims; s_q 1..16, any h_q (no padding).
    kv_cache, extra_kv_cache : Tensor
        V4 caches of one ``kv_cache_dtype`` (:func:`mla_ext.formats.empty_kv_cache_v4`), each with
        its own ``block_size``.
    indices, extra_indices : Tensor ``[b, s_q, topk]`` / ``[b, s_q, extra_topk]`` int32
        Global slots ``block * block_size + offset`` of their cache; negative, past the cache or at
        a position ``>=`` the list's length: invalid (not attended, never read).
    softmax_scale : float
    kv_cache_dtype : str
        ``'auto'`` (bf16 rows of 512) or ``'fp8_ds_mla'`` (584-byte tokens).
    topk_length, extra_topk_length : Tensor ``[b]`` int32, optional
        Only the first n entries of request i's list count.
    attn_sink : Tensor ``[h_q]`` float32, optional
        Scales out by ``e^lse / (e^lse + e^sink)``; lse is returned without it.
    checked : bool, optional
        Raise ``IndexError`` for a counted entry past its cache (syncs; default from
        ``MLA_EXT_CHECK_SLOTS``).

    Returns
    -------
    out : Tensor ``[b, s_q, h_q, 512]`` bfloat16 (the value is the whole row, RoPE dims included)
    lse : Tensor ``[b, h_q, s_q]`` float32, natural log; -inf where nothing was valid

    On sm90 with fp8_ds_mla pools and more than 32 heads one fused kernel reads both pools' rows;
    elsewhere the selected rows are gathered and dequantised to bf16 first, then attended by the V3
    sparse decode kernels (csrc/sparse/v4_decode.h; bench/results/sparse_v4_vs_flashmla.md).
    """
    if checked or (checked is None and checked_from_env()):
        validate_sparse_decode_v4(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink,
                                  extra_kv_cache, extra_indices, extra_topk_length)
        check_indices_in_range_v4(kv_cache, indices, topk_length, "indices")
        if extra_kv_cache is not None:
            check_indices_in_range_v4(extra_kv_cache, extra_indices, extra_topk_length, "extra_indices")
    return _decode_v4_op(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink, extra_kv_cache,
                         extra_indices, extra_topk_length)


_decode_v4_op = torch.ops.mla_ext.sparse_decode_mla_v4.default


@torch.library.register_kernel("mla_ext::sparse_decode_mla_v4", "cpu")
def _sparse_decode_mla_v4_cpu(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length=None, attn_sink=None,
                              extra_kv_cache=None, extra_indices=None, extra_topk_length=None):
    return reference.sparse_decode_mla_v4(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink,
                                          extra_kv_cache, extra_indices, extra_topk_length, checked=False)


@torch.library.register_fake("mla_ext::sparse_decode_mla_v4")
def _sparse_decode_mla_v4_fake(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length=None,
                               attn_sink=None, extra_kv_cache=None, extra_indices=None, extra_topk_length=None):
    validate_sparse_decode_v4(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink,
                              extra_kv_cache, extra_indices, extra_topk_length)
    b, s_q, h_q, _ = q.shape
    return q.new_empty(b, s_q, h_q, KV_LORA_RANK), q.new_empty(b, h_q, s_q, dtype=torch.float32)
