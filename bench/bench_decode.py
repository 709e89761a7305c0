#!/usr/bin/env python3
"""Dense paged decode (decode_mla) against FlashMLA, on the GPU this runs on.

    python bench/bench_decode.py [--quick] [--only TEXT] [--portable] [--json bench/results]
                                 [--commit C] [--flashmla DIR]

Cases b{b}_len{len}_h{h_q}_s{s_q} for b x len in {128 x 4096, 64 x 8192}, h_q in {16, 32, 64, 128},
s_q in {1, 2}, plus thundermla_b4_h16_s4 (lengths 4641, 45118, 1730, 1696) and single_64k_h16_s1;
each on a bf16 cache (format auto) and on the same rows in fp8_ds_mla. FlashMLA (the peer) runs on
the bf16 cache in the same process, on the same inputs. GPU time per call by CUDA-graph replay of 20
calls; each case is checked once before it is timed (mla_ext.bench.decode says how). The copy
bandwidth and bf16 matmul rate are measured in the same run.

--json DIR writes DIR/decode_vs_flashmla.json and .md; with --portable every mla_ext call runs the
portable kernels (force_portable=True: what sm100 runs) and the results go to decode_portable.json
and .md. --flashmla DIR: the built FlashMLA (bash third_party_peers/build_flashmla.sh DIR).
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
    parser.add_argument("--quick", action="store_true", help="four cases only (b128 x 4096 h16 s1, b64 x 8192 "
                                                             "h128 s2, thundermla, single 64K)")
    parser.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT")
    parser.add_argument("--portable", action="store_true",
                        help="mla_ext on its portable kernels (force_portable=True); writes decode_portable.*")
    add_common_options(parser, peer=True)
    args = parser.parse_args(argv)
    if (rc := no_gpu_exit()) is not None:
        return rc

    from mla_ext.bench import decode, flashmla_peer
    from mla_ext.bench.harness import finish_vs_peer, measure_roofline

    print(f"peer: {flashmla_peer.load(args.flashmla)}")
    if flashmla_peer.available() and not flashmla_peer.supports("dense"):
        print(flashmla_peer.why_not("dense"))
    roofline = measure_roofline()
    print(f"{torch.cuda.get_device_name()}: {roofline.describe()} (measured now)"
          + ("; mla_ext on its portable kernels" if args.portable else ""))
    rows = decode.bench_vs_peer(quick=args.quick, only=args.only, force_portable=args.portable)
    if not rows:
        print(f"no case matches --only {args.only!r}")
        return 1
    return finish_vs_peer(args, "decode", "dense", rows, decode.table(rows), decode.summary(rows), decode.NOTES,
                          roofline)


if __name__ == "__main__":
    sys.exit(main())
