"""Dense paged split-KV MLA decode: ``get_decode_plan`` and ``decode_mla``.

A decode step plans once (``get_decode_plan``: seq_lens -> schedule, on the GPU, no host sync)
and every layer reuses the plan; the whole step can be captured in a CUDA graph and replayed
with new ``seq_lens`` values (the plan's shapes only depend on the batch size).
"""

from __future__ import annotations

import dataclasses

import torch

from . import reference
from ._validate import aligned_or_copy, check, check_dtype, check_kv_cache_rows, check_same_device, checked_mode, fail
from .formats import KV_LORA_RANK, LATENT_DIM, canonical_format

_OP = "decode_mla"
_PLAN_OP = "decode_plan"
MAX_S_Q = 16


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """Schedule of one decode step (see :func:`get_decode_plan`). Unpacks as
    ``schedule, split_info``. The geometry it was made for is kept so that :func:`decode_mla`
    can refuse a plan of another ``s_q``, ``h_q`` or format (which would compute the right
    answer, but with the work balanced for another shape)."""

    schedule: torch.Tensor  # int32 [num_parts, 8]
    split_info: torch.Tensor  # int32 [b, 2]
    s_q: int | None = None
    h_q: int | None = None
    kv_cache_dtype: str | None = None  # canonical format name

    def __iter__(self):
        return iter((self.schedule, self.split_info))


def _validate_plan_args(seq_lens, s_q, h_q, kv_cache_dtype, num_sms) -> None:
    try:
        canonical_format(kv_cache_dtype)
    except ValueError as e:
        fail(_PLAN_OP, str(e))
    check_dtype(seq_lens, "seq_lens", (torch.int32,), _PLAN_OP)
    check(seq_lens.dim() == 1 and seq_lens.shape[0] >= 1, _PLAN_OP,
          f"seq_lens must be 1-D [b] with b >= 1, got {list(seq_lens.shape)}")
    check(1 <= s_q <= MAX_S_Q, _PLAN_OP, f"s_q must be in [1, {MAX_S_Q}], got {s_q}")
    check(h_q >= 1, _PLAN_OP, f"h_q must be >= 1, got {h_q}")
    check(1 <= num_sms <= 4096, _PLAN_OP, f"num_sms must be in [1, 4096], got {num_sms}")


def _check_plan_geometry(plan: DecodePlan, q: torch.Tensor, kv_cache_dtype: str) -> None:
    if plan.s_q is None:
        return  # built by hand from a schedule and split_info: only their shapes can be checked
    _, s_q, h_q, _ = q.shape
    fmt = canonical_format(kv_cache_dtype)
    check((plan.s_q, plan.h_q, plan.kv_cache_dtype) == (s_q, h_q, fmt), _OP,
          f"plan was made for s_q={plan.s_q}, h_q={plan.h_q}, kv_cache_dtype='{plan.kv_cache_dtype}' but this call "
          f"has s_q={s_q}, h_q={h_q}, kv_cache_dtype='{fmt}': make a plan with get_decode_plan for this geometry")


def _check_no_zero_strides(t: torch.Tensor, name: str) -> None:
    """Output buffers must not alias themselves (an expanded tensor would have many CTAs write
    one element)."""
    check(all(st != 0 for st, n in zip(t.stride(), t.shape) if n > 1), _OP,
          f"{name} must not have zero strides (an expanded view), got strides {tuple(t.stride())}")


