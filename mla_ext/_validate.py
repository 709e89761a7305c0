"""Input checks of the CPU (reference) registrations and the fakes, and of checked mode.

On CUDA the C++ bindings validate (csrc/bindings/); the wrappers call the ops without checking
again, so these checks and the bindings' give the same messages: each names the argument, what
was expected and what it got. Only metadata is inspected (shapes, dtypes, strides, devices), so
these run under FakeTensor and torch.compile too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from .formats import DS_MLA_ROW_BYTES, LATENT_DIM

# Checked mode of the ops that take slots or indices (DESIGN.md §2): raise for out-of-range
# entries instead of skipping them / treating them as invalid. Syncs with the GPU.
CHECK_SLOTS_ENV = "MLA_EXT_CHECK_SLOTS"


class MlaInputError(ValueError, RuntimeError):
    """Bad input to an mla_ext op (wrong shape, dtype, layout, device or value), raised by the CPU
    implementations and the fakes. The CUDA bindings raise RuntimeError with the same message, so
    ``except RuntimeError`` catches bad input on every device."""


def fail(op: str, message: str) -> None:
    raise MlaInputError(f"mla_ext.{op}: {message}")


def check(cond: bool, op: str, message: str) -> None:
    if not cond:
        fail(op, message)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_dtype(t: torch.Tensor, name: str, allowed: Sequence[torch.dtype], op: str, hint: str = "") -> None:
    if t.dtype not in allowed:
        names = " or ".join(dtype_name(d) for d in allowed)
        fail(op, f"{name} must be {names}, got {dtype_name(t.dtype)}{hint}")


def check_index_dtype(t: torch.Tensor, name: str, dtype: torch.dtype, op: str) -> None:
    """Index tensors have one integer type each (block_table, seq_lens, indices, topk_length: int32;
    slot_mapping, positions: int64), as the kernels read them; the message says how to convert
    once per step. The Python twin of check_index_dtype in csrc/bindings/stable_helpers.h."""
    if t.dtype != dtype:
        fail(op, f"{name} must be {dtype_name(dtype)}, got {dtype_name(t.dtype)}: convert once per step with "
                 f"{name}.to(torch.{dtype_name(dtype)})")


def bf16_only_hint(t: torch.Tensor, name: str, kernels: str) -> str:
    """The end of the message refusing an fp16 activation where the kernels are bf16-only."""
    if t.dtype != torch.float16:
        return ""
    return f" (the {kernels} kernels take bfloat16 activations only: convert with {name}.to(torch.bfloat16))"


def check_no_zero_strides(t: torch.Tensor, name: str, op: str) -> None:
    """Outputs written by many CTAs must not alias themselves (an expanded view)."""
    check(all(st != 0 for st, n in zip(t.stride(), t.shape) if n > 1), op,
          f"{name} must not have zero strides (an expanded view), got strides {tuple(t.stride())}")


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {k: v.device for k, v in present.items()}
    first_name, first = next(iter(devices.items()))
    for name, device in devices.items():
        if device != first:
            fail(op, f"all tensors must be on one device: {first_name} is on {first}, {name} is on {device}")


def check_last_dim_contiguous(t: torch.Tensor, name: str, op: str) -> None:
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, f"{name}'s last dim must be contiguous (stride 1), got strides {tuple(t.stride())}")


# os.environ.get of an unset variable costs about a microsecond (a KeyError raised and caught
# inside), on every call of every wrapper; the mapping behind os.environ answers in ~50 ns and is
# kept current by os.environ's own setters (and monkeypatch.setenv).
try:
    _ENV_DATA = os.environ._data  # type: ignore[attr-defined]
    _CHECK_KEY = os.environ.encodekey(CHECK_SLOTS_ENV)  # type: ignore[attr-defined]
    _UNSET = (None, os.environ.encodevalue(""), os.environ.encodevalue("0"))  # type: ignore[attr-defined]
except (AttributeError, TypeError):  # another Python's os.environ
    _ENV_DATA = None


def checked_from_env() -> bool:
    """The environment variable ``MLA_EXT_CHECK_SLOTS`` is set and not "0"."""
    if _ENV_DATA is None:
        return os.environ.get(CHECK_SLOTS_ENV, "0") not in ("", "0")
    return _ENV_DATA.get(_CHECK_KEY) not in _UNSET


def raise_first_out_of_range(op: str, name: str, values: torch.Tensor, bad: torch.Tensor, limit: str,
                             otherwise: str) -> None:
    """Checked mode: IndexError naming the first entry of ``values`` where ``bad`` holds, if any.
    Reads the result on the host (syncs with the GPU), so not for use inside CUDA graphs."""
    if not bool(bad.any()):
        return
    first = tuple(int(i) for i in torch.nonzero(bad)[0])
    where = ", ".join(map(str, first))
    raise IndexError(
        f"mla_ext.{op}: {name}[{where}] = {int(values[first])} is outside {limit}; "
        f"{int(bad.sum())} of {bad.numel()} entries out of range. Without checked mode {otherwise}."
    )


def check_kv_cache_rows(kv_cache: torch.Tensor, kv_cache_dtype: str, fmt: str, scale: torch.Tensor | None,
                        auto_dtype: torch.dtype, auto_dtype_of: str, op: str) -> None:
    """kv_cache ``[num_blocks, block_size, row]`` in canonical format ``fmt`` (DESIGN.md §2): 3-D with
    a contiguous last dim, the format's element type and row width, and the fp8 scale. 'auto'
    stores ``auto_dtype``, the dtype of the tensor named ``auto_dtype_of``. The Python twin of
    ``check_kv_cache`` in csrc/bindings/stable_helpers.h."""
    check(kv_cache.dim() == 3, op, f"kv_cache must be [num_blocks, block_size, row], got {list(kv_cache.shape)}")
    check_last_dim_contiguous(kv_cache, "kv_cache", op)
    if fmt == "auto":
        hint = ""
        if kv_cache.dtype in (torch.uint8, torch.float8_e4m3fn):  # an fp8 cache passed without its format
            hint = (": a uint8 cache of 656-byte rows is fp8_ds_mla, pass kv_cache_dtype='fp8_ds_mla'"
                    if kv_cache.shape[2] == DS_MLA_ROW_BYTES else
                    ": an 8-bit cache of 576-byte rows is fp8, pass kv_cache_dtype='fp8' and its scale")
        check(kv_cache.dtype == auto_dtype, op,
              f"kv_cache_dtype='auto' needs a kv_cache of {auto_dtype_of}'s dtype {dtype_name(auto_dtype)}, "
              f"got {dtype_name(kv_cache.dtype)}{hint}")
        check(kv_cache.shape[2] == LATENT_DIM, op,
              f"kv_cache_dtype='auto' needs rows of {LATENT_DIM} elements, got kv_cache {list(kv_cache.shape)}")
    elif fmt == "fp8":
        check(kv_cache.dtype in (torch.uint8, torch.float8_e4m3fn), op,
              f"kv_cache must be uint8 or float8_e4m3fn for kv_cache_dtype='{kv_cache_dtype}', "
              f"got {dtype_name(kv_cache.dtype)}")
        check(kv_cache.shape[2] == LATENT_DIM, op,
              f"kv_cache_dtype='{kv_cache_dtype}' needs rows of {LATENT_DIM} bytes, got kv_cache {list(kv_cache.shape)}")
        check(scale is not None, op, f"kv_cache_dtype='{kv_cache_dtype}' needs scale (float32 tensor of 1 element)")
        check(scale.dtype == torch.float32 and scale.numel() == 1, op,
              f"scale must be a float32 tensor with one element, got {dtype_name(scale.dtype)} {list(scale.shape)}")
    else:
        check(kv_cache.dtype == torch.uint8, op,
              f"kv_cache must be uint8 for kv_cache_dtype='fp8_ds_mla', got {dtype_name(kv_cache.dtype)}")
        check(kv_cache.shape[2] == DS_MLA_ROW_BYTES, op,
              f"kv_cache_dtype='fp8_ds_mla' needs rows of {DS_MLA_ROW_BYTES} bytes, got kv_cache {list(kv_cache.shape)}")


def check_indices_in_range(op: str, kv_cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None,
                           name: str = "indices", cache_name: str = "the cache") -> None:
    """Checked mode of a sparse decode: entries of ``indices [b, s_q, topk]`` (named ``name``) past
    ``kv_cache`` at counted positions (``< topk_length``) raise IndexError; negative entries (-1
    padding) are allowed. Reads the values (syncs with the GPU)."""
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    num_slots = num_blocks * block_size
    bad = indices >= num_slots
    if topk_length is not None:
        counted = torch.arange(indices.shape[2], device=indices.device).view(1, 1, -1) < topk_length.view(-1, 1, 1)
        bad &= counted
    raise_first_out_of_range(op, name, indices, bad,
                             f"{cache_name} ({num_blocks} blocks x {block_size} = {num_slots} slots)",
                             "such entries are invalid (they contribute nothing)")
