"""Loads the compiled library, which registers the ``torch.ops.mla_ext`` schemas and their CUDA
kernels (stable ABI: one build loads into torch >= 2.11)."""

from __future__ import annotations

import glob
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find_library() -> str:
    candidates = sorted(glob.glob(os.path.join(_HERE, "_C*.so")))
    if not candidates:
        raise ImportError(
            f"mla_ext: the compiled library (_C*.so) is not in {_HERE}. Build it with "
            "`pip install --no-build-isolation -e .` (or `python setup.py build_ext --inplace`) "
            "from the repository root; see README.md."
        )
    return candidates[0]


LIBRARY_PATH = _find_library()
torch.ops.load_library(LIBRARY_PATH)


def set_force_portable(mode: int) -> None:
    """Force the portable kernels (mode 1), the architecture-specific ones where they exist (0),
    or go back to the ``MLA_EXT_FORCE_PORTABLE`` environment variable's value (-1). Process-wide;
    for tests and benchmarks that run both paths in one process."""
    import ctypes

    ctypes.CDLL(LIBRARY_PATH).mla_ext_set_force_portable(ctypes.c_int(mode))


def force_portable() -> bool:
    """Whether ops take the portable kernels now (set_force_portable, else the environment)."""
    import ctypes

    return bool(ctypes.CDLL(LIBRARY_PATH).mla_ext_force_portable())
