"""Shared test setup: the `gpu` marker skips cleanly without a CUDA GPU, and helpers used by
every op's tests (fresh seeds, comparison with meaningful tolerances)."""

from __future__ import annotations

import zlib

import pytest
import torch

import mla_ext  # noqa: F401  (loads the library and registers the ops)

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """A different but reproducible seed per test: inputs are fresh random data per case. crc32,
    not hash(): PYTHONHASHSEED salts str hashes per process, so a failure could not be replayed."""
    seed = zlib.crc32(request.node.nodeid.encode()) % (2**31)
    torch.manual_seed(seed)
    yield


def assert_close(out: torch.Tensor, ref: torch.Tensor, *, cos_tol: float, atol: float, rtol: float, name: str = "out"):
    """Compare in fp32: inf/NaN in the same places, cosine difference, then abs/rel error."""
    out, ref = out.float(), ref.float()
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out_nan, ref_nan = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(out_nan, ref_nan), f"{name}: NaN in {int(out_nan.sum())} places, reference {int(ref_nan.sum())}"
    out_inf, ref_inf = torch.isinf(out), torch.isinf(ref)
    assert torch.equal(out_inf, ref_inf) and torch.equal(out[out_inf], ref[ref_inf]), f"{name}: inf in different places"
    finite = torch.isfinite(ref)
    o, r = out[finite].double(), ref[finite].double()
    if r.numel() == 0:
        return
    denom = (o * o).sum() + (r * r).sum()
    cos_diff = (1 - 2 * (o * r).sum() / denom).item() if denom > 0 else 0.0
    assert cos_diff <= cos_tol, f"{name}: cosine difference {cos_diff:.3g} > {cos_tol}"
    err = (o - r).abs()
    bad = err > atol + rtol * r.abs()
    assert not bool(bad.any()), (
        f"{name}: {int(bad.sum())}/{r.numel()} elements off; max abs err {err.max().item():.3g} "
        f"(atol {atol}, rtol {rtol})"
    )
