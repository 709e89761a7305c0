"""Benchmark the sparse top-k decode: ``python bench/bench_sparse.py [--quick] [--json DIR]``.

Prints time, GB/s, TFLOPS and the fraction of the roofline measured in the same run (copy
bandwidth, bf16 matmul rate); with --json writes DIR/sparse.json and DIR/sparse.md, or with
MLA_EXT_FORCE_PORTABLE=1 (every case on the portable kernels) DIR/sparse_portable.json and .md.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from mla_ext.bench import flashmla_peer, sparse  # noqa: E402
from mla_ext.bench.harness import Timer, forced_portable, format_table, measure_roofline, write_results  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fp8_ds_mla cases only")
    parser.add_argument("--json", metavar="DIR", help="write sparse.json / sparse.md into DIR")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time")
        return 1
    print(f"self check: {sparse.self_check('cuda')}")
    print(f"peer: {flashmla_peer.status()}")
    timer = Timer()
    roofline = measure_roofline(timer)
    print(f"roofline: copy {roofline.copy_GBps:.0f} GB/s, bf16 matmul {roofline.bf16_mm_TFLOPS:.0f} TFLOPS")
    rows = sparse.bench(timer, roofline, quick=args.quick)
    print(format_table(rows, sparse.NAME))
    for r in rows:
        if "h16_over_h64" in r.extra:
            print(f"{r.extra['format']}: h_q 16 / h_q 64 time on the same indices = {r.extra['h16_over_h64']}")
        if "flashmla_us_over_mla_ext" in r.extra:
            print(f"{r.case}: mla_ext {r.extra['flashmla_us_over_mla_ext']}x as fast as FlashMLA")
    # MLA_EXT_FORCE_PORTABLE=1: every case on the portable kernels (what sm100 runs; the issue-5 bars are
    # written for them), into sparse_portable.{json,md} next to the default run's sparse.{json,md}.
    if args.json and forced_portable():
        switches = {k: v for k, v in os.environ.items() if k.startswith("MLA_EXT_SPARSE_")}
        notes = ("Every case on the portable kernels (MLA_EXT_FORCE_PORTABLE=1: mma.sync m16n8k16, cp.async row "
                 "gather), as sm100 runs them"
                 + (f", with {switches}" if switches else
                    "; fp8_ds_mla 64-head tiles read V from the staging rows (PortableConfig::kPvRaw), 16-head tiles "
                    "gather with 4 cp.async copy warps; fp8_ds_mla rows by 16 threads each, bf16 rows by 8")
                 + ". Bars (issue 5, portable path): >= 200 TFLOPS on fp8_ds_mla b128 s_q2 h_q128; "
                 "h_q16 / h_q64 time <= 0.5 on the same indices.")
        paths = write_results("sparse_portable", rows, roofline, args.json, notes=notes)
        print("wrote", *paths)
    elif args.json:
        notes = ("Portable kernels (mma.sync m16n8k16, cp.async row gather), except fp8_ds_mla on sm90: 64-head "
                 "tiles (h_q > 32) on the wgmma kernel, 16-head tiles (h_q <= 16) with rows gathered by "
                 "cp.async.bulk from 4 copy warps (csrc/sparse/sm90). Bars (issue 5): >= 200 TFLOPS on "
                 "fp8_ds_mla b128 s_q2 h_q128; h_q16 / h_q64 time <= 0.5 on the same indices. Peer: "
                 + ("FlashMLA (the vllm 0.33.0 build), same run and inputs, both timed eagerly, q padded to 64 heads "
                    "for h_q 16 (rows 'FlashMLA peer')." if any("peer" in r.extra for r in rows) else
                    flashmla_peer.status() if not flashmla_peer.available() else "FlashMLA: no comparable case timed."))
        paths = write_results("sparse", rows, roofline, args.json, notes=notes)
        print("wrote", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