def _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale,
              schedule=None, split_info=None, out=None, lse=None) -> None:
    """Metadata checks (shapes, dtypes, devices); the C++ binding repeats them on CUDA."""
    try:
        fmt = canonical_format(kv_cache_dtype)
    except ValueError as e:
        fail(_OP, str(e))
    check_same_device(_OP, q=q, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens, scale=scale,
                      schedule=schedule, split_info=split_info, out=out, lse=lse)
    check(q.dim() == 4 and q.shape[3] == LATENT_DIM, _OP, f"q must be [b, s_q, h_q, {LATENT_DIM}], got {list(q.shape)}")
    b, s_q, h_q, _ = q.shape
    check(b >= 1, _OP, "q must hold at least one request (b >= 1)")
    check(1 <= s_q <= MAX_S_Q, _OP, f"s_q (q.shape[1]) must be in [1, {MAX_S_Q}], got {s_q}")
    check(h_q >= 1, _OP, f"h_q (q.shape[2]) must be >= 1, got {h_q}")
    check_dtype(q, "q", (torch.bfloat16, torch.float16), _OP)
    check(q.stride(3) == 1, _OP, f"q's last dim must be contiguous (stride 1), got strides {tuple(q.stride())}")
    check_kv_cache_rows(kv_cache, kv_cache_dtype, fmt, scale, q.dtype, "q", _OP)
    check(kv_cache.shape[1] >= 1, _OP, f"kv_cache's block_size must be >= 1, got {list(kv_cache.shape)}")
    check_dtype(block_table, "block_table", (torch.int32,), _OP)
    check(block_table.dim() == 2 and block_table.shape[0] == b and block_table.shape[1] >= 1, _OP,
          f"block_table must be [b={b}, max_blocks >= 1], got {list(block_table.shape)}")
    check(block_table.stride(1) == 1 or block_table.shape[1] == 1, _OP, "block_table's last dim must be contiguous")
    check_dtype(seq_lens, "seq_lens", (torch.int32,), _OP)
    check(seq_lens.dim() == 1 and seq_lens.shape[0] == b, _OP, f"seq_lens must be [b={b}], got {list(seq_lens.shape)}")
    check((schedule is None) == (split_info is None), _OP, "pass schedule and split_info together (a DecodePlan)")
    if schedule is not None:
        check(schedule.dtype == torch.int32 and schedule.dim() == 2 and schedule.shape[1] == reference.DECODE_SCHEDULE_FIELDS
              and 1 <= schedule.shape[0] <= 4096,
              _OP, f"schedule must be int32 [num_parts, {reference.DECODE_SCHEDULE_FIELDS}] from get_decode_plan, "
              f"got {schedule.dtype} {list(schedule.shape)}")
        check(split_info.dtype == torch.int32 and list(split_info.shape) == [b, reference.DECODE_SPLIT_INFO_FIELDS],
              _OP, f"split_info must be int32 [b={b}, {reference.DECODE_SPLIT_INFO_FIELDS}] from get_decode_plan "
              f"(a plan for this batch), got {split_info.dtype} {list(split_info.shape)}")
    if out is not None:
        check(out.dtype == q.dtype and list(out.shape) == [b, s_q, h_q, KV_LORA_RANK], _OP,
              f"out must be {q.dtype} [{b}, {s_q}, {h_q}, {KV_LORA_RANK}], got {out.dtype} {list(out.shape)}")
        _check_no_zero_strides(out, "out")
    if lse is not None:
        check(lse.dtype == torch.float32 and list(lse.shape) == [b, h_q, s_q], _OP,
              f"lse must be float32 [{b}, {h_q}, {s_q}], got {lse.dtype} {list(lse.shape)}")
        _check_no_zero_strides(lse, "lse")


