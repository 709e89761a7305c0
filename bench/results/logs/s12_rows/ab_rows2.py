# Session 12, call 2: same-process A/B of the portable sparse kernels' row gathers, 8 against 16 threads per
# row (MLA_EXT_SPARSE_ROW_THREADS; forced portable), on the issue-5 cases: fp8_ds_mla b128 s_q2 h_q128, and
# b128 s_q1 h_q16 / h_q64 on the same indices, for both cache formats. Rounds alternate the order; each
# number is a median of 30 cold-L2 calls; outputs of the two gathers must be bit-identical.
import os, sys, statistics
sys.path.insert(0, os.getcwd())
import torch
from mla_ext.bench import sparse as sb
from mla_ext.bench.harness import Timer
os.environ["MLA_EXT_FORCE_PORTABLE"] = "1"
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
variants = ["8", "16"]
timer = Timer(warmup=3, iters=30)
refs = {}
for fmt in ("fp8_ds_mla", "auto"):
    cache, table = sb._pool(128, fmt)
    idx2 = sb._indices(128, 2, table); idx1 = sb._indices(128, 1, table)
    cases = [("b128 s_q2 h_q128", 2, 128, idx2), ("b128 s_q1 h_q16", 1, 16, idx1), ("b128 s_q1 h_q64", 1, 64, idx1)]
    res = {(c[0], v): [] for c in cases for v in variants}
    qs = {c[0]: torch.randn(128, c[1], c[2], 576, dtype=torch.bfloat16, device="cuda") for c in cases}
    for r in range(rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            os.environ["MLA_EXT_SPARSE_ROW_THREADS"] = v
            for label, s_q, h_q, idx in cases:
                q = qs[label]
                f = lambda: torch.ops.mla_ext.sparse_decode_mla(q, cache, idx, sb.SOFTMAX_SCALE, fmt, None, None)
                out = f()[0]
                key = (fmt, label)
                if key not in refs: refs[key] = out
                assert torch.equal(out, refs[key]), f"{fmt} {label} rows {v}: output differs"
                res[(label, v)].append(timer.time_us(f, f"ab_{v}"))
                print(f"{fmt} round {r} rows {v} {label}: {res[(label, v)][-1]:.1f} us", flush=True)
    print(f"| {fmt} case | rows 8 us (median) | rows 16 us (median) | 16 / 8 |")
    print("|---|---:|---:|---:|")
    med = {}
    for label, s_q, h_q, idx in cases:
        a, b = statistics.median(res[(label, "8")]), statistics.median(res[(label, "16")])
        med[(label, "8")], med[(label, "16")] = a, b
        tf = 2 * 128 * s_q * h_q * 2048 * (576 + 512) / 1e6
        print(f"| {label} | {a:.1f} ({tf / a:.1f} TFLOPS) | {b:.1f} ({tf / b:.1f} TFLOPS) | {b / a:.3f} |")
    for v in variants:
        print(f"{fmt} rows {v}: h_q16 / h_q64 = {med[('b128 s_q1 h_q16', v)] / med[('b128 s_q1 h_q64', v)]:.3f}")
    del cache, table; refs.clear(); torch.cuda.empty_cache()
