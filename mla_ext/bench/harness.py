"""Shared benchmark harness: the rooflines measured in the same run, the timers, and the writer of
the results (one JSON and one short markdown table per benchmark).

Timers (all GPU times are medians of many):

- ``graph_time_us``: per-call GPU time by CUDA-graph replay. One graph holds ``calls`` calls (20) on
  one set of inputs; after ~100 ms of untimed replays, each replay is timed with CUDA events behind
  a short GPU spin (so the host's launch of the replay is not counted), and the median replay time
  divided by ``calls`` is reported. No host time is in it. Used by the decode, sparse and host
  benchmarks, for mla_ext and the peer alike.
- ``Timer``: one call at a time with a cold L2 (a buffer twice the L2 size is *read* before each
  call, which leaves no dirty lines whose write-back would be charged to the timed call;
  ``flush="write"`` measures the other way for comparison), ~100 ms of untimed calls first (warm-up
  by time, as ``triton.testing.do_bench`` does), CUDA events, median. Used for the rooflines, the
  cache write and the absorbed projections.
- ``host_us_per_call``: host time of a call in a host-bound loop on tiny shapes (GPU idle before
  and after; ``time.perf_counter`` around the loop).

The two ceilings every GPU figure is compared against are measured in the same run
(``measure_roofline``): device-to-device copy bandwidth (bytes read + written) and the bf16 matmul
rate. Timed sections carry NVTX ranges (``mla_ext.<name>``) so Nsight Systems / Compute can select
their kernels (``--nvtx --nvtx-include "mla_ext.<name>/"``).
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(REPO_ROOT, "bench", "results")


@dataclasses.dataclass
class Roofline:
    copy_GBps: float
    bf16_mm_TFLOPS: float

    def describe(self) -> str:
        return f"copy {self.copy_GBps:.0f} GB/s, bf16 matmul {self.bf16_mm_TFLOPS:.0f} TFLOPS"


@dataclasses.dataclass
class Row:
    """One timed case of the cold-L2 benchmarks (cache write, absorb)."""

    case: str
    us: float
    bytes: float = 0.0  # fewest bytes the op must move through device memory
    flops: float = 0.0
    roofline: Roofline | None = None
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def GBps(self) -> float:
        return self.bytes / (self.us * 1e-6) / 1e9 if self.us > 0 else 0.0

    @property
    def TFLOPS(self) -> float:
        return self.flops / (self.us * 1e-6) / 1e12 if self.us > 0 else 0.0

    @property
    def roofline_frac(self) -> float:
        """Measured time over the roofline floor: max(bytes / copy bw, flops / mm rate) / us."""
        if self.roofline is None or self.us <= 0:
            return 0.0
        floor_s = max(self.bytes / (self.roofline.copy_GBps * 1e9), self.flops / (self.roofline.bf16_mm_TFLOPS * 1e12))
        return floor_s / (self.us * 1e-6)

    def as_dict(self) -> dict:
        d = {
            "case": self.case,
            "us": round(self.us, 3),
            "GBps": round(self.GBps, 1),
            "TFLOPS": round(self.TFLOPS, 2),
            "roofline_frac": round(self.roofline_frac, 4),
        }
        d.update(self.extra)
        return d


# ---- timers -----------------------------------------------------------------------------------


def _spin(cycles: int = 50_000) -> None:
    """GPU spin (50,000 cycles: ~25 us at 2 GHz): the host enqueues what follows before the GPU gets there."""
    torch.cuda._sleep(cycles)


class Timer:
    """Cold-L2, event-timed, median-of-many timing of single calls on the current CUDA device."""

    def __init__(self, warmup: int = 5, iters: int = 50, flush: str = "read", warmup_ms: float = 100.0):
        if flush not in ("read", "write"):
            raise ValueError(f"flush must be 'read' or 'write', got {flush!r}")
        self.warmup = warmup
        self.iters = iters
        self.flush = flush
        self.warmup_ms = warmup_ms
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        self._flush = torch.ones(max(2 * l2, 64 << 20) // 4, dtype=torch.float32, device="cuda")
        self._sink = torch.empty((), dtype=torch.float32, device="cuda")

    def flush_l2(self) -> None:
        """Evict the L2 by reading a buffer twice its size (leaves only clean lines behind);
        flush="write" overwrites it instead (leaves dirty lines, for comparison)."""
        if self.flush == "read":
            torch.sum(self._flush, dim=0, out=self._sink)
        else:
            self._flush.fill_(1.0)

    def time_us(self, fn: Callable[[], object], name: str = "op") -> float:
        """Median microseconds of ``fn()`` over ``iters`` calls, each after an L2 flush and a
        short GPU spin (so the host has launched ``fn`` before the GPU gets to it)."""
        for _ in range(self.warmup):
            fn()
        if self.warmup_ms > 0:
            self._run_for(fn, self.warmup_ms)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        with torch.cuda.nvtx.range(f"mla_ext.{name}"):
            for i in range(self.iters):
                self._step_lead_in()
                starts[i].record()
                fn()
                ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))

    def _step_lead_in(self) -> None:
        self.flush_l2()
        _spin()

    def _run_for(self, fn: Callable[[], object], ms: float) -> None:
        """The timed loop's steps (flush, spin, call), untimed, for about ``ms`` of GPU time."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            self._step_lead_in()
            fn()
        end.record()
        end.synchronize()
        for _ in range(int(ms / max(start.elapsed_time(end) / 3, 1e-3))):
            self._step_lead_in()
            fn()


