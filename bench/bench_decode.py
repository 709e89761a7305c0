"""Benchmark of dense paged decode (decode_mla) over the DESIGN.md §5 cases.

    python bench/bench_decode.py [--quick] [--json bench/results] [--check]

Each case: the plan is computed once (an engine plans once per step and reuses the plan in
every layer), then the decode call (split kernel + combine) is timed with a cold L2, median of
many. Copy bandwidth and the bf16 matmul rate are measured in the same run. NVTX ranges are named
``mla_ext.decode_mla.<format>.b<b>.s<s_q>.h<h_q>.bs<block_size>`` for Nsight. With
MLA_EXT_FORCE_PORTABLE=1 (every case on the portable kernels) the results go to
DIR/decode_mla_portable.json and .md.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from mla_ext.bench import decode, flashmla_peer  # noqa: E402
from mla_ext.bench.harness import Timer, forced_portable, format_table, measure_roofline, write_results  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the headline cases")
    parser.add_argument("--json", metavar="DIR", help="write decode_mla.json / .md into DIR")
    parser.add_argument("--check", action="store_true", help="run the self-check against the reference first")
    parser.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT")
    parser.add_argument("--iters", type=int, default=50, help="timed calls per case (median reported)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark")
        return 1
    if args.check:
        print(decode.self_check("cuda"))
    print(f"peer: {flashmla_peer.status()}")
    timer = Timer(iters=args.iters)
    roofline = measure_roofline(timer)
    print(f"roofline: copy {roofline.copy_GBps:.0f} GB/s, bf16 matmul {roofline.bf16_mm_TFLOPS:.0f} TFLOPS")
    rows = decode.bench(timer, roofline, quick=args.quick, only=args.only)
    print(format_table(rows, decode.NAME))
    summary = decode.bandwidth_summary(rows)
    print(summary)
    # MLA_EXT_FORCE_PORTABLE=1: every case on the portable kernels (what sm100 runs; issue 3's bars are
    # written for them), into decode_mla_portable.{json,md} next to the default run's decode_mla.{json,md}.
    if args.json and forced_portable():
        notes = ("Every case on the portable kernels (MLA_EXT_FORCE_PORTABLE=1: mma.sync m16n8k16, cp.async tile "
                 "copies; on sm90 and newer fp8 raw rows by cp.async.bulk), as sm100 runs them. "
                 "Bars (issue 3, portable path): >= 70% of copy bandwidth on the "
                 "memory-bound cases, >= 50% on the single 64K request, fp8_ds_mla >= 1.4x faster than bf16 on "
                 "the memory-bound cases.\n\n" + summary)
        write_results(decode.NAME + "_portable", rows, roofline, args.json, notes=notes)
    elif args.json:
        write_results(decode.NAME, rows, roofline, args.json, notes=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
