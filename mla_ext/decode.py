"""Dense paged split-KV MLA decode: ``get_decode_plan`` and ``decode_mla``.

A decode step plans once (``get_decode_plan``: seq_lens -> schedule, on the GPU, no host sync)
and every layer reuses the plan; the whole step can be captured in a CUDA graph and replayed
with new ``seq_lens`` values (the plan's shapes only depend on the batch size).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import reference
from ._validate import check, check_dtype, check_index_dtype, check_kv_cache_rows, check_no_zero_strides
from ._validate import check_same_device, checked_from_env, dtype_name, fail
from .formats import CACHE_FORMATS, DS_MLA_ROW_BYTES, KV_LORA_RANK, LATENT_DIM, canonical_format

_OP = "decode_mla"
_PLAN_OP = "decode_plan"
MAX_S_Q = 16
# kv_cache_dtype -> its canonical name (the plan's geometry check is a dict lookup, not a call)
_CANONICAL = {name: canonical_format(name) for name in CACHE_FORMATS}


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
    # fp32 scratch of the split kernels (partial o and lse), sized for this plan; shared by every
    # decode_mla call given the plan. None: each call allocates its own.
    workspace: torch.Tensor | None = None

    def __iter__(self):
        return iter((self.schedule, self.split_info))


def _validate_plan_args(seq_lens, s_q, h_q, kv_cache_dtype, num_sms) -> None:
    """CPU implementation and fake of decode_plan (the binding checks the same on CUDA)."""
    try:
        canonical_format(kv_cache_dtype)
    except ValueError as e:
        fail(_PLAN_OP, str(e))
    check_index_dtype(seq_lens, "seq_lens", torch.int32, _PLAN_OP)
    check(seq_lens.dim() == 1 and 1 <= seq_lens.shape[0] <= reference.DECODE_MAX_BATCH, _PLAN_OP,
          f"seq_lens must be 1-D [b] with 1 <= b <= {reference.DECODE_MAX_BATCH}, got {list(seq_lens.shape)}")
    check(1 <= s_q <= MAX_S_Q, _PLAN_OP, f"s_q must be in [1, {MAX_S_Q}], got {s_q}")
    check(h_q >= 1 and s_q * h_q <= 2**20, _PLAN_OP,
          f"h_q must be >= 1 with s_q * h_q <= 2^20, got s_q {s_q}, h_q {h_q}")
    check(1 <= num_sms <= reference.DECODE_MAX_PARTS, _PLAN_OP,
          f"num_sms must be in [1, {reference.DECODE_MAX_PARTS}], got {num_sms}")


def _check_plan_geometry(plan: DecodePlan, q: torch.Tensor, kv_cache_dtype: str) -> None:
    """The slow path of the wrapper's geometry check: raises when the plan was made for another
    s_q, h_q or format; returns for a q or format the op itself will refuse."""
    if q.dim() != 4 or kv_cache_dtype not in _CANONICAL:
        return
    _, s_q, h_q, _ = q.shape
    fmt = _CANONICAL[kv_cache_dtype]
    check((plan.s_q, plan.h_q, plan.kv_cache_dtype) == (s_q, h_q, fmt), _OP,
          f"plan was made for s_q={plan.s_q}, h_q={plan.h_q}, kv_cache_dtype='{plan.kv_cache_dtype}' but this call "
          f"has s_q={s_q}, h_q={h_q}, kv_cache_dtype='{fmt}': make a plan with get_decode_plan for this geometry")


def _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale,
              schedule=None, split_info=None, out=None, lse=None, workspace=None) -> None:
    """Metadata checks (shapes, dtypes, devices) of the CPU implementation, the fakes and checked
    mode; csrc/bindings/decode.cpp checks the same on CUDA, with the same messages."""
    try:
        fmt = canonical_format(kv_cache_dtype)
    except ValueError as e:
        fail(_OP, str(e))
    check_same_device(_OP, q=q, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens, scale=scale,
                      schedule=schedule, split_info=split_info, workspace=workspace, out=out, lse=lse)
    check(q.dim() == 4 and q.shape[3] == LATENT_DIM, _OP, f"q must be [b, s_q, h_q, {LATENT_DIM}], got {list(q.shape)}")
    b, s_q, h_q, _ = q.shape
    check(1 <= b <= reference.DECODE_MAX_BATCH, _OP,
          f"b (q.shape[0]) must be in [1, {reference.DECODE_MAX_BATCH}], got {b}")
    check(1 <= s_q <= MAX_S_Q, _OP, f"s_q (q.shape[1]) must be in [1, {MAX_S_Q}], got {s_q}")
    check(h_q >= 1 and s_q * h_q <= 2**20, _OP,
          f"h_q (q.shape[2]) must be >= 1 with s_q * h_q <= 2^20, got s_q {s_q}, h_q {h_q}")
    check_dtype(q, "q", (torch.bfloat16, torch.float16), _OP)
    check(q.stride(3) == 1, _OP, f"q's last dim must be contiguous (stride 1), got strides {tuple(q.stride())}")
    check_kv_cache_rows(kv_cache, kv_cache_dtype, fmt, scale, q.dtype, "q", _OP)
    check(kv_cache.shape[1] >= 1, _OP, f"kv_cache's block_size must be >= 1 (and < 2^31), got {list(kv_cache.shape)}")
    check_index_dtype(block_table, "block_table", torch.int32, _OP)
    check(block_table.dim() == 2 and block_table.shape[0] == b and block_table.shape[1] >= 1
          and (block_table.stride(1) == 1 or block_table.shape[1] == 1), _OP,
          f"block_table must be [b={b}, max_blocks >= 1] with a contiguous last dim, got {list(block_table.shape)} "
          f"strides {tuple(block_table.stride())}")
    check_index_dtype(seq_lens, "seq_lens", torch.int32, _OP)
    check(seq_lens.dim() == 1 and seq_lens.shape[0] == b, _OP, f"seq_lens must be [b={b}], got {list(seq_lens.shape)}")
    check((schedule is None) == (split_info is None), _OP,
          "pass schedule and split_info together (both from decode_plan)")
    if schedule is not None:
        fields = reference.DECODE_SCHEDULE_FIELDS
        check(schedule.dtype == torch.int32 and schedule.dim() == 2 and schedule.shape[1] == fields
              and 1 <= schedule.shape[0] <= reference.DECODE_MAX_PARTS, _OP,
              f"schedule must be int32 [num_parts, {fields}] with 1 <= num_parts <= {reference.DECODE_MAX_PARTS}, "
              f"from decode_plan, got {dtype_name(schedule.dtype)} {list(schedule.shape)}")
        check(split_info.dtype == torch.int32 and list(split_info.shape) == [b, reference.DECODE_SPLIT_INFO_FIELDS],
              _OP, f"split_info must be int32 [b={b}, {reference.DECODE_SPLIT_INFO_FIELDS}], from decode_plan for this "
              f"batch, got {dtype_name(split_info.dtype)} {list(split_info.shape)}")
        if workspace is not None:
            if workspace.dim() == 4 and tuple(workspace.shape[1:3]) != (s_q, h_q):
                fail(_OP, f"plan was made for s_q={workspace.shape[1]}, h_q={workspace.shape[2]} but this call has "
                          f"s_q={s_q}, h_q={h_q}: make a plan with get_decode_plan for this geometry")
            need = math.prod(reference.decode_workspace_shape(schedule.shape[0], b, s_q, h_q))
            check(workspace.dtype == torch.float32 and workspace.numel() >= need and workspace.is_contiguous(), _OP,
                  f"workspace must be a contiguous, 16-byte aligned float32 tensor of at least {need} elements "
                  f"(the one get_decode_plan made for this batch, s_q={s_q} and h_q={h_q}), got "
                  f"{dtype_name(workspace.dtype)} {list(workspace.shape)}")
    if out is not None:
        check(out.dtype == q.dtype and list(out.shape) == [b, s_q, h_q, KV_LORA_RANK], _OP,
              f"out must be {dtype_name(q.dtype)} [{b}, {s_q}, {h_q}, {KV_LORA_RANK}], got {dtype_name(out.dtype)} "
              f"{list(out.shape)}")
        check_no_zero_strides(out, "out", _OP)
    if lse is not None:
        check(lse.dtype == torch.float32 and list(lse.shape) == [b, h_q, s_q], _OP,
              f"lse must be float32 [{b}, {h_q}, {s_q}], got {dtype_name(lse.dtype)} {list(lse.shape)}")
        check_no_zero_strides(lse, "lse", _OP)


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


_NUM_SMS: dict[int, int] = {}  # device index -> multiprocessor count


def _num_sms(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _NUM_SMS:
        _NUM_SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _NUM_SMS[index]


def get_decode_plan(
    seq_lens: torch.Tensor,
    s_q: int,
    h_q: int,
    kv_cache_dtype: str = "auto",
    num_sms: int | None = None,
) -> DecodePlan:
    """Plan one decode step: split every request's KV over the SMs (on the GPU, no host sync).

    One small kernel (a block-wide prefix sum of the requests' costs, then each part finds its
    share by binary search), so every part gets an even share of the step's work however the
    lengths vary. Call it once per step, before the layers; it can be captured in a CUDA graph.

    Parameters
    ----------
    seq_lens : Tensor ``[b]`` int32
        Tokens in the cache per request (including the ``s_q`` new ones). ``1 <= b <= 65535``.
        int64 is refused (convert once per step with ``seq_lens.to(torch.int32)``).
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
        blocks of query rows, so fixed for a given model and GPU), ``split_info`` int32
        ``[b, 2]`` (the op's outputs) and ``workspace``, the fp32 scratch of the split kernels
        (``reference.decode_workspace_shape``; the shape records s_q and h_q). Pass it to every
        :func:`decode_mla` call of the step with the same ``s_q``, ``h_q``, format and batch, and
        plan again whenever ``seq_lens`` change (a stale plan covers the old lengths only). The
        calls given one plan share its workspace, so they must run in order (one stream, as the
        layers of a step do); decode steps running at once on several streams need a plan each.
        ``torch.ops.mla_ext.decode_mla`` called directly with a plan for another ``s_q``,
        ``h_q`` or format still computes the right answer (it launches the plan's parts; pass no
        workspace if the plan's is too small), only less evenly balanced; this wrapper refuses
        such a plan.
    """
    if num_sms is None:
        num_sms = _num_sms(seq_lens.device) if seq_lens.is_cuda else 132
    schedule, split_info = torch.ops.mla_ext.decode_plan.default(seq_lens, s_q, h_q, kv_cache_dtype, num_sms)
    # The split kernels' scratch, once per step for every layer (not an output of the op: its
    # values are undefined).
    workspace = torch.empty(reference.decode_workspace_shape(schedule.shape[0], split_info.shape[0], s_q, h_q),
                            dtype=torch.float32, device=seq_lens.device)
    return DecodePlan(schedule, split_info, s_q, h_q, _CANONICAL[kv_cache_dtype], workspace)


# Eager calls go straight to the overloads' C++ entry point (``_op``, what OpOverload.__call__
# forwards to): one Python frame less, 0.3-0.7 us of a ~15 us call on the H200's host.
# torch.compile cannot trace that builtin, so compiled code calls the overloads.
_decode_op = torch.ops.mla_ext.decode_mla.default
# With a plan, causal, no scale, not forced portable, format 'auto' or 'fp8_ds_mla' (the cache's own
# for this overload): the 8 arguments that change between calls (every one passed costs 0.3-0.7 us
# of host time, and even those left at their defaults cost some).
_planned_op = torch.ops.mla_ext.decode_mla.planned
_PLANNED_FORMATS = ("auto", "fp8_ds_mla")
_decode_out_op = torch.ops.mla_ext.decode_mla_out.default


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
        Latent queries: absorbed ``q_nope`` (512) then roped ``q_pe`` (64). s_q in 1..16. Last dim
        contiguous; rows not 16-byte aligned (e.g. a view at an odd offset) are copied first.
    kv_cache : Tensor ``[num_blocks, block_size, row]``
        ``auto``: q's dtype, row 576; ``fp8``/``fp8_e4m3``: uint8 or float8_e4m3fn, row 576
        (with ``scale``); ``fp8_ds_mla``: uint8, row 656. Any ``block_size >= 1``; padded pages ok.
    block_table : Tensor ``[b, max_blocks]`` int32
        Request i's position ``pos`` is row ``pos % block_size`` of page ``block_table[i, pos // block_size]``.
        int64 is refused (convert once per step with ``block_table.to(torch.int32)``).
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
        From :func:`get_decode_plan` (same s_q, h_q, format, batch); planned here if omitted
        (a plan per call: an engine plans once per step and passes it to every layer).
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

    Bad input raises ``RuntimeError`` naming the argument (on CPU its subclass
    :class:`MlaInputError`). With a plan, the call does no work on the host beyond the op's own
    checks and the allocation of out and lse.

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
    # The op validates everything else (C++ on CUDA, _validate on CPU), the plan's s_q and h_q
    # included (its workspace's shape records them); only the format it was made for is Python
    # metadata. The engine's call (a plan of this format, no out / lse, unchecked) takes the first
    # branch, with as few Python steps as it can: they cost as much host time as the kernel launch.
    compiling = torch.compiler.is_dynamo_compiling()
    if plan is not None and out is None and lse is None:
        workspace, fmt = plan.workspace, plan.kv_cache_dtype
        # (the overload takes the cache's format as the call's only when the two agree: uint8 is
        # fp8_ds_mla; a cache that contradicts kv_cache_dtype goes on to the default overload's error)
        if (workspace is not None and causal and scale is None and not force_portable
                and kv_cache_dtype in _PLANNED_FORMATS and (kv_cache_dtype == fmt or fmt is None)
                and (kv_cache.dtype == torch.uint8) == (kv_cache_dtype == "fp8_ds_mla") and not checked
                and (checked is not None or not checked_from_env())):
            op = _planned_op if compiling else _planned_op._op
            return op(q, kv_cache, block_table, seq_lens, softmax_scale, plan.schedule, plan.split_info, workspace)
    if plan is None:
        schedule = split_info = workspace = None
    else:
        schedule, split_info, workspace = plan.schedule, plan.split_info, plan.workspace
        if plan.kv_cache_dtype is not None and (workspace is None or _CANONICAL.get(
                kv_cache_dtype, plan.kv_cache_dtype) != plan.kv_cache_dtype):
            _check_plan_geometry(plan, q, kv_cache_dtype)
    if checked or (checked is None and checked_from_env()):
        _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                  split_info, out, lse, workspace)
        _check_values(kv_cache, block_table, seq_lens)
    if out is None and lse is None:
        op = _decode_op if compiling else _decode_op._op
        return op(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
                  force_portable, workspace)
    if q.dim() != 4:  # (the caller passed one of out / lse: the other is made here, from q's shape)
        _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale)
    if out is None:
        out = q.new_empty(q.shape[0], q.shape[1], q.shape[2], KV_LORA_RANK)
    if lse is None:
        lse = q.new_empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    op = _decode_out_op if compiling else _decode_out_op._op
    op(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
       force_portable, out, lse, workspace)
    return out, lse


# ---- CPU implementations (the reference) and fakes ------------------------------------------


@torch.library.register_kernel("mla_ext::decode_plan", "cpu")
def _decode_plan_cpu(seq_lens, s_q, h_q, kv_cache_dtype, num_sms):
    _validate_plan_args(seq_lens, s_q, h_q, kv_cache_dtype, num_sms)
    return reference.decode_plan(seq_lens, s_q, h_q, num_sms, kv_cache_dtype)


@torch.library.register_fake("mla_ext::decode_plan")
def _decode_plan_fake(seq_lens, s_q, h_q, kv_cache_dtype, num_sms):
    _validate_plan_args(seq_lens, s_q, h_q, kv_cache_dtype, num_sms)
    return (seq_lens.new_empty(reference.decode_num_parts(num_sms, s_q, h_q, kv_cache_dtype),
                               reference.DECODE_SCHEDULE_FIELDS),
            seq_lens.new_empty(seq_lens.shape[0], reference.DECODE_SPLIT_INFO_FIELDS))


def _reference_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                   split_info, out=None, lse=None, workspace=None):
    _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
              out, lse, workspace)
    # Like the CUDA kernel: positions without a valid page are skipped; checked mode (the
    # wrapper's `checked`) raises for them instead. (The workspace is the CUDA kernels' scratch.)
    return reference.decode_mla(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale)


@torch.library.register_kernel("mla_ext::decode_mla", "cpu")
def _decode_mla_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale=None,
                    schedule=None, split_info=None, force_portable=False, workspace=None):
    return _reference_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                          split_info, workspace=workspace)


def _planned_format(kv_cache: torch.Tensor) -> str:
    """decode_mla.planned's cache format, the cache's own: uint8 rows of 656 bytes fp8_ds_mla, a
    16-bit cache 'auto' (as csrc/bindings/decode.cpp decides)."""
    if kv_cache.dtype == torch.uint8 and kv_cache.dim() == 3 and kv_cache.shape[2] == DS_MLA_ROW_BYTES:
        return "fp8_ds_mla"
    if kv_cache.dtype in (torch.uint8, torch.float8_e4m3fn):
        fail(_OP, f"the planned overload takes a 16-bit cache ('auto') or an fp8_ds_mla one (uint8, rows of "
                  f"{DS_MLA_ROW_BYTES} bytes), got {dtype_name(kv_cache.dtype)} {list(kv_cache.shape)}: for an fp8 "
                  f"cache call decode_mla with kv_cache_dtype='fp8' and its scale")
    return "auto"


@torch.library.register_kernel("mla_ext::decode_mla.planned", "cpu")
def _decode_mla_planned_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, schedule, split_info, workspace):
    return _reference_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, _planned_format(kv_cache), True, None,
                          schedule, split_info, workspace=workspace)


@torch.library.register_kernel("mla_ext::decode_mla_out", "cpu")
def _decode_mla_out_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                        split_info, force_portable, out, lse, workspace=None):
    o, l_ = _reference_cpu(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                           split_info, out, lse, workspace)
    out.copy_(o)
    lse.copy_(l_)


@torch.library.register_fake("mla_ext::decode_mla")
def _decode_mla_fake(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale=None,
                     schedule=None, split_info=None, force_portable=False, workspace=None):
    _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
              workspace=workspace)
    b, s_q, h_q, _ = q.shape
    return q.new_empty(b, s_q, h_q, KV_LORA_RANK), q.new_empty(b, h_q, s_q, dtype=torch.float32)


@torch.library.register_fake("mla_ext::decode_mla.planned")
def _decode_mla_planned_fake(q, kv_cache, block_table, seq_lens, softmax_scale, schedule, split_info, workspace):
    return _decode_mla_fake(q, kv_cache, block_table, seq_lens, softmax_scale, _planned_format(kv_cache), True, None,
                            schedule, split_info, False, workspace)


@torch.library.register_fake("mla_ext::decode_mla_out")
def _decode_mla_out_fake(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule,
                         split_info, force_portable, out, lse, workspace=None):
    _validate(q, kv_cache, block_table, seq_lens, softmax_scale, kv_cache_dtype, causal, scale, schedule, split_info,
              out, lse, workspace)
