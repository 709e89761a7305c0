# Session 12, call 3: same-process A/B (rounds alternate the order; each number a median of 30 cold-L2 calls):
#  sm90 64-head fp8_ds_mla softmax (MLA_EXT_SPARSE_SM90_SOFTMAX, temporary): 0 scaled first, 1 one fma per key
#  (the earlier kernel), 2 hybrid; b128 s_q2 h_q128 and b128 s_q1 h_q64;
#  portable fp8_ds_mla 16-head gathers: copy warps (cp.async, default), compute warps with 16 / 8 threads per
#  row; b128 s_q1 h_q16 against the portable h_q64 on the same indices.
import os, sys, statistics
sys.path.insert(0, os.getcwd())
import torch
from mla_ext.bench import sparse as sb
from mla_ext.bench.harness import Timer
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
timer = Timer(warmup=3, iters=30)
cache, table = sb._pool(128, "fp8_ds_mla")
idx2 = sb._indices(128, 2, table); idx1 = sb._indices(128, 1, table)
q128 = torch.randn(128, 2, 128, 576, dtype=torch.bfloat16, device="cuda")
q64 = torch.randn(128, 1, 64, 576, dtype=torch.bfloat16, device="cuda")
q16 = q64[:, :, :16].contiguous()
ENV = ("MLA_EXT_FORCE_PORTABLE", "MLA_EXT_SPARSE_SM90_SOFTMAX", "MLA_EXT_SPARSE_COPY_WARPS", "MLA_EXT_SPARSE_ROW_THREADS")
variants = {
    "sm90 softmax scaled": {"MLA_EXT_SPARSE_SM90_SOFTMAX": "0"},
    "sm90 softmax fma": {"MLA_EXT_SPARSE_SM90_SOFTMAX": "1"},
    "sm90 softmax hybrid": {"MLA_EXT_SPARSE_SM90_SOFTMAX": "2"},
    "portable copy warps": {"MLA_EXT_FORCE_PORTABLE": "1"},
    "portable rows 16": {"MLA_EXT_FORCE_PORTABLE": "1", "MLA_EXT_SPARSE_COPY_WARPS": "0"},
    "portable rows 8": {"MLA_EXT_FORCE_PORTABLE": "1", "MLA_EXT_SPARSE_ROW_THREADS": "8"},
}
cases = {"sm90": [("h128", q128, idx2), ("h64", q64, idx1)], "portable": [("h16", q16, idx1), ("h64", q64, idx1)]}
res, refs = {}, {}
names = list(variants)
for r in range(rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
        for k in ENV: os.environ.pop(k, None)
        os.environ.update(variants[name])
        for label, q, idx in cases[name.split()[0]]:
            f = lambda: torch.ops.mla_ext.sparse_decode_mla(q, cache, idx, sb.SOFTMAX_SCALE, "fp8_ds_mla", None, None)
            out = f()[0].float()
            key = (name.split()[0], label)
            if key not in refs: refs[key] = out
            err = float((out - refs[key]).abs().max())
            res.setdefault((name, label), []).append(timer.time_us(f, "ab3"))
            print(f"round {r} {name} {label}: {res[(name, label)][-1]:.1f} us (max diff to the first variant {err:.2e})", flush=True)
print("| variant | case | us (rounds) | median |")
print("|---|---|---|---:|")
for (name, label), v in res.items():
    print(f"| {name} | {label} | {' / '.join(f'{x:.1f}' for x in v)} | {statistics.median(v):.1f} |")
for name in names[3:]:
    print(f"{name}: h_q16 / h_q64 = {statistics.median(res[(name, 'h16')]) / statistics.median(res[(name, 'h64')]):.3f}")
