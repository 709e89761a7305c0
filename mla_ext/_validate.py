"""Input checks shared by the Python wrappers, the CPU (reference) registrations and the fakes.

Every message names the argument and what was expected. Only metadata is inspected (shapes,
dtypes, strides, devices), so these run under FakeTensor and torch.compile too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .formats import DS_MLA_ROW_BYTES, LATENT_DIM


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


def check_kv_cache_rows(kv_cache: torch.Tensor, kv_cache_dtype: str, fmt: str, scale: torch.Tensor | None,
                        op: str) -> None:
    """The cache's element type and row width for its format (DESIGN.md §2), and the fp8 scale.
    ``fmt`` is the canonical format; the 'auto' dtype (the activations') is checked by the caller."""
    if fmt == "auto":
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
