"""Sparse top-k MLA decode (DeepSeek V3.2) and the GPU index builders that feed it."""

from __future__ import annotations

import torch

from . import reference
from ._validate import bf16_only_hint, check, check_dtype, check_index_dtype, check_kv_cache_rows
from ._validate import check_last_dim_contiguous, check_same_device, checked_from_env, dtype_name, fail
from ._validate import check_indices_in_range, raise_first_out_of_range
from .formats import KV_LORA_RANK, LATENT_DIM, canonical_format

_DECODE = "sparse_decode_mla"
_SLOTS = "sparse_indices_to_slots"
_COMPRESSED = "sparse_compressed_indices"
_TOPK_SLOTS = "sparse_topk_to_slots"
_COMPRESSED_SLOTS = "compressed_slot_mapping"
MAX_S_Q = 16
INT32_MAX = 2**31 - 1
MAX_TOPK = INT32_MAX - 64  # the kernels hold topk in int and round it up to 64-key tiles


def _check_int32_param(value, name: str, op: str) -> None:
    """block_size and compress_ratio are ints in the kernels: a larger value would wrap (2^32 -> 0)."""
    check(isinstance(value, int) and 1 <= value <= INT32_MAX, op, f"{name} must be an int in [1, {INT32_MAX}], got {value}")


def _validate_decode(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink) -> None:
    """Metadata checks of the CPU implementation, the fake and checked mode; on CUDA
    csrc/bindings/sparse.cpp checks the same, with the same messages."""
    try:
        fmt = canonical_format(kv_cache_dtype)
    except ValueError as e:
        fail(_DECODE, str(e))
    check(fmt in ("auto", "fp8_ds_mla"), _DECODE,
          f"kv_cache_dtype must be 'auto' (bf16) or 'fp8_ds_mla' for sparse decode, got {kv_cache_dtype!r}")
    check_same_device(_DECODE, q=q, kv_cache=kv_cache, indices=indices, topk_length=topk_length, attn_sink=attn_sink)
    check(q.dim() == 4 and q.shape[3] == LATENT_DIM, _DECODE, f"q must be [b, s_q, h_q, {LATENT_DIM}], got {list(q.shape)}")
    check_dtype(q, "q", (torch.bfloat16,), _DECODE, bf16_only_hint(q, "q", "sparse decode"))
    check_last_dim_contiguous(q, "q", _DECODE)
    b, s_q, h_q = q.shape[:3]
    check(1 <= s_q <= MAX_S_Q, _DECODE, f"s_q must be 1..{MAX_S_Q}, got {s_q}")
    check(h_q >= 1, _DECODE, f"h_q must be >= 1, got {h_q}")
    check_kv_cache_rows(kv_cache, kv_cache_dtype, fmt, None, torch.bfloat16, "q", _DECODE)
    check_index_dtype(indices, "indices", torch.int32, _DECODE)
    check(indices.dim() == 3 and tuple(indices.shape[:2]) == (b, s_q) and indices.shape[2] >= 1, _DECODE,
          f"indices must be [b, s_q, topk] = [{b}, {s_q}, topk >= 1], got {list(indices.shape)}")
    check(indices.shape[2] <= MAX_TOPK, _DECODE, f"topk (indices.shape[2]) must be <= {MAX_TOPK}, got {indices.shape[2]}")
    check_last_dim_contiguous(indices, "indices", _DECODE)
    check(isinstance(softmax_scale, (int, float)), _DECODE, f"softmax_scale must be a float, got {type(softmax_scale)}")
    if topk_length is not None:
        check_index_dtype(topk_length, "topk_length", torch.int32, _DECODE)
        check(topk_length.dim() == 1 and topk_length.shape[0] == b, _DECODE,
              f"topk_length must be int32 [b] = [{b}], got {list(topk_length.shape)}")
    if attn_sink is not None:
        check(attn_sink.dtype == torch.float32 and attn_sink.dim() == 1 and attn_sink.shape[0] == h_q, _DECODE,
              f"attn_sink must be float32 [h_q] = [{h_q}], got {dtype_name(attn_sink.dtype)} {list(attn_sink.shape)}")