def graph_time_us(fn: Callable[[], object], name: str = "op", calls: int = 20, warmup_ms: float = 100.0,
                  target_ms: float = 500.0, min_replays: int = 10, max_replays: int = 100) -> float:
    """Per-call GPU time of ``fn`` in microseconds, by CUDA-graph replay.

    ``fn`` runs 3 times eagerly on a side stream (lazy initialisation, allocator warm-up), then
    ``calls`` calls of it are captured in one graph. The graph is replayed untimed for about
    ``warmup_ms``, then ``min_replays``..``max_replays`` times (about ``target_ms`` in all), each
    replay timed with CUDA events behind a short GPU spin. Returns median(replay) / calls.
    Everything ``fn`` needs (plans, scheduler metadata) must exist before this is called.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replay_ms = max(start.elapsed_time(end), 1e-3)
        for _ in range(int(warmup_ms / replay_ms)):
            graph.replay()
        n = max(min_replays, min(max_replays, int(target_ms / replay_ms)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        with torch.cuda.nvtx.range(f"mla_ext.{name}"):
            for i in range(n):
                _spin(200_000)  # longer than the host's launch of a graph of many kernels
                starts[i].record()
                graph.replay()
                ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3 / calls
    finally:
        del graph


def host_us_per_call(fn: Callable[[], object], calls: int = 3000, loops: int = 5, warmup: int = 200) -> float:
    """Host microseconds per call: ``calls`` calls in a loop, the GPU idle before (synchronised)
    and waited for after, ``time.perf_counter`` around both; median of ``loops`` loops. On tiny
    shapes the GPU finishes each call before the host has issued the next, so this is the host
    time of a call (the final wait adds one call's GPU time over ``calls`` calls). Python's
    garbage collector is off during the loops, as ``timeit`` does."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_loop = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(loops):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            per_loop.append(time.perf_counter() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(per_loop) / calls * 1e6


def measure_roofline(timer: Timer | None = None) -> Roofline:
    """Copy bandwidth (1 GiB device-to-device, bytes read + written) and bf16 matmul rate
    (8192^3 on random data), measured now on this GPU."""
    timer = timer or Timer()
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    copy_us = timer.time_us(lambda: dst.copy_(src), "roofline.copy")
    del src, dst
    m = 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    mm_us = timer.time_us(lambda: torch.mm(a, b), "roofline.mm")
    del a, b
    torch.cuda.empty_cache()
    return Roofline(copy_GBps=2 * n / (copy_us * 1e-6) / 1e9, bf16_mm_TFLOPS=2 * m**3 / (mm_us * 1e-6) / 1e12)


# ---- checks -----------------------------------------------------------------------------------


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors taken as flat vectors (float64); 1.0 when both are zero,
    NaN when either holds NaN/inf."""
    x, y = a.double().flatten(), b.double().flatten()
    if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())):
        return float("nan")
    nx, ny = x.norm().item(), y.norm().item()
    if nx == 0.0 and ny == 0.0:
        return 1.0
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return (x @ y).item() / (nx * ny)


def check_outputs(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor,
                  min_cos: float = 0.999, lse_tol: float = 0.1) -> tuple[float, str]:
    """Whether an attention result matches another one: (cosine similarity of out, "" or what
    differs). Passes when the cosine similarity of out is above ``min_cos``, lse is non-finite in
    the same places with the same values (-inf where nothing was attended: map FlashMLA's +inf
    first), and the finite lse (natural log) agree within ``lse_tol`` (a different scale, base or
    mask shows there)."""
    cos = cosine_similarity(out, ref_out)
    lse, ref_lse = lse.float(), ref_lse.float()
    fin = torch.isfinite(ref_lse)
    if not torch.equal(fin, torch.isfinite(lse)) or not torch.equal(lse[~fin], ref_lse[~fin]):
        return cos, "lse not finite in the same places"
    if not cos > min_cos:
        return cos, f"out cosine similarity {cos:.6f} <= {min_cos}"
    err = (lse[fin] - ref_lse[fin]).abs().max().item() if bool(fin.any()) else 0.0
    if err > lse_tol:
        return cos, f"lse differs by up to {err:.3g}"
    return cos, ""


# ---- environment, commit, writers -------------------------------------------------------------


def forced_portable() -> bool:
    """Whether the user switch MLA_EXT_FORCE_PORTABLE is set (anything but empty or "0"): every
    op then runs its portable kernels."""
    return os.environ.get("MLA_EXT_FORCE_PORTABLE", "") not in ("", "0")


def resolve_commit(commit: str | None = None) -> str:
    """The commit being measured: ``commit`` when given (``--commit``), else ``git rev-parse
    --short HEAD`` when this checkout has ``.git``, else "unknown"."""
    if commit:
        return commit
    if os.path.exists(os.path.join(REPO_ROOT, ".git")):
        try:
            out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                 text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return "unknown"


def add_common_options(parser, peer: bool = False) -> None:
    """--json DIR and --commit (and --flashmla DIR for benchmarks with a peer)."""
    parser.add_argument("--json", metavar="DIR",
                        help="write the results (<name>.json and <name>.md) into DIR, e.g. bench/results "
                             "(default: print only)")
    parser.add_argument("--commit", help="the commit measured, written into the results (default: "
                                         "`git rev-parse --short HEAD` where the checkout has .git)")
    if peer:
        parser.add_argument("--flashmla", metavar="DIR",
                            help="directory holding the built FlashMLA package (flash_mla/), put on sys.path "
                                 "(default: use `flash_mla` if it is importable already)")


def no_gpu_exit() -> int | None:
    """1 with a message when there is no CUDA GPU (the benchmarks need one), else None."""
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark (the benchmarks time the CUDA kernels)")
        return 1
    return None


def format_table(rows: Sequence[Row], title: str = "") -> str:
    lines = [f"### {title}"] if title else []
    lines += [
        "| case | us | GB/s | TFLOPS | roofline frac |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.case} | {r.us:.2f} | {r.GBps:.0f} | {r.TFLOPS:.1f} | {r.roofline_frac:.2f} |")
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """A markdown table; ``align`` one character per column, "l" or "r" (default: first left)."""
    align = align or "l" + "r" * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_us(us: float | None) -> str:
    return "—" if us is None else f"{us:.1f}" if us >= 10 else f"{us:.2f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    return "—" if num is None or den is None or den <= 0 else f"{num / den:.2f}x"


def fmt_tflops(flops: float, us: float | None) -> str:
    return "—" if us is None or us <= 0 else f"{flops / us / 1e6:.0f}"


def speedup_summary(groups: dict[str, list[dict]], peer: str = "FlashMLA") -> str:
    """The lines a peer benchmark prints after its table: per group of rows (label -> rows with
    "peer_us" and "mla_ext_us"), the geometric-mean speed-up over the peer, its range and how many
    rows mla_ext wins; then the rows whose check failed (their "case", and "format" if any)."""
    lines = []
    for label, rows in groups.items():
        ratios = [r["peer_us"] / r["mla_ext_us"] for r in rows if r["peer_us"] and r["mla_ext_us"]]
        if ratios:
            gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            lines.append(f"{label}: speed-up over {peer} geomean {gm:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x), "
                         f"faster in {sum(x > 1 for x in ratios)} of {len(ratios)} cases")
    failed = [" ".join(filter(None, (r["case"], r.get("format")))) for rs in groups.values() for r in rs
              if "check_failed" in r]
    if failed:
        lines.append("check failed: " + ", ".join(failed))
    return "\n".join(lines)


def write_results(name: str, rows: Sequence[Row | dict], roofline: Roofline | None, out_dir: str, *,
                  commit: str | None = None, peer: str | None = None, table: str | None = None,
                  notes: str = "", title: str | None = None) -> tuple[str, str]:
    """Write ``<out_dir>/<name>.json`` and ``<name>.md``; returns both paths.

    JSON: ``{"gpu", "commit", "date", ["peer"], ["roofline"], "rows", ["notes"]}`` (rows: dicts, or
    ``Row.as_dict()``). Markdown: a header line (date, GPU, commit, the roofline of this run, the
    peer), ``table`` (default: ``format_table(rows)``), then ``notes``.
    """
    os.makedirs(out_dir, exist_ok=True)
    commit = resolve_commit(commit)
    doc: dict = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU",
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if peer is not None:
        doc["peer"] = peer
    if roofline is not None:
        doc["roofline"] = {"copy_GBps": round(roofline.copy_GBps, 1),
                           "bf16_mm_TFLOPS": round(roofline.bf16_mm_TFLOPS, 1)}
    doc["rows"] = [r.as_dict() if isinstance(r, Row) else r for r in rows]
    if notes:
        doc["notes"] = notes
    json_path = os.path.join(out_dir, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    header = f"{doc['date']}, {doc['gpu']}, commit {commit}, torch {torch.__version__}."
    if roofline is not None:
        header += f" Roofline of this run: {roofline.describe()}."
    if peer is not None:
        header += f" Peer: {peer}."
    if table is None:
        table = format_table([r for r in rows if isinstance(r, Row)])
    md = [f"# {title or name}", "", header, "", table]
    if notes:
        md += ["", notes]
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md) + "\n")
    return json_path, md_path


def finish_vs_peer(args, op: str, peer_kind: str, rows: list[dict], table: str, summary: str, notes: str,
                   roofline: Roofline) -> int:
    """The end of a peer benchmark (bench_decode.py, bench_sparse.py): with ``--json``, write
    ``<op>_vs_flashmla`` (``<op>_portable`` with ``--portable``), then print the table and summary.
    Returns the exit code: 1 when a row failed its check."""
    from . import flashmla_peer

    if args.json:
        name = f"{op}_portable" if args.portable else f"{op}_vs_flashmla"
        if args.portable:
            notes += "\n\nmla_ext ran its portable kernels (what sm100 runs)."
        paths = write_results(name, rows, roofline, args.json, commit=resolve_commit(args.commit),
                              peer=flashmla_peer.describe(peer_kind), table=table, notes=notes,
                              title=f"{name}: mla_ext against {flashmla_peer.NAME}")
        print("wrote", *paths)
    print()
    print(table)
    if summary:
        print(summary)
    return 1 if any("check_failed" in r for r in rows) else 0
