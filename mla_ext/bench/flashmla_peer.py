"""FlashMLA as the benchmarks' peer (DESIGN.md §5): timed in the same process, on the same inputs.

The peer is FlashMLA (deepseek-ai/FlashMLA) at 9241ae3, built from source on the GPU it is timed
on. It is not part of this repository and is never committed: with ``build_flashmla.sh`` and
``flashmla-9241ae3.tar.xz`` in ``third_party_peers/`` (a git-ignored folder; any build of upstream
FlashMLA at that commit with its own ``setup.py`` serves as well)

    bash third_party_peers/build_flashmla.sh /tmp/flashmla      # ~2 minutes
    python bench/bench_decode.py --flashmla /tmp/flashmla ...

``--flashmla DIR`` puts DIR first on ``sys.path`` and imports ``flash_mla`` from it; without it a
``flash_mla`` that is importable already (e.g. through PYTHONPATH) is used. Its Python API:
``get_mla_metadata()`` returns an empty scheduler-metadata object that the first
``flash_mla_with_kvcache`` call fills; it is reused only for calls with the same shapes and
lengths (one per decode step), so it is made here once per case, outside any timed graph.

When FlashMLA cannot be imported, or the GPU is not one it runs the op on, ``status()`` says why
("peer not available: ...") and the benchmarks print that and leave the peer's columns empty; a
peer call that fails anyway is reported by ``attempt()``, never raised into the benchmark.

What it covers: dense decode of a bf16 (or fp16) cache with 64-token pages, any h_q (sm90 only),
and sparse decode of an fp8_ds_mla cache with 64 or 128 heads (sm90, sm100); an engine pads other
head counts to 64 (``pad_heads``). Its lse is +inf, not -inf, for a query with nothing to attend
to: ``lse_as_mla_ext`` maps it before comparing.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

import torch

NAME = "FlashMLA 9241ae3"  # what the results' "peer" field says
V_DIM = 512

_state: dict = {}

# GPU architectures FlashMLA runs each op on (dense: sm90a kernels; sparse: sm90a and sm100).
_ARCHS = {"dense": ((9, 0),), "sparse": ((9, 0), (10, 0))}


def load(path: str | None = None) -> str:
    """Import FlashMLA (from ``path``, put first on sys.path, when given) and return the status
    line: "FlashMLA 9241ae3 (<where>)" or "peer not available: <why>". Never raises."""
    _state.clear()
    where = "no --flashmla DIR given, from sys.path"
    try:
        if path:
            path = where = os.path.abspath(path)
            if not os.path.isdir(os.path.join(path, "flash_mla")):
                raise ImportError(f"{path} has no flash_mla/ (build it there with "
                                  f"`bash third_party_peers/build_flashmla.sh {path}`)")
            if path not in sys.path:
                sys.path.insert(0, path)
        module = importlib.import_module("flash_mla")
        for fn in ("get_mla_metadata", "flash_mla_with_kvcache"):
            if not callable(getattr(module, fn, None)):
                raise ImportError(f"flash_mla has no {fn}()")
        _state["module"] = module
        _state["status"] = f"{NAME} ({os.path.dirname(os.path.dirname(os.path.abspath(module.__file__)))})"
    except Exception as e:  # an import of a foreign build can fail in many ways (ABI, CUDA, missing .so)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        _state["module"] = None
        _state["status"] = f"peer not available: cannot import flash_mla ({where}): {msg}"
    return _state["status"]


def status() -> str:
    """The status line of the last ``load`` (loading from the default place if none ran yet)."""
    if "status" not in _state:
        load(None)
    return _state["status"]


def available() -> bool:
    status()
    return _state.get("module") is not None


def describe(op: str) -> str:
    """What the results' "peer" field says: NAME, or NAME and why it did not run ``op``."""
    return NAME if supports(op) else f"{NAME}: {why_not(op)}"


def supports(op: str) -> bool:
    """FlashMLA is loaded and this GPU is one it runs ``op`` ("dense" or "sparse") on."""
    return available() and torch.cuda.is_available() and torch.cuda.get_device_capability() in _ARCHS[op]


