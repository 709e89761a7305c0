#!/usr/bin/env python3
"""The MLA cache write (concat_and_cache_mla) for 1 to 65536 tokens in each format, on this GPU.

    python bench/bench_cache_write.py [--quick] [--json bench/results] [--commit C]

Prints us, GB/s and the fraction of the copy bandwidth measured in the same run (bytes = kv_c and
k_pe read + slot ids + cache rows written); cold L2, median of many. --json DIR writes
DIR/cache_write.json and .md. With --profile, runs only the 65536-token fp8_ds_mla case a few
times inside the NVTX range "mla_ext.profile", for Nsight Compute:

    ncu --clock-control none --nvtx --nvtx-include "mla_ext.profile/" -k regex:concat_and_cache \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis -c 1 \\
        python bench/bench_cache_write.py --profile
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from mla_ext.bench.harness import add_common_options, no_gpu_exit  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1, 4096 and 65536 tokens only")
    parser.add_argument("--iters", type=int, default=100, help="timed calls per case (median reported)")
    parser.add_argument("--flush", choices=("read", "write"), default="read",
                        help="how the L2 is evicted before each call (see mla_ext/bench/harness.py)")
    parser.add_argument("--profile", action="store_true", help="one case under the NVTX range mla_ext.profile")
    add_common_options(parser)
    args = parser.parse_args(argv)
    if (rc := no_gpu_exit()) is not None:
        return rc

    from mla_ext.bench import cache_write
    from mla_ext.bench.harness import Timer, format_table, measure_roofline, resolve_commit, write_results

    if args.profile:
        cache_write.profile_case()
        return 0
    print(cache_write.self_check("cuda"))
    timer = Timer(iters=args.iters, flush=args.flush)
    roofline = measure_roofline(timer)
    print(f"{torch.cuda.get_device_name()}: {roofline.describe()} (measured now)")
    rows = cache_write.bench(timer, roofline, quick=args.quick)
    if args.json:
        notes = (f"Bytes = kv_c and k_pe read (576 bf16) + slot id + cache row written; L2 flushed by a {args.flush} "
                 "before each call; median of many, 100 ms warm-up per case.")
        paths = write_results("cache_write", rows, roofline, args.json, commit=resolve_commit(args.commit), notes=notes)
        print("wrote", *paths)
    print()
    print(format_table(rows, "concat_and_cache_mla"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
