"""Shared benchmark harness.

Method (``/work/.library/device/METHOD.md`` style): every timed call starts with a cold L2 (a
buffer twice the L2 size is *read* first, so the L2 holds none of the op's data and no dirty
lines: a write-based flush leaves the L2 full of dirty lines whose write-back is charged to the
timed kernel, a large distortion for ops that move ~100 MB, and a small one for the 1 GiB copy
roofline; ``Timer(flush="write")`` measures that way for comparison), each case first runs its
timed loop untimed for 100 ms (warm-up by time, as ``triton.testing.do_bench`` does; ``Timer(warmup_ms=0)``
keeps only the 5 warm-up calls), each call is timed with CUDA events, and the median of many is reported.
(Why by time: a freshly built fp8_ds_mla decode case ran 2.5-3.5% slower in its first ~50 calls than after
100 ms of them, or after 0.5 s of idle GPU, on an H200 whose clocks stayed at 1980 MHz; bf16 and fp8 did not
move: bench/results/logs/s17_ring.) The two ceilings every figure is
compared against are measured in the same run: device-to-device copy bandwidth (bytes read +
written) and the bf16 matmul rate (random data). Each op's section is wrapped in an NVTX range so
Nsight Systems / Compute can select its kernels (``--nvtx --nvtx-include "mla_ext.<case>/"``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import statistics
import subprocess
from collections.abc import Callable

import torch


@dataclasses.dataclass
class Roofline:
    copy_GBps: float
    bf16_mm_TFLOPS: float


@dataclasses.dataclass
class Row:
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


class Timer:
    """Cold-L2, event-timed, median-of-many timing on the current CUDA device."""

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
        """Median microseconds of ``fn()`` over ``iters`` calls, each after an L2 flush.

        The flush and a short spin are queued just before the start event, so the CPU has
        already launched ``fn`` by the time the GPU gets there: host launch latency is not counted.
        """
        for _ in range(self.warmup):
            fn()
        if self.warmup_ms > 0:
            self._run_for(fn, self.warmup_ms)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        with torch.cuda.nvtx.range(f"mla_ext.{name}"):
            for i in range(self.iters):
                self._lead_in()
                starts[i].record()
                fn()
                ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))

    def _lead_in(self) -> None:
        """The L2 flush, then ~25 us of GPU spin: the host launches the timed call before the GPU gets
        there, so small ops are not charged the host's launch latency."""
        self.flush_l2()
        torch.cuda._sleep(50_000)

    def _step(self, fn: Callable[[], object]) -> None:
        self._lead_in()
        fn()

    def _run_for(self, fn: Callable[[], object], ms: float) -> None:
        """The timed loop's steps (flush, spin, call), untimed, for about ``ms`` milliseconds of GPU time."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            self._step(fn)
        end.record()
        end.synchronize()
        for _ in range(int(ms / max(start.elapsed_time(end) / 3, 1e-3))):
            self._step(fn)


def measure_roofline(timer: Timer) -> Roofline:
    """Copy bandwidth (1 GiB device-to-device, bytes read + written) and bf16 matmul rate
    (8192^3 on random data), measured now on this GPU."""
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
    return Roofline(copy_GBps=2 * n / (copy_us * 1e-6) / 1e9, bf16_mm_TFLOPS=2 * m**3 / (mm_us * 1e-6) / 1e12)


def forced_portable() -> bool:
    """Whether MLA_EXT_FORCE_PORTABLE is set (anything but empty or "0"), as the library reads it
    (csrc/common/arch.cpp): every op then runs its portable kernels."""
    return os.environ.get("MLA_EXT_FORCE_PORTABLE", "") not in ("", "0")


def git_commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True)
        commit = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except OSError:
        return os.environ.get("MLA_EXT_COMMIT", "unknown")


def format_table(rows: list[Row], title: str = "") -> str:
    lines = [f"### {title}"] if title else []
    lines += [
        "| case | us | GB/s | TFLOPS | roofline frac |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.case} | {r.us:.2f} | {r.GBps:.0f} | {r.TFLOPS:.1f} | {r.roofline_frac:.2f} |")
    return "\n".join(lines)


def write_results(name: str, rows: list[Row], roofline: Roofline, out_dir: str, notes: str = "") -> tuple[str, str]:
    """Write ``<out_dir>/<name>.json`` and ``<name>.md``; returns both paths."""
    os.makedirs(out_dir, exist_ok=True)
    commit = os.environ.get("MLA_EXT_COMMIT") or git_commit()
    doc = {
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "roofline": {"copy_GBps": round(roofline.copy_GBps, 1), "bf16_mm_TFLOPS": round(roofline.bf16_mm_TFLOPS, 1)},
        "rows": [r.as_dict() for r in rows],
    }
    if notes:
        doc["notes"] = notes
    json_path = os.path.join(out_dir, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1)
    md = [
        f"# {name}",
        "",
        f"{doc['date']}, {doc['gpu']}, commit {commit}, torch {doc['torch']}. Roofline measured in the same run: "
        f"copy {roofline.copy_GBps:.0f} GB/s, bf16 matmul {roofline.bf16_mm_TFLOPS:.0f} TFLOPS. "
        "Median of many, L2 cold, 100 ms warm-up per case.",
        "",
        format_table(rows),
    ]
    if notes:
        md += ["", notes]
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md) + "\n")
    return json_path, md_path
