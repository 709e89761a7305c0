"""FlashMLA as a benchmark peer, timed in the same run as mla_ext (DESIGN.md §5).

The peer is the stable-ABI FlashMLA build that the ``vllm==0.33.0`` wheel ships,
``vllm/_flashmla_C.abi3.so``. It is not part of this repository (``/third_party_peers/`` is
git-ignored): get it with

    pip download --no-deps vllm==0.33.0 -d /tmp/w
    unzip -j /tmp/w/vllm-0.33.0-*.whl vllm/_flashmla_C.abi3.so -d third_party_peers/

and carry it to the GPU machine with the built extension. ``MLA_EXT_FLASHMLA_SO`` names another
path. The library registers its ops as ``torch.ops._flashmla_C``; they are called here directly
(its Python wrapper imports vLLM). When the library is missing, does not load, lacks an op or the
GPU is not one FlashMLA runs that op on, ``status()`` / ``supports()`` say why and the benchmarks
print that instead of peer rows; a peer call that fails anyway is reported by ``attempt()``, never
raised into the benchmark.

What it covers: dense decode of a bf16 cache with 64-token pages (any h_q) on sm90, and sparse
decode of an fp8_ds_mla cache with 64 or 128 heads (an engine pads other head counts to 64) on
sm90 and sm100. The benchmarks run the peer after mla_ext's timing of the same case.
"""

from __future__ import annotations

import os

import torch

_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "third_party_peers", "_flashmla_C.abi3.so")
_state: dict = {}
NAME = "FlashMLA (vllm 0.33.0 build)"  # what the benchmark rows' "peer" field says


def status() -> str:
    """"loaded <file name>", or why the peer is not available."""
    if "status" not in _state:
        path = os.environ.get("MLA_EXT_FLASHMLA_SO", _DEFAULT)
        shown = os.path.relpath(path, os.path.dirname(os.path.dirname(_DEFAULT))) if path == _DEFAULT else path
        if not os.path.exists(path):
            _state["status"] = f"FlashMLA peer not run: {shown} not found (see mla_ext/bench/flashmla_peer.py)"
        else:
            try:
                torch.ops.load_library(path)
                torch.ops._flashmla_C.dense_decode_fwd  # noqa: B018 (raise if the ops are not there)
                torch.ops._flashmla_C.sparse_decode_fwd  # noqa: B018
                _state["status"] = f"loaded {os.path.basename(path)}"
            except (OSError, RuntimeError, AttributeError) as e:
                _state["status"] = f"FlashMLA peer not run: {shown} did not load ({e})"
    return _state["status"]


def available() -> bool:
    return status().startswith("loaded")


# GPU architectures FlashMLA runs each op on (its sm90a dense kernels; sparse on sm90a and sm100).
_ARCHS = {"dense": ((9, 0),), "sparse": ((9, 0), (10, 0))}


def supports(op: str) -> bool:
    """The library is loaded and this GPU is one FlashMLA runs ``op`` ("dense" or "sparse") on."""
    return available() and torch.cuda.is_available() and torch.cuda.get_device_capability() in _ARCHS[op]


def attempt(what: str, fn):
    """fn() or, if the peer call fails (an unsupported shape, a GPU the build lacks), None with the
    error printed: a peer must never stop mla_ext's benchmark."""
    try:
        return fn()
    except (RuntimeError, AssertionError) as e:  # torch.AcceleratorError is a RuntimeError
        print(f"FlashMLA peer: {what}: not run ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        return None


def dense_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 softmax_scale: float, causal: bool):
    """FlashMLA dense decode over a bf16 cache [num_blocks, 64, 576]: returns a function that runs
    it with the scheduler metadata of a first call (computed here once, as an engine plans once per
    step), giving (out [b, s_q, h_q, 512], lse [b, h_q, s_q])."""
    ops = torch.ops._flashmla_C
    kv = kv_cache.unsqueeze(2)  # [num_blocks, page, 1 kv head, 576]
    _, _, meta, splits = ops.dense_decode_fwd(q, kv, 512, seq_lens, block_table, softmax_scale, causal, None, None, None)

    def run():
        out, lse, _, _ = ops.dense_decode_fwd(q, kv, 512, seq_lens, block_table, softmax_scale, causal, meta, splits, None)
        return out, lse

    return run


def sparse_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float):
    """FlashMLA sparse decode over an fp8_ds_mla cache [num_blocks, page, 656] (uint8): returns a
    function as dense_decode does. q's head count must be 64 or 128 (FlashMLA's sm90 kernels)."""
    ops = torch.ops._flashmla_C
    kv = kv_cache.view(torch.float8_e4m3fn).unsqueeze(2)  # [num_blocks, page, 1, 656]: the format is told by the row bytes

    def call(meta, splits):
        return ops.sparse_decode_fwd(q, kv, indices, None, None, meta, splits, None, None, None, 512, softmax_scale, None, False)

    _, _, meta, splits = call(None, None)

    def run():
        out, lse, _, _ = call(meta, splits)
        return out, lse

    return run


def disagreement(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor) -> str:
    """What differs between the peer's result and mla_ext's, or "" when the peer computed the same
    attention (so its time belongs to the same work): out within 2% relative Frobenius error, finite
    lse within 0.1 (both natural log, [b, h_q, s_q]). The lse bound catches a different scale, base or mask, not
    FlashMLA's precision: its sparse fp8_ds_mla kernel measured 0.017-0.031 from mla_ext's lse on the
    benchmark's cases (logs/s7_review_fixes), whose own lse is within 5e-4 of the fp32 reference in the tests."""
    out, ref_out = out.float(), ref_out.float()
    if not bool(torch.isfinite(out).all()):
        return "non-finite output"
    rel = ((out - ref_out).norm() / ref_out.norm().clamp_min(1e-30)).item()
    if rel > 0.02:
        return f"output rel. error {rel:.3g}"
    fin = torch.isfinite(ref_lse)
    if not torch.equal(fin, torch.isfinite(lse)):
        return "lse finite in different places"
    err = (lse[fin] - ref_lse[fin]).abs().max().item() if bool(fin.any()) else 0.0
    return f"lse error {err:.3g}" if err > 0.1 else ""


def time_checked(timer, what: str, make_run, reference, heads: int | None = None, graph=None) -> float | None:
    """The peer's time on a case, in us: make_run() builds the call (dense_decode / sparse_decode),
    which runs once and is compared with mla_ext's (out, lse) `reference` (its first `heads` heads
    when the peer ran on padded q), then timed, through `graph` (e.g. a CUDA-graph capture) when
    mla_ext's own call was. None, with the reason printed, when the call fails or disagrees."""
    run = attempt(what, make_run)
    got = run and attempt(what, run)
    if got is None:
        return None
    out, lse = got
    if heads is not None:
        out, lse = out[:, :, :heads], lse[:, :heads]
    differs = disagreement(out, lse, *reference)
    if differs:
        print(f"FlashMLA peer: {what}: disagrees with mla_ext ({differs}), not timed")
        return None
    timed = run if graph is None else attempt(what, lambda: graph(run))
    return None if timed is None else timer.time_us(timed, f"flashmla.{what.replace(' ', '_')}")
