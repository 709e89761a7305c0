#!/usr/bin/env python3
"""DeepSeek-V4 sparse decode (sparse_decode_mla_v4, fp8_ds_mla caches) against FlashMLA.

    python bench/bench_sparse_v4.py [--quick] [--only TEXT] [--json bench/results] [--commit C]
                                    [--flashmla DIR]

FlashMLA's own V4 performance configurations (mla_ext.bench.sparse_v4 says which and how): same
caches, indices and q for both, in the same process; GPU time per call by CUDA-graph replay of 20
calls; each case checked once before it is timed. --json DIR writes DIR/sparse_v4_vs_flashmla.json
and .md. --quick: b 128 only. --flashmla DIR: the built FlashMLA (bash
third_party_peers/build_flashmla.sh DIR).
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
    parser.add_argument("--quick", action="store_true", help="b 128 only")
    parser.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT")
    add_common_options(parser, peer=True)
    args = parser.parse_args(argv)
    args.portable = False
    if (rc := no_gpu_exit()) is not None:
        return rc

    from mla_ext.bench import flashmla_peer, sparse_v4
    from mla_ext.bench.harness import finish_vs_peer, measure_roofline

    print(f"peer: {flashmla_peer.load(args.flashmla)}")
    roofline = measure_roofline()
    print(f"{torch.cuda.get_device_name()}: {roofline.describe()} (measured now)")
    rows = sparse_v4.bench_vs_peer(quick=args.quick, only=args.only)
    if not rows:
        print(f"no case matches --only {args.only!r}")
        return 1
    return finish_vs_peer(args, "sparse_v4", "sparse", rows, sparse_v4.table(rows), sparse_v4.summary(rows),
                          sparse_v4.NOTES, roofline)


if __name__ == "__main__":
    sys.exit(main())
