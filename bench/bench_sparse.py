#!/usr/bin/env python3
"""Sparse top-k decode (sparse_decode_mla, fp8_ds_mla cache) against FlashMLA, on the GPU this runs on.

    python bench/bench_sparse.py [--quick] [--only TEXT] [--portable] [--json bench/results]
                                 [--commit C] [--flashmla DIR]

Cases b{b}_h{h_q}_s{s_q}_topk{topk}: DeepSeek V3.2 decode (h_q 128, s_q 2, topk 2048) at b 2, 64,
74 and 128; h_q 64 at b 64 and 128; b32 h_q 128 s_q 1 topk 512; and h_q 16 and 32 at b 128 (TP8,
TP4), where FlashMLA runs q zero-padded to 64 heads. Same cache, indices and q for both, in the same
process; GPU time per call by CUDA-graph replay of 20 calls; each case checked once before it is
timed (mla_ext.bench.sparse says how). The copy bandwidth and bf16 matmul rate are measured in the
same run.

--json DIR writes DIR/sparse_vs_flashmla.json and .md; with --portable every mla_ext call runs the
portable kernels (the user switch MLA_EXT_FORCE_PORTABLE=1, set before the first call: what sm100
runs) and the results go to sparse_portable.json and .md. --flashmla DIR: the built FlashMLA (bash
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
    parser.add_argument("--quick", action="store_true", help="three cases only (b128 h128 s2, b64 h64 s2, b128 h16 s1)")
    parser.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT")
    parser.add_argument("--portable", action="store_true",
                        help="mla_ext on its portable kernels (MLA_EXT_FORCE_PORTABLE=1); writes sparse_portable.*")
    add_common_options(parser, peer=True)
    args = parser.parse_args(argv)
    if args.portable:
        os.environ["MLA_EXT_FORCE_PORTABLE"] = "1"  # before the library's first call, which reads it
    if (rc := no_gpu_exit()) is not None:
        return rc

    from mla_ext.bench import flashmla_peer, sparse
    from mla_ext.bench.harness import finish_vs_peer, measure_roofline

    print(f"peer: {flashmla_peer.load(args.flashmla)}")
    if flashmla_peer.available() and not flashmla_peer.supports("sparse"):
        print(flashmla_peer.why_not("sparse"))
    roofline = measure_roofline()
    print(f"{torch.cuda.get_device_name()}: {roofline.describe()} (measured now)"
          + ("; mla_ext on its portable kernels" if args.portable else ""))
    rows = sparse.bench_vs_peer(quick=args.quick, only=args.only)
    if not rows:
        print(f"no case matches --only {args.only!r}")
        return 1
    return finish_vs_peer(args, "sparse", "sparse", rows, sparse.table(rows), sparse.summary(rows), sparse.NOTES,
                          roofline)


if __name__ == "__main__":
    sys.exit(main())
