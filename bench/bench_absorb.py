#!/usr/bin/env python3
"""The absorbed projections (q_absorb, v_up) against what an engine writes in PyTorch, on this GPU.

    python bench/bench_absorb.py [--quick] [--json bench/results] [--commit C]

T in {1, 16, 64, 128, 256, 8192} tokens, H in {16, 128} heads, bf16 and fp8 (block-scaled)
weights, each op next to its PyTorch counterpart: torch.bmm + torch.cat on a strided q_nope view
(vLLM's q path), torch.bmm (the v path), and per-call dequantise-then-the-same for fp8 weights.
Cold L2, median of many; the copy bandwidth and bf16 matmul rate are measured in the same run;
the kernels are checked against the reference first. --json DIR writes DIR/absorb.json and .md.
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
    parser.add_argument("--quick", action="store_true", help="T in {1, 64, 8192} only")
    add_common_options(parser)
    args = parser.parse_args(argv)
    if (rc := no_gpu_exit()) is not None:
        return rc

    from mla_ext.bench import absorb
    from mla_ext.bench.harness import Timer, format_table, measure_roofline, resolve_commit, write_results

    print(absorb.self_check("cuda"))
    timer = Timer()
    roofline = measure_roofline(timer)
    print(f"{torch.cuda.get_device_name()}: {roofline.describe()} (measured now)")
    rows = absorb.bench(timer, roofline, quick=args.quick)
    summary = absorb.bar_summary(rows)
    if args.json:
        notes = ("Bytes = weights (bf16, or e4m3 + scales) + activations read + output written; FLOPs = 2 T H 128 512. "
                 "Baselines: torch bmm + cat on a strided q_nope view (vLLM's q path), torch bmm (v path, without the "
                 "transpose o_proj needs), and per-call dequantise (fp32 math, bf16) then the same for fp8 weights. "
                 "Cold L2, median of many, 100 ms warm-up per case. The JSON rows of the ops hold the baseline's time "
                 "and the speed-up.\n\nBar (each op at least as fast as its PyTorch counterpart; v_up bf16 within 5% "
                 "of torch.bmm):\n" + summary)
        paths = write_results(absorb.NAME, rows, roofline, args.json, commit=resolve_commit(args.commit), notes=notes)
        print("wrote", *paths)
    print()
    print(format_table(rows, absorb.NAME))
    print("\nBar:\n" + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
