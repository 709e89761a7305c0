"""One sparse-decode benchmark case, a few calls inside the NVTX range "mla_ext.profile", for
Nsight Compute: ``ncu --nvtx --nvtx-include "mla_ext.profile/" -k regex:sparse -c 1 ...
python bench/profile_sparse.py [--fmt fp8_ds_mla] [--b 128 --s-q 2 --h-q 128]`` (the same pool and
indices as bench_sparse.py's cases; the environment selects the kernel, e.g.
MLA_EXT_FORCE_PORTABLE=1)."""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from mla_ext.bench import sparse  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fmt", default="fp8_ds_mla")
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--s-q", type=int, default=2)
    ap.add_argument("--h-q", type=int, default=128)
    ap.add_argument("--iters", type=int, default=2)
    args = ap.parse_args()
    cache, table = sparse._pool(args.b, args.fmt)
    idx = sparse._indices(args.b, args.s_q, table)
    q = torch.randn(args.b, args.s_q, args.h_q, 576, dtype=torch.bfloat16, device="cuda")
    fn = lambda: torch.ops.mla_ext.sparse_decode_mla(q, cache, idx, sparse.SOFTMAX_SCALE, args.fmt, None, None)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("mla_ext.profile"):
        for _ in range(args.iters):
            fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