def _check_values(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Checked mode: every position below seq_lens must have a page in the table and in the cache
    (reads the values, so it syncs with the GPU; not for CUDA graphs)."""
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    max_blocks = block_table.shape[1]
    lens = seq_lens.long()
    if bool((lens < 0).any()):
        i = int(torch.nonzero(lens < 0)[0])
        raise IndexError(f"mla_ext.{_OP}: seq_lens[{i}] = {int(lens[i])} is negative")
    pages_needed = (lens + block_size - 1) // block_size
    over = pages_needed > max_blocks
    if bool(over.any()):
        i = int(torch.nonzero(over)[0])
        raise IndexError(
            f"mla_ext.{_OP}: seq_lens[{i}] = {int(lens[i])} needs {int(pages_needed[i])} pages of {block_size} "
            f"but block_table has only {max_blocks} per request")
    used = torch.arange(max_blocks, device=block_table.device)[None, :] < pages_needed[:, None]
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    if bool(bad.any()):
        i, j = (int(x) for x in torch.nonzero(bad)[0])
        raise IndexError(
            f"mla_ext.{_OP}: block_table[{i}, {j}] = {int(block_table[i, j])} is outside the cache "
            f"({num_blocks} blocks) but request {i} uses it")


def get_decode_plan(
    seq_lens: torch.Tensor,
    s_q: int,
    h_q: int,
    kv_cache_dtype: str = "auto",
    num_sms: int | None = None,
) -> DecodePlan:
    """Plan one decode step: split every request's KV over the SMs (on the GPU, no host sync).

    Parameters
    ----------
    seq_lens : Tensor ``[b]`` int32
        Tokens in the cache per request (including the ``s_q`` new ones).
    s_q, h_q : int
        Queries per request (1..16) and query heads of the decode calls that use this plan.
    kv_cache_dtype : str
        Cache format of those calls.
    num_sms : int, optional
        SMs to plan for; default: the device's multiprocessor count (CPU: 132).

    Returns
    -------
    DecodePlan
        ``schedule`` int32 ``[num_parts, 8]`` (``num_parts``: ``num_sms`` divided among the
        blocks of query rows, so fixed for a given model and GPU) and ``split_info`` int32
        ``[b, 2]``. Pass it to every :func:`decode_mla` call of the step with the same ``s_q``,
        ``h_q``, format and batch, and plan again whenever ``seq_lens`` change (a stale plan
        covers the old lengths only). ``torch.ops.mla_ext.decode_mla`` called directly with a
        plan for another ``s_q``, ``h_q`` or format still computes the right answer (it launches
        the plan's parts), only less evenly balanced; this wrapper refuses such a plan.
    """
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(seq_lens.device).multi_processor_count \
            if seq_lens.is_cuda else 132
    _validate_plan_args(seq_lens, s_q, h_q, kv_cache_dtype, num_sms)
    schedule, split_info = torch.ops.mla_ext.decode_plan(seq_lens, s_q, h_q, kv_cache_dtype, num_sms)
    return DecodePlan(schedule, split_info, s_q, h_q, canonical_format(kv_cache_dtype))


def decode_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    kv_cache_dtype: str = "auto",
    causal: bool = True,
    scale: torch.Tensor | None = None,
    *,
    plan: DecodePlan | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    force_portable: bool = False,
    checked: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA decode over the latent cache (MQA: one KV head shared by all query heads).

    Parameters
    ----------
    q : Tensor ``[b, s_q, h_q, 576]`` bfloat16 or float16
        Latent queries: absorbed ``q_nope`` (512) then roped ``q_pe`` (64). s_q in 1..16.
    kv_cache : Tensor ``[num_blocks, block_size, row]``
        ``auto``: q's dtype, row 576; ``fp8``/``fp8_e4m3``: uint8 or float8_e4m3fn, row 576
        (with ``scale``); ``fp8_ds_mla``: uint8, row 656. Any ``block_size >= 1``; padded pages ok.
    block_table : Tensor ``[b, max_blocks]`` int32
        Request i's position ``pos`` is row ``pos % block_size`` of page ``block_table[i, pos // block_size]``.
    seq_lens : Tensor ``[b]`` int32
        Cached tokens per request, the ``s_q`` new ones last. 0 is allowed (out 0, lse -inf).
    softmax_scale : float
        Of the un-absorbed head: ``1/sqrt(192)`` (times mscale**2 for YaRN).
    kv_cache_dtype : str
        ``'auto'``, ``'fp8'``, ``'fp8_e4m3'`` or ``'fp8_ds_mla'``.
    causal : bool
        Query j of request i sees positions ``0 .. seq_lens[i] - s_q + j``; else all.
    scale : Tensor ``[1]`` float32, optional
        Per-tensor scale of the ``fp8`` cache.
    plan : DecodePlan, optional
        From :func:`get_decode_plan` (same s_q, h_q, format, batch); planned here if omitted.
    out : Tensor ``[b, s_q, h_q, 512]``, q's dtype, optional
        Written in place and returned.
    lse : Tensor ``[b, h_q, s_q]`` float32, optional
        Written in place and returned.
    force_portable : bool
        Run the portable (mma.sync) kernel even where an architecture-specific one exists (also
        ``MLA_EXT_FORCE_PORTABLE=1``).
    checked : bool, optional
        Raise ``IndexError`` when a position below ``seq_lens`` has no valid page (syncs; default
        from ``MLA_EXT_CHECK_SLOTS``). Unchecked, such positions are skipped (not attended).

    Returns
    -------
    out : Tensor ``[b, s_q, h_q, 512]`` in q's dtype
    lse : Tensor ``[b, h_q, s_q]`` float32, natural log; -inf where nothing was attended

    Examples
    --------
    >>> import torch, mla_ext
    >>> cache = torch.randn(8, 64, 576, dtype=torch.bfloat16)
    >>> q = torch.randn(2, 1, 16, 576, dtype=torch.bfloat16)
    >>> block_table = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    >>> seq_lens = torch.tensor([100, 256], dtype=torch.int32)
    >>> plan = mla_ext.get_decode_plan(seq_lens, s_q=1, h_q=16)
    >>> out, lse = mla_ext.decode_mla(q, cache, block_table, seq_lens, 192 ** -0.5, plan=plan)
    """
    if q.dim() == 4 and q.stride(-1) == 1 and q.is_cuda:
        q = aligned_or_copy(q)  # the kernel reads 16-byte aligned query rows
    schedule, split_info = (plan.schedule, plan.split_info) if plan is not None else (None, None)
    if plan is not None and q.dim() == 4:
        _check_plan_geometry(plan, q, kv_cache_dtype)
    _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale,
              schedule, split_info, out, lse)
    if checked_mode(checked):
        _check_values(kv_cache, block_table, seq_lens)
    if out is None and lse is None:
        return torch.ops.mla_ext.decode_mla(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal,
                                            scale, schedule, split_info, force_portable)
    b, s_q, h_q, _ = q.shape
    if out is None:
        out = q.new_empty(b, s_q, h_q, KV_LORA_RANK)
    if lse is None:
        lse = q.new_empty(b, h_q, s_q, dtype=torch.float32)
    torch.ops.mla_ext.decode_mla_out(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale,
                                     schedule, split_info, force_portable, out, lse)
    return out, lse


# ---- CPU implementations (the reference) and fakes ------------------------------------------


@torch.library.register_kernel("mla_ext::decode_plan", "cpu")
def _decode_plan_cpu(seq_lens, s_q, h_q, kv_cache_dtype, num_sms):
    _validate_plan_args(seq_lens, s_q, h_q, kv_cache_dtype, num_sms)
    return reference.decode_plan(seq_lens, s_q, h_q, num_sms)


@torch.library.register_fake("mla_ext::decode_plan")
def _decode_plan_fake(seq_lens, s_q, h_q, kv_cache_dtype, num_sms):
    _validate_plan_args(seq_lens, s_q, h_q, kv_cache_dtype, num_sms)
    return (seq_lens.new_empty(reference.decode_num_parts(num_sms, s_q, h_q), reference.DECODE_SCHEDULE_FIELDS),
            seq_lens.new_empty(seq_lens.shape[0], reference.DECODE_SPLIT_INFO_FIELDS))


def _reference_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                   split_info, out=None, lse=None):
    _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
              out, lse)
    # Like the CUDA kernel: positions without a valid page are skipped; checked mode (the
    # wrapper's `checked`) raises for them instead.
    return reference.decode_mla(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale)


@torch.library.register_kernel("mla_ext::decode_mla", "cpu")
def _decode_mla_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale=None,
                    schedule=None, split_info=None, force_portable=False):
    return _reference_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                          split_info)


@torch.library.register_kernel("mla_ext::decode_mla_out", "cpu")
def _decode_mla_out_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                        split_info, force_portable, out, lse):
    o, l_ = _reference_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                           split_info, out, lse)
    out.copy_(o)
    lse.copy_(l_)


@torch.library.register_fake("mla_ext::decode_mla")
def _decode_mla_fake(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale=None,
                     schedule=None, split_info=None, force_portable=False):
    _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info)
    b, s_q, h_q, _ = q.shape
    return q.new_empty(b, s_q, h_q, KV_LORA_RANK), q.new_empty(b, h_q, s_q, dtype=torch.float32)
