"""Input checks of the DeepSeek-V4 reference functions (mla_ext/reference.py), which are the V4
ops' CPU implementations, and of the ops' fakes and checked mode (mla_ext/v4.py); on CUDA the C++
bindings check the same, with the same messages.

Same conventions as _validate.py, whose helpers they use: each message names the argument, what
was expected and what it got; only metadata is inspected (shapes, dtypes, strides, devices), except
in checked mode, which reads the slots / indices. This module loads no compiled code.
"""

from __future__ import annotations

import torch

from ._validate import bf16_only_hint, check, check_dtype, check_index_dtype, check_last_dim_contiguous
from ._validate import check_indices_in_range, check_same_device, dtype_name, fail, raise_first_out_of_range
from .formats import DS_MLA_ROW_BYTES, LATENT_DIM, V4_HEAD_DIM, V4_PAGE_ALIGN, V4_TOKEN_BYTES
from .formats import canonical_format_v4, v4_page_bytes

CACHE_WRITE_V4 = "concat_and_cache_mla_v4"
SPARSE_DECODE_V4 = "sparse_decode_mla_v4"

# The limits of the V3 sparse decode (mla_ext/sparse.py), kept for V4 until its kernels say
# otherwise: s_q up to 16 (MTP uses 2), and both lists together short enough that a kernel can hold
# their length, rounded up to a 64-key tile, in an int.
MAX_S_Q = 16
MAX_TOTAL_TOPK = 2**31 - 1 - 64


def v4_format(kv_cache_dtype, op: str) -> str:
    try:
        return canonical_format_v4(kv_cache_dtype)
    except ValueError as e:
        fail(op, str(e))


def check_kv_cache_v4(kv_cache: torch.Tensor, name: str, fmt: str, auto_dtypes: tuple[torch.dtype, ...],
                      auto_dtype_of: str, op: str) -> None:
    """A V4 cache ``[num_blocks, block_size, row]`` in format ``fmt``. ``auto``: rows of 512 elements
    in one of ``auto_dtypes`` (the dtype of the tensor named ``auto_dtype_of``), last dim contiguous.
    ``fp8_ds_mla``: uint8 rows of 584 bytes, each page one run of ``584 * block_size`` bytes (strides
    ``(page, 584, 1)``) starting at a multiple of 576 bytes from the cache's start."""
    check(kv_cache.dim() == 3, op, f"{name} must be [num_blocks, block_size, row], got {list(kv_cache.shape)}")
    row = kv_cache.shape[2]
    if fmt == "auto":
        hint = ""
        if kv_cache.dtype in (torch.uint8, torch.float8_e4m3fn) and row == V4_TOKEN_BYTES:
            hint = ": a uint8 cache of 584-byte tokens is fp8_ds_mla, pass kv_cache_dtype='fp8_ds_mla'"
        names = " or ".join(dtype_name(d) for d in auto_dtypes)
        check(kv_cache.dtype in auto_dtypes, op,
              f"kv_cache_dtype='auto' needs {name} of {auto_dtype_of}'s dtype {names}, "
              f"got {dtype_name(kv_cache.dtype)}{hint}")
        hint = f" (rows of {LATENT_DIM} are the V3 latent layout)" if row == LATENT_DIM else ""
        check(row == V4_HEAD_DIM, op,
              f"kv_cache_dtype='auto' needs {name} rows of {V4_HEAD_DIM} elements (DeepSeek-V4: 448 NoPE + 64 "
              f"RoPE), got {list(kv_cache.shape)}{hint}")
        check_last_dim_contiguous(kv_cache, name, op)
        return
    check(kv_cache.dtype == torch.uint8, op,
          f"{name} must be uint8 for kv_cache_dtype='fp8_ds_mla', got {dtype_name(kv_cache.dtype)}")
    hint = (f" ({DS_MLA_ROW_BYTES}-byte rows are the V3.2 fp8_ds_mla layout)" if row == DS_MLA_ROW_BYTES else "")
    check(row == V4_TOKEN_BYTES, op,
          f"kv_cache_dtype='fp8_ds_mla' needs {name} of DeepSeek-V4 tokens, [num_blocks, block_size, "
          f"{V4_TOKEN_BYTES}] bytes, got {list(kv_cache.shape)}{hint}")
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    strides = tuple(kv_cache.stride())
    check(strides[2] == 1 and (block_size <= 1 or strides[1] == V4_TOKEN_BYTES), op,
          f"{name}'s pages must each be one contiguous run of block_size * {V4_TOKEN_BYTES} bytes (strides "
          f"(page, {V4_TOKEN_BYTES}, 1)), got strides {strides}")
    if num_blocks > 1:
        page = strides[0]
        check(page >= block_size * V4_TOKEN_BYTES and page % V4_PAGE_ALIGN == 0, op,
              f"{name}'s page stride must be a multiple of {V4_PAGE_ALIGN} bytes and at least {V4_TOKEN_BYTES} x "
              f"block_size = {block_size * V4_TOKEN_BYTES} (the DeepSeek-V4 fp8_ds_mla layout pads each page to "
              f"{v4_page_bytes(block_size)} bytes for block_size {block_size}), got {page}; allocate the cache with "
              f"mla_ext.formats.empty_kv_cache_v4")


