"""Input checks shared by the Python wrappers, the CPU (reference) registrations and the fakes.

Every message names the argument and what was expected. Only metadata is inspected (shapes,
dtypes, strides, devices), so these run under FakeTensor and torch.compile too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from .formats import DS_MLA_ROW_BYTES, LATENT_DIM

# Checked mode of the ops that take slots or indices (DESIGN.md §2): raise for out-of-range
# entries instead of skipping them / treating them as invalid. Syncs with the GPU.
CHECK_SLOTS_ENV = "MLA_EXT_CHECK_SLOTS"


class MlaInputError(ValueError):
    """Bad input to an mla_ext op (wrong shape, dtype, layout, device or value)."""


def fail(op: str, message: str) -> None:
    raise MlaInputError(f"mla_ext.{op}: {message}")


def check(cond: bool, op: str, message: str) -> None:
    if not cond:
        fail(op, message)


def check_dtype(t: torch.Tensor, name: str, allowed: Sequence[torch.dtype], op: str) -> None:
    if t.dtype not in allowed:
        names = " or ".join(str(d).replace("torch.", "") for d in allowed)
        fail(op, f"{name} must be {names}, got {str(t.dtype).replace('torch.', '')}")


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


def checked_mode(checked: bool | None) -> bool:
    """An op's ``checked`` argument; None means the environment variable ``MLA_EXT_CHECK_SLOTS``
    (set and not "0")."""
    if checked is None:
        return os.environ.get(CHECK_SLOTS_ENV, "0") not in ("", "0")
    return bool(checked)


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


def aligned16(t: torch.Tensor) -> bool:
    """The kernels move 16-byte pieces: the base and every outer stride must be 16-byte aligned."""
    e = t.element_size()
    return t.data_ptr() % 16 == 0 and all((s * e) % 16 == 0 for s in t.stride()[:-1])


def aligned_or_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` when :func:`aligned16`, else a fresh contiguous copy (for rows of a multiple of 16
    bytes, which all the kernels' rows are). Not ``.contiguous()``: that returns an already
    contiguous but misaligned view (e.g. one starting at element 1) unchanged."""
    return t if aligned16(t) else t.clone(memory_format=torch.contiguous_format)


def check_kv_cache_rows(kv_cache: torch.Tensor, kv_cache_dtype: str, fmt: str, scale: torch.Tensor | None,
                        auto_dtype: torch.dtype, auto_dtype_of: str, op: str) -> None:
    """kv_cache ``[num_blocks, block_size, row]`` in canonical format ``fmt`` (DESIGN.md §2): 3-D with
    a contiguous last dim, the format's element type and row width, and the fp8 scale. 'auto'
    stores ``auto_dtype``, the dtype of the tensor named ``auto_dtype_of``. The Python twin of
    ``check_kv_cache`` in csrc/bindings/stable_helpers.h."""
    check(kv_cache.dim() == 3, op, f"kv_cache must be [num_blocks, block_size, row], got {list(kv_cache.shape)}")
    check_last_dim_contiguous(kv_cache, "kv_cache", op)
    if fmt == "auto":
        dtype_name = str(auto_dtype).replace("torch.", "")
        check(kv_cache.dtype == auto_dtype, op,
              f"kv_cache_dtype='auto' needs a kv_cache of {auto_dtype_of}'s dtype {dtype_name}, "
              f"got {str(kv_cache.dtype).replace('torch.', '')}")
        check(kv_cache.shape[2] == LATENT_DIM, op,
              f"kv_cache_dtype='auto' needs rows of {LATENT_DIM} elements, got kv_cache {list(kv_cache.shape)}")
    elif fmt == "fp8":
        check_dtype(kv_cache, "kv_cache", (torch.uint8, torch.float8_e4m3fn), op)
        check(kv_cache.shape[2] == LATENT_DIM, op,
              f"kv_cache_dtype='{kv_cache_dtype}' needs rows of {LATENT_DIM} bytes, got kv_cache {list(kv_cache.shape)}")
        check(scale is not None, op, f"kv_cache_dtype='{kv_cache_dtype}' needs scale (float32 tensor of 1 element)")
        check(scale.dtype == torch.float32 and scale.numel() == 1, op,
              f"scale must be a float32 tensor with one element, got {scale.dtype} {list(scale.shape)}")
    else:
        check_dtype(kv_cache, "kv_cache", (torch.uint8,), op)
        check(kv_cache.shape[2] == DS_MLA_ROW_BYTES, op,
              f"kv_cache_dtype='fp8_ds_mla' needs rows of {DS_MLA_ROW_BYTES} bytes, got kv_cache {list(kv_cache.shape)}")
