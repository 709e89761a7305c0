#!/usr/bin/env python3
"""Benchmark the MLA cache write (concat_and_cache_mla) for 1 to 65536 tokens in each format.

    python bench/bench_cache_write.py [--quick] [--json bench/results]

Prints us, GB/s and the fraction of the copy bandwidth measured in the same run (bytes = kv_c
and k_pe read + slot ids + cache rows written). With --profile, runs only the 65536-token
fp8_ds_mla case a few times inside the NVTX range "mla_ext.profile", for Nsight Compute:

    ncu --clock-control none --nvtx --nvtx-include "mla_ext.profile/" -k regex:concat_and_cache \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis -c 1 \\
        python bench/bench_cache_write.py --profile
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from mla_ext.bench import cache_write  # noqa: E402
from mla_ext.bench.harness import Timer, format_table, measure_roofline, write_results  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1, 4096 and 65536 tokens only")
    parser.add_argument("--json", metavar="DIR", help="write cache_write.json and .md into DIR")
    parser.add_argument("--iters", type=int, default=100, help="timed calls per case (median reported)")
    parser.add_argument("--flush", choices=("read", "write"), default="read",
                        help="how the L2 is evicted before each call (see mla_ext/bench/harness.py)")
    parser.add_argument("--profile", action="store_true", help="one case under NVTX range mla_ext.profile")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark")
        return 1
    if args.profile:
        cache_write.profile_case()
        return 0
    timer = Timer(iters=args.iters, flush=args.flush)
    roofline = measure_roofline(timer)
    rows = cache_write.bench(timer, roofline, quick=args.quick)
    print(f"{torch.cuda.get_device_name()}: copy {roofline.copy_GBps:.0f} GB/s, "
          f"bf16 matmul {roofline.bf16_mm_TFLOPS:.0f} TFLOPS (measured now)")
    print(format_table(rows, "concat_and_cache_mla"))
    if args.json:
        paths = write_results("cache_write", rows, roofline, args.json, notes=f"L2 flush: {args.flush}")
        print("wrote", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