def why_not(op: str) -> str:
    """Why ``supports(op)`` is False ("" when it is True)."""
    if not available():
        return status()
    if not torch.cuda.is_available():
        return "peer not available: no CUDA GPU"
    if torch.cuda.get_device_capability() not in _ARCHS[op]:
        cap = "sm%d%d" % torch.cuda.get_device_capability()
        archs = ", ".join("sm%d%d" % a for a in _ARCHS[op])
        return f"peer not available: FlashMLA runs {op} decode on {archs}, not {cap}"
    return ""


def attempt(what: str, fn: Callable[[], object]):
    """``fn()``, or None with the error printed when the peer call fails (an unsupported shape, a
    GPU the build lacks): a peer must never stop mla_ext's benchmark."""
    try:
        return fn()
    except Exception as e:  # RuntimeError, AssertionError (its wrapper asserts), torch.AcceleratorError
        print(f"FlashMLA peer: {what}: not run ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        return None


def dense(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
          softmax_scale: float, causal: bool) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """FlashMLA dense decode over a bf16 cache ``[num_blocks, 64, 576]``: runs it once (which fills
    its scheduler metadata, as an engine plans once per step) and returns a function that runs it
    again with that metadata, giving ``(out [b, s_q, h_q, 512], lse [b, h_q, s_q])``."""
    fm = _state["module"]
    kv = kv_cache.unsqueeze(2)  # [num_blocks, page, 1 kv head, 576]
    meta, _ = fm.get_mla_metadata()

    def run():
        return fm.flash_mla_with_kvcache(q, kv, block_table, seq_lens, V_DIM, meta, None, softmax_scale, causal)

    run()
    return run


def sparse(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
           topk_length: torch.Tensor | None = None) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """FlashMLA sparse decode over an fp8_ds_mla cache ``[num_blocks, page, 656]`` (uint8; whole
    pages contiguous) with ``indices [b, s_q, topk]`` global slots: returns a function as ``dense``
    does. q's head count must be 64 or 128 (see ``pad_heads``)."""
    fm = _state["module"]
    kv = kv_cache.unsqueeze(2)  # [num_blocks, page, 1, 656]
    meta, _ = fm.get_mla_metadata()

    def run():
        return fm.flash_mla_with_kvcache(q, kv, None, None, V_DIM, meta, None, softmax_scale, False, True, indices,
                                         None, None, None, topk_length)

    run()
    return run


def sparse_v4(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
              extra_kv_cache: torch.Tensor, extra_indices: torch.Tensor,
              extra_topk_length: torch.Tensor | None) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """FlashMLA's DeepSeek-V4 ("MODEL1") sparse decode: q ``[b, s_q, 64 or 128, 512]``, two
    fp8_ds_mla V4 caches ``[num_blocks, page, 584]`` (uint8, pages padded to multiples of 576
    bytes, as mla_ext.formats.empty_kv_cache_v4 makes them) with their index lists: returns a
    function as ``dense`` does."""
    fm = _state["module"]
    kv, extra = kv_cache.unsqueeze(2), extra_kv_cache.unsqueeze(2)  # [num_blocks, page, 1, 584]
    meta, _ = fm.get_mla_metadata()

    def run():
        return fm.flash_mla_with_kvcache(q, kv, None, None, V_DIM, meta, None, softmax_scale, False, True, indices,
                                         None, extra, extra_indices, None, extra_topk_length)

    run()
    return run


def pad_heads(q: torch.Tensor, heads: int) -> torch.Tensor:
    """q ``[b, s_q, h_q, d]`` with zero heads appended up to ``heads`` (as an engine pads for FlashMLA)."""
    b, s_q, h_q, d = q.shape
    return q if h_q == heads else torch.cat([q, q.new_zeros(b, s_q, heads - h_q, d)], dim=2).contiguous()


def peer_heads(h_q: int) -> int:
    """The head count FlashMLA's sparse decode runs for h_q query heads: 64 or 128."""
    return 64 if h_q <= 64 else 128


def lse_as_mla_ext(lse: torch.Tensor) -> torch.Tensor:
    """FlashMLA's lse with +inf (nothing attended) as -inf, mla_ext's convention."""
    return torch.where(lse == float("inf"), torch.full_like(lse, float("-inf")), lse)
