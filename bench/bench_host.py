#!/usr/bin/env python3
"""Host time of one call, mla_ext against FlashMLA and torch.add, on tiny shapes.

    python bench/bench_host.py [--json bench/results] [--commit C] [--flashmla DIR]
                               [--calls 3000] [--loops 5]

Each op runs in a host-bound loop (the GPU is idle before and waited for after; time.perf_counter
around the loop; median of the loops): torch.add, FlashMLA's flash_mla_with_kvcache (dense), the
mla_ext wrappers (decode_mla with its plan, sparse_decode_mla, concat_and_cache_mla, q_absorb,
v_up) and the raw torch.ops.mla_ext ops they call; plus decode_plan_gpu, the GPU time of
get_decode_plan (CUDA-graph replay, the largest of b 4, 64, 256). mla_ext.bench.host says which
shapes. The bars: decode_mla <= 0.6x flash_mla_with_kvcache; the sparse, cache-write, q_absorb and
v_up wrappers <= 2x torch.add; the plan <= 8 us of GPU time.

--json DIR writes DIR/host.json and DIR/host.md. --flashmla DIR: the built FlashMLA (bash
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
    parser.add_argument("--calls", type=int, default=3000, help="calls per timed loop")
    parser.add_argument("--loops", type=int, default=5, help="timed loops per op (median reported)")
    add_common_options(parser, peer=True)
    args = parser.parse_args(argv)
    if (rc := no_gpu_exit()) is not None:
        return rc

    from mla_ext.bench import flashmla_peer, host
    from mla_ext.bench.harness import resolve_commit, write_results

    print(f"peer: {flashmla_peer.load(args.flashmla)}")
    print(f"{torch.cuda.get_device_name()}: host us per call, {args.calls} calls per loop, "
          f"median of {args.loops} loops")
    rows = host.bench(calls=args.calls, loops=args.loops)
    table = host.table(rows)
    if args.json:
        paths = write_results("host", rows, None, args.json, commit=resolve_commit(args.commit),
                              peer=flashmla_peer.describe("dense"), table=table, notes=host.NOTES,
                              title="host: time of one call on the host")
        print("wrote", *paths)
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