# --------------------------------------------------------------------------------------------
# Cache write
# --------------------------------------------------------------------------------------------


def validate_cache_write_v4(kv, kv_cache, slot_mapping, kv_cache_dtype) -> str:
    """Checks of concat_and_cache_mla_v4; returns the canonical format."""
    op = CACHE_WRITE_V4
    fmt = v4_format(kv_cache_dtype, op)
    check_same_device(op, kv=kv, kv_cache=kv_cache, slot_mapping=slot_mapping)
    hint = (f" (rows of {LATENT_DIM} are V3's [kv_c | k_pe]: write those with concat_and_cache_mla)"
            if kv.dim() == 2 and kv.shape[1] == LATENT_DIM else "")
    check(kv.dim() == 2 and kv.shape[1] == V4_HEAD_DIM, op,
          f"kv must be [num_tokens, {V4_HEAD_DIM}] (DeepSeek-V4: 448 NoPE + 64 RoPE), got {list(kv.shape)}{hint}")
    check_dtype(kv, "kv", (torch.bfloat16, torch.float16), op)
    check_last_dim_contiguous(kv, "kv", op)
    check_index_dtype(slot_mapping, "slot_mapping", torch.int64, op)
    check(slot_mapping.dim() == 1, op, f"slot_mapping must be 1-D [num_tokens], got {list(slot_mapping.shape)}")
    check(slot_mapping.shape[0] <= kv.shape[0], op,
          f"slot_mapping has {slot_mapping.shape[0]} entries but kv only {kv.shape[0]} tokens")
    check_kv_cache_v4(kv_cache, "kv_cache", fmt, (kv.dtype,), "kv", op)
    return fmt


