"""Input checks shared by the Python wrappers, the CPU (reference) registrations and the fakes.

Every message names the argument and what was expected. Only metadata is inspected (shapes,
dtypes, strides, devices), so these run under FakeTensor and torch.compile too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
