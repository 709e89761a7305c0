"""Benchmark the absorbed projections (q_absorb, v_up) against PyTorch on this GPU.

    python bench/bench_absorb.py [--quick] [--json bench/results]

Cold L2, median of many, copy bandwidth and bf16 matmul rate measured in the same run
(mla_ext.bench.harness); checks the kernels against the reference first.
"""

from __future__ import annotations

import argparse
import sys

import torch

from mla_ext.bench import absorb
from mla_ext.bench.harness import Timer, format_table, measure_roofline, write_results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="T in {1, 64, 8192} only")
    parser.add_argument("--json", metavar="DIR", help="write absorb.json/.md into DIR")
    parser.add_argument("--sweep-v-up", metavar="DIR",
                        help="also time v_up with each kernel forced at more T (the tier boundaries); "
                             "writes absorb_v_up_sweep.json/.md into DIR")
    parser.add_argument("--sweep-kernels", metavar="K1,K2",
                        help=f"v_up kernels for --sweep-v-up (default: {','.join(absorb.V_UP_KERNELS)})")
    parser.add_argument("--sweep-tokens", metavar="T1,T2", help="token counts for --sweep-v-up (default: "
                        + ",".join(map(str, absorb.SWEEP_TOKENS)) + ")")
    parser.add_argument("--sweep-heads", metavar="H1,H2", help="head counts for --sweep-v-up (default: the benchmark's)")
    parser.add_argument("--sweep-only", action="store_true", help="skip the benchmark table (with --sweep-v-up)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    print(absorb.self_check("cuda"))
    timer = Timer()
    roofline = measure_roofline(timer)
    print(f"roofline now: copy {roofline.copy_GBps:.0f} GB/s, bf16 matmul {roofline.bf16_mm_TFLOPS:.0f} TFLOPS")
    rows = [] if args.sweep_only else absorb.bench(timer, roofline, quick=args.quick)
    if rows:
        summary = absorb.bar_summary(rows)
        print(format_table(rows, absorb.NAME))
        print("\nIssue 4 bar:\n" + summary)
    if args.json and rows:
        notes = ("Bytes = weights (bf16, or e4m3 + scales) + activations read + output written; FLOPs = "
                 "2 T H 128 512. Baselines: torch bmm + cat on a strided q_nope view (vLLM's q path), torch bmm "
                 "(v path, without the transpose o_proj needs), and per-call dequantise (fp32 math, bf16) then "
                 "the same for fp8 weights.\n\nIssue 4 bar:\n" + summary)
        for path in write_results(absorb.NAME, rows, roofline, args.json, notes=notes):
            print("wrote", path)
    if args.sweep_v_up:
        kernels = tuple(args.sweep_kernels.split(",")) if args.sweep_kernels else absorb.V_UP_KERNELS
        tokens = tuple(int(t) for t in args.sweep_tokens.split(",")) if args.sweep_tokens else absorb.SWEEP_TOKENS
        heads = tuple(int(h) for h in args.sweep_heads.split(",")) if args.sweep_heads else absorb.HEADS
        sweep = absorb.sweep_v_up(timer, roofline, kernels, tokens, heads)
        print(format_table(sweep, "v_up kernels"))
        for path in write_results(absorb.NAME + "_v_up_sweep", sweep, roofline, args.sweep_v_up,
                                  notes="v_up with MLA_EXT_VUP_KERNEL forced; vs_bmm in the JSON rows."):
            print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