def check_slots_in_range_v4(kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Checked mode of the cache write: raise on a slot past the cache (reads the slots)."""
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    num_slots = num_blocks * block_size
    raise_first_out_of_range(CACHE_WRITE_V4, "slot_mapping", slot_mapping, slot_mapping >= num_slots,
                             f"the cache ({num_blocks} blocks x {block_size} = {num_slots} slots)",
                             "such tokens are skipped")


# --------------------------------------------------------------------------------------------
# Sparse decode
# --------------------------------------------------------------------------------------------


def _check_index_list(indices, name, b, s_q, lengths, lengths_name, op) -> None:
    check_index_dtype(indices, name, torch.int32, op)
    check(indices.dim() == 3 and tuple(indices.shape[:2]) == (b, s_q) and indices.shape[2] >= 1, op,
          f"{name} must be [b, s_q, topk] = [{b}, {s_q}, topk >= 1], got {list(indices.shape)}")
    check_last_dim_contiguous(indices, name, op)
    if lengths is not None:
        check_index_dtype(lengths, lengths_name, torch.int32, op)
        check(lengths.dim() == 1 and lengths.shape[0] == b, op,
              f"{lengths_name} must be int32 [b] = [{b}], got {list(lengths.shape)}")


def validate_sparse_decode_v4(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink,
                              extra_kv_cache, extra_indices, extra_topk_length) -> str:
    """Checks of sparse_decode_mla_v4; returns the canonical format."""
    op = SPARSE_DECODE_V4
    fmt = v4_format(kv_cache_dtype, op)
    check_same_device(op, q=q, kv_cache=kv_cache, indices=indices, topk_length=topk_length, attn_sink=attn_sink,
                      extra_kv_cache=extra_kv_cache, extra_indices=extra_indices,
                      extra_topk_length=extra_topk_length)
    hint = (f" (a {LATENT_DIM}-wide q is V3's latent query: use sparse_decode_mla)"
            if q.dim() == 4 and q.shape[3] == LATENT_DIM else "")
    check(q.dim() == 4 and q.shape[3] == V4_HEAD_DIM, op,
          f"q must be [b, s_q, h_q, {V4_HEAD_DIM}] (DeepSeek-V4: 448 NoPE + 64 RoPE), got {list(q.shape)}{hint}")
    check_dtype(q, "q", (torch.bfloat16,), op, bf16_only_hint(q, "q", "sparse decode"))
    check_last_dim_contiguous(q, "q", op)
    b, s_q, h_q = q.shape[:3]
    check(1 <= s_q <= MAX_S_Q, op, f"s_q must be 1..{MAX_S_Q}, got {s_q}")
    check(h_q >= 1, op, f"h_q must be >= 1, got {h_q}")
    check(isinstance(softmax_scale, (int, float)) and not isinstance(softmax_scale, bool), op,
          f"softmax_scale must be a float, got {type(softmax_scale).__name__}")
    check_kv_cache_v4(kv_cache, "kv_cache", fmt, (torch.bfloat16,), "q", op)
    _check_index_list(indices, "indices", b, s_q, topk_length, "topk_length", op)
    if attn_sink is not None:
        check(attn_sink.dtype == torch.float32 and attn_sink.dim() == 1 and attn_sink.shape[0] == h_q, op,
              f"attn_sink must be float32 [h_q] = [{h_q}], got {dtype_name(attn_sink.dtype)} {list(attn_sink.shape)}")
    if extra_kv_cache is None:
        check(extra_indices is None, op, "extra_indices given without extra_kv_cache")
        check(extra_topk_length is None, op, "extra_topk_length given without extra_kv_cache")
        total = indices.shape[2]
    else:
        check(extra_indices is not None, op, "extra_kv_cache needs extra_indices [b, s_q, extra_topk]")
        check_kv_cache_v4(extra_kv_cache, "extra_kv_cache", fmt, (torch.bfloat16,), "q", op)
        _check_index_list(extra_indices, "extra_indices", b, s_q, extra_topk_length, "extra_topk_length", op)
        total = indices.shape[2] + extra_indices.shape[2]
    check(total <= MAX_TOTAL_TOPK, op,
          f"topk + extra_topk (the last dims of indices and extra_indices) must be <= {MAX_TOTAL_TOPK}, got {total}")
    return fmt


def check_indices_in_range_v4(kv_cache, indices, topk_length, name: str) -> None:
    """Checked mode of the V4 decode, for the main pool (``indices``) or the extra one (``extra_indices``)."""
    check_indices_in_range(SPARSE_DECODE_V4, kv_cache, indices, topk_length, name,
                           "kv_cache" if name == "indices" else "extra_kv_cache")