def sparse_decode_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    kv_cache_dtype: str = "auto",
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    *,
    checked: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse top-k MLA decode: each query token attends to the cache slots its indexer chose.

    Parameters
    ----------
    q : Tensor ``[b, s_q, h_q, 576]`` bfloat16
        Latent query (absorbed ``q_nope`` 512, then ``q_pe`` 64). ``s_q`` 1..16, any ``h_q >= 1``
        (no padding to 64 heads: 16 heads cost a quarter of the MMA work of 64). The kernels are
        bf16-only: float16 is refused. Rows not 16-byte aligned are copied first.
    kv_cache : Tensor ``[num_blocks, block_size, row]``
        ``'fp8_ds_mla'``: uint8, row 656; ``'auto'``: bfloat16, row 576. Any ``block_size``;
        pages may be padded (the strides are honoured).
    indices : Tensor ``[b, s_q, topk]`` int32
        Global slots ``block * block_size + offset`` (see :func:`sparse_indices_to_slots`). A
        negative slot or one ``>= num_blocks * block_size`` is invalid: it contributes nothing
        and its row is never read. Duplicates count as often as they appear. Any ``topk >= 1``.
        int64 is refused (convert once per step with ``indices.to(torch.int32)``).
    softmax_scale : float
        Scale of the un-absorbed head, e.g. ``192 ** -0.5`` (times mscale^2 for YaRN).
    kv_cache_dtype : str
        ``'auto'`` (the default of every mla_ext op: a bf16 cache) or ``'fp8_ds_mla'`` (pass it
        for a uint8 cache of 656-byte rows).
    topk_length : Tensor ``[b]`` int32, optional
        Only the first ``topk_length[i]`` entries of request i's lists count (0 = none).
    attn_sink : Tensor ``[h_q]`` float32, optional
        Per-head sink logit: out is scaled by ``e^lse / (e^lse + e^sink)``; lse is unchanged.
        ``+inf`` gives out 0, ``-inf`` no change.
    checked : bool, optional
        Raise ``IndexError`` naming the first entry ``>= num_blocks * block_size`` at a counted
        position (``< topk_length``) instead of treating it as invalid; negative entries (-1
        padding) stay allowed. Defaults to the environment variable ``MLA_EXT_CHECK_SLOTS`` (set
        and not "0"). Syncs with the GPU: not for use inside a captured CUDA graph.

    Returns
    -------
    out : Tensor ``[b, s_q, h_q, 512]`` bfloat16
        Latent output (0 for a query with no valid index).
    lse : Tensor ``[b, h_q, s_q]`` float32
        Natural-log sum of exp of the scaled scores (-inf for a query with no valid index).

    The work is split over the top-k list when ``b * s_q * head tiles`` would leave SMs idle, and
    the parts merge by LSE; the plan depends on shapes only, so a step can be captured in a CUDA
    graph. ``MLA_EXT_FORCE_PORTABLE=1`` forces the portable (mma.sync) kernel on Hopper.

    Examples
    --------
    >>> import torch, mla_ext
    >>> cache = mla_ext.empty_kv_cache(8, 64, "fp8_ds_mla")
    >>> kv = torch.randn(512, 576, dtype=torch.bfloat16)
    >>> mla_ext.concat_and_cache_mla(kv[:, :512], kv[:, 512:], cache, torch.arange(512), "fp8_ds_mla")
    >>> q = torch.randn(2, 1, 16, 576, dtype=torch.bfloat16)
    >>> indices = torch.randint(0, 512, (2, 1, 128), dtype=torch.int32)
    >>> out, lse = mla_ext.sparse_decode_mla(q, cache, indices, 192 ** -0.5, "fp8_ds_mla")
    >>> out.shape, lse.shape
    (torch.Size([2, 1, 16, 512]), torch.Size([2, 16, 1]))
    """
    # The op validates (C++ on CUDA, _validate_decode on CPU); checked mode reads the indices first.
    if checked or (checked is None and checked_from_env()):
        _validate_decode(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink)
        check_indices_in_range(_DECODE, kv_cache, indices, topk_length)
    return _sparse_op(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink)


_sparse_op = torch.ops.mla_ext.sparse_decode_mla.default


@torch.library.register_kernel("mla_ext::sparse_decode_mla", "cpu")
def _sparse_decode_mla_cpu(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length=None, attn_sink=None):
    _validate_decode(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink)
    return reference.sparse_decode_mla(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink)


@torch.library.register_fake("mla_ext::sparse_decode_mla")
def _sparse_decode_mla_fake(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length=None, attn_sink=None):
    _validate_decode(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink)
    b, s_q, h_q = q.shape[:3]
    out = q.new_empty(b, s_q, h_q, KV_LORA_RANK)
    lse = q.new_empty(b, h_q, s_q, dtype=torch.float32)
    return out, lse


# --------------------------------------------------------------------------------------------
# Index builders
# --------------------------------------------------------------------------------------------


def _validate_slots(local_indices, block_table, block_size, slots) -> None:
    check_same_device(_SLOTS, local_indices=local_indices, block_table=block_table, slots=slots)
    check_index_dtype(local_indices, "local_indices", torch.int32, _SLOTS)
    check(local_indices.dim() == 3, _SLOTS, f"local_indices must be [b, s_q, topk], got {list(local_indices.shape)}")
    check_index_dtype(block_table, "block_table", torch.int32, _SLOTS)
    check(block_table.dim() == 2 and block_table.shape[0] == local_indices.shape[0], _SLOTS,
          f"block_table must be [b, max_blocks] with b = {local_indices.shape[0]}, got {list(block_table.shape)}")
    check_last_dim_contiguous(block_table, "block_table", _SLOTS)
    _check_int32_param(block_size, "block_size", _SLOTS)
    check_dtype(slots, "slots", (torch.int32,), _SLOTS)
    check(slots.shape == local_indices.shape and slots.is_contiguous(), _SLOTS,
          f"slots must be a contiguous int32 tensor of local_indices' shape {list(local_indices.shape)}, "
          f"got {list(slots.shape)}")


def sparse_indices_to_slots(
    local_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    out: torch.Tensor | None = None,
    *,
    checked: bool | None = None,
) -> torch.Tensor:
    """Top-k token positions of each request -> global cache slots for :func:`sparse_decode_mla`.

    Parameters
    ----------
    local_indices : Tensor ``[b, s_q, topk]`` int32
        Positions in request i's sequence, as an indexer returns them; -1 (any negative) = none.
    block_table : Tensor ``[b, max_blocks]`` int32
        Request i's pages; a negative entry is an unassigned page.
    block_size : int
        Tokens per page.
    out : Tensor ``[b, s_q, topk]`` int32, optional
        Preallocated, contiguous result (CUDA-graph use); allocated when None.
    checked : bool, optional
        Raise ``IndexError`` naming the first position past the block table (``>= max_blocks *
        block_size``) instead of giving it slot -1; negative positions (-1 padding) stay allowed.
        Defaults to the environment variable ``MLA_EXT_CHECK_SLOTS`` (set and not "0"). Syncs
        with the GPU: not for use inside a captured CUDA graph.

    Returns
    -------
    Tensor ``[b, s_q, topk]`` int32: ``block_table[i, p // block_size] * block_size + p %
    block_size``, or -1 for a negative position, one past the block table, on an unassigned
    page, or a slot past int32. On a GPU one elementwise kernel, no host sync (unless checked).
    """
    if out is None:
        out = torch.empty(local_indices.shape, dtype=torch.int32, device=local_indices.device)
    if checked or (checked is None and checked_from_env()):
        _validate_slots(local_indices, block_table, block_size, out)
        max_blocks = block_table.shape[1]
        num_positions = max_blocks * block_size
        raise_first_out_of_range(_SLOTS, "local_indices", local_indices, local_indices >= num_positions,
                                 f"the block table ({max_blocks} pages x {block_size} = {num_positions} positions)",
                                 "such positions give slot -1")
    torch.ops.mla_ext.sparse_indices_to_slots.default(local_indices, block_table, block_size, out)
    return out


@torch.library.register_kernel("mla_ext::sparse_indices_to_slots", "cpu")
def _sparse_indices_to_slots_cpu(local_indices, block_table, block_size, slots):
    _validate_slots(local_indices, block_table, block_size, slots)
    slots.copy_(reference.sparse_indices_to_slots(local_indices, block_table, block_size))


def _check_token_to_req_and_table(token_to_req, num_tokens, block_table, op) -> None:
    """The flat-batch builders' token_to_req [T] and block_table [num_requests, max_blocks] (int32)."""
    check_index_dtype(token_to_req, "token_to_req", torch.int32, op)
    check(token_to_req.shape == (num_tokens,), op, f"token_to_req must be [T] = [{num_tokens}], got {list(token_to_req.shape)}")
    check_index_dtype(block_table, "block_table", torch.int32, op)
    check(block_table.dim() == 2, op, f"block_table must be [num_requests, max_blocks], got {list(block_table.shape)}")
    check_last_dim_contiguous(block_table, "block_table", op)


def _check_per_token_out(t, name, dtype, num_tokens, op) -> None:
    """An output of one value per token of the flat-batch builders: contiguous ``dtype [T]``."""
    check_dtype(t, name, (dtype,), op)
    check(t.shape == (num_tokens,) and t.is_contiguous(), op, f"{name} must be a contiguous [T] = [{num_tokens}], got {list(t.shape)}")


def _validate_compressed(positions, token_to_req, block_table, block_size, compress_ratio, num_decode_tokens,
                         indices, lengths) -> None:
    check_same_device(_COMPRESSED, positions=positions, token_to_req=token_to_req, block_table=block_table,
                      indices=indices, lengths=lengths)
    check_index_dtype(positions, "positions", torch.int64, _COMPRESSED)
    check(positions.dim() == 1, _COMPRESSED, f"positions must be [T], got {list(positions.shape)}")
    num_tokens = positions.shape[0]
    _check_token_to_req_and_table(token_to_req, num_tokens, block_table, _COMPRESSED)
    _check_int32_param(block_size, "block_size", _COMPRESSED)
    _check_int32_param(compress_ratio, "compress_ratio", _COMPRESSED)
    check(isinstance(num_decode_tokens, int) and 0 <= num_decode_tokens <= num_tokens, _COMPRESSED,
          f"num_decode_tokens must be in [0, {num_tokens}], got {num_decode_tokens}")
    check_dtype(indices, "indices", (torch.int32,), _COMPRESSED)
    check(indices.dim() == 2 and indices.shape[0] == num_tokens and indices.shape[1] > 0 and indices.shape[1] % 128 == 0,
          _COMPRESSED, f"indices must be [T, width] with width a positive multiple of 128, got {list(indices.shape)}")
    check_last_dim_contiguous(indices, "indices", _COMPRESSED)
    _check_per_token_out(lengths, "lengths", torch.int32, num_tokens, _COMPRESSED)


def sparse_compressed_indices(
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    compress_ratio: int,
    num_decode_tokens: int,
    indices: torch.Tensor,
    lengths: torch.Tensor,
) -> None:
    """Write the "attend to every compressed token" lists of compressed-cache layers.

    Token t at ``positions[t]`` of request ``token_to_req[t]`` sees the ``n = (positions[t] + 1)
    // compress_ratio`` compressed entries of its request. Decode tokens (the first
    ``num_decode_tokens``) get them as global slots of the compressed cache through
    ``block_table`` (-1 on an unassigned page), ready for :func:`sparse_decode_mla`; prefill
    tokens get the local indices ``0 .. n-1`` (into their request's gathered compressed rows).
    A token whose ``token_to_req`` is outside ``[0, num_requests)`` (e.g. -1 for CUDA-graph
    padding) is a padding token: length 0, row all -1, the block table is not read for it.

    Parameters
    ----------
    positions : Tensor ``[T]`` int64
    token_to_req : Tensor ``[T]`` int32, the block-table row of each token (others: padding)
    block_table : Tensor ``[num_requests, max_blocks]`` int32, pages of the compressed cache
    block_size, compress_ratio, num_decode_tokens : int
    indices : Tensor ``[T, width]`` int32, written in place
        ``width`` a positive multiple of 128 and ``>= max n`` (entries past it are dropped);
        rows are -1 padded.
    lengths : Tensor ``[T]`` int32, written in place: ``min(n, width)``.

    On a GPU one kernel, no host sync, no allocation: safe inside a captured CUDA graph.
    """
    torch.ops.mla_ext.sparse_compressed_indices.default(positions, token_to_req, block_table, block_size,
                                                        compress_ratio, num_decode_tokens, indices, lengths)


@torch.library.register_kernel("mla_ext::sparse_compressed_indices", "cpu")
def _sparse_compressed_indices_cpu(positions, token_to_req, block_table, block_size, compress_ratio,
                                   num_decode_tokens, indices, lengths):
    _validate_compressed(positions, token_to_req, block_table, block_size, compress_ratio, num_decode_tokens,
                         indices, lengths)
    ref_indices, ref_lengths = reference.sparse_compressed_indices(
        positions, token_to_req, block_table, block_size, compress_ratio, num_decode_tokens, indices.shape[1])
    indices.copy_(ref_indices)
    lengths.copy_(ref_lengths)


def _validate_topk_to_slots(topk_indices, token_to_req, block_table, block_size, slots, lengths) -> None:
    check_same_device(_TOPK_SLOTS, topk_indices=topk_indices, token_to_req=token_to_req, block_table=block_table,
                      slots=slots, lengths=lengths)
    _check_int32_param(block_size, "block_size", _TOPK_SLOTS)
    check_index_dtype(topk_indices, "topk_indices", torch.int32, _TOPK_SLOTS)
    check(topk_indices.dim() == 2, _TOPK_SLOTS, f"topk_indices must be [T, topk], got {list(topk_indices.shape)}")
    num_tokens = topk_indices.shape[0]
    _check_token_to_req_and_table(token_to_req, num_tokens, block_table, _TOPK_SLOTS)
    check_dtype(slots, "slots", (torch.int32,), _TOPK_SLOTS)
    check(slots.shape == topk_indices.shape and slots.is_contiguous(), _TOPK_SLOTS,
          f"slots must be a contiguous int32 tensor of topk_indices' shape {list(topk_indices.shape)}, "
          f"got {list(slots.shape)}")
    _check_per_token_out(lengths, "lengths", torch.int32, num_tokens, _TOPK_SLOTS)


def sparse_topk_to_slots(
    topk_indices: torch.Tensor,
    token_to_req: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    slots: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A flat batch's top-k lists of compressed-cache positions -> global slots and lengths.

    What DeepSeek-V4's C4A layers pass as :func:`sparse_decode_mla_v4`'s second list (vLLM's
    ``compute_global_topk_indices_and_lens``): token t's entries are positions in the compressed
    cache of request ``token_to_req[t]``, as the indexer returns them (-1 = none).

    Parameters
    ----------
    topk_indices : Tensor ``[T, topk]`` int32
    token_to_req : Tensor ``[T]`` int32
        The block-table row of each token; outside ``[0, num_requests)`` (e.g. -1 for CUDA-graph
        padding, ``token_to_req.masked_fill(~is_valid_token, -1)``) is a padding token: row -1,
        length 0, the table is not read for it.
    block_table : Tensor ``[num_requests, max_blocks]`` int32, pages of the compressed cache
    block_size : int, its tokens per page
    slots, lengths : Tensor ``[T, topk]`` / ``[T]`` int32, optional
        Preallocated, contiguous results (CUDA-graph use); allocated when None.

    Returns
    -------
    slots : ``block_table[req, p // block_size] * block_size + p % block_size``, or -1 for a
        negative position, one past the table, on an unassigned page, or past int32.
    lengths : one past the last non-negative entry of each list (for the valid-first lists an
        indexer makes: their number of entries), 0 for a padding token.

    On a GPU one kernel, no host sync: safe inside a captured CUDA graph.
    """
    if slots is None:
        slots = torch.empty(topk_indices.shape, dtype=torch.int32, device=topk_indices.device)
    if lengths is None:
        lengths = torch.empty(topk_indices.shape[:1], dtype=torch.int32, device=topk_indices.device)
    torch.ops.mla_ext.sparse_topk_to_slots.default(topk_indices, token_to_req, block_table, block_size, slots, lengths)
    return slots, lengths


@torch.library.register_kernel("mla_ext::sparse_topk_to_slots", "cpu")
def _sparse_topk_to_slots_cpu(topk_indices, token_to_req, block_table, block_size, slots, lengths):
    _validate_topk_to_slots(topk_indices, token_to_req, block_table, block_size, slots, lengths)
    ref_slots, ref_lengths = reference.sparse_topk_to_slots(topk_indices, token_to_req, block_table, block_size)
    slots.copy_(ref_slots)
    lengths.copy_(ref_lengths)


def _validate_compressed_slots(positions, token_to_req, block_table, block_size, compress_ratio, slot_mapping) -> None:
    check_same_device(_COMPRESSED_SLOTS, positions=positions, token_to_req=token_to_req, block_table=block_table,
                      slot_mapping=slot_mapping)
    _check_int32_param(block_size, "block_size", _COMPRESSED_SLOTS)
    _check_int32_param(compress_ratio, "compress_ratio", _COMPRESSED_SLOTS)
    check_index_dtype(positions, "positions", torch.int64, _COMPRESSED_SLOTS)
    check(positions.dim() == 1, _COMPRESSED_SLOTS, f"positions must be [T], got {list(positions.shape)}")
    num_tokens = positions.shape[0]
    _check_token_to_req_and_table(token_to_req, num_tokens, block_table, _COMPRESSED_SLOTS)
    _check_per_token_out(slot_mapping, "slot_mapping", torch.int64, num_tokens, _COMPRESSED_SLOTS)


def compressed_slot_mapping(
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    compress_ratio: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The slot_mapping of a compressed cache's write (DeepSeek-V4 C4A / C128A layers).

    The token at position p of request ``token_to_req[t]`` completes compressed entry ``c = p //
    compress_ratio`` when ``(p + 1) % compress_ratio == 0``; its compressed row goes to slot
    ``block_table[req, c // block_size] * block_size + c % block_size``. Every other token, a
    padding token (``token_to_req`` outside ``[0, num_requests)``), an entry without a page and a
    slot past int32 get -1, which :func:`concat_and_cache_mla_v4` skips.

    Parameters
    ----------
    positions : Tensor ``[T]`` int64
    token_to_req : Tensor ``[T]`` int32
    block_table : Tensor ``[num_requests, max_blocks]`` int32, pages of the compressed cache
    block_size, compress_ratio : int
    out : Tensor ``[T]`` int64, optional, preallocated and contiguous (CUDA-graph use)

    Returns ``[T]`` int64. On a GPU one kernel, no host sync.
    """
    if out is None:
        out = torch.empty(positions.shape, dtype=torch.int64, device=positions.device)
    torch.ops.mla_ext.compressed_slot_mapping.default(positions, token_to_req, block_table, block_size, compress_ratio, out)
    return out


@torch.library.register_kernel("mla_ext::compressed_slot_mapping", "cpu")
def _compressed_slot_mapping_cpu(positions, token_to_req, block_table, block_size, compress_ratio, slot_mapping):
    _validate_compressed_slots(positions, token_to_req, block_table, block_size, compress_ratio, slot_mapping)
    slot_mapping.copy_(reference.compressed_slot_mapping(positions, token_to_req, block_table, block_size, compress_ratio))
