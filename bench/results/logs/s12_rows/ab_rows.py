# Session 12: same-process A/B of the portable kPvRaw kernel's row gathers (MLA_EXT_SPARSE_ROW_THREADS
# 8 / 16 / 32 = row runs) on the issue-5 case, b128 s_q2 h_q128 topk 2048 fp8_ds_mla, forced portable;
# rounds interleaved, each a median of 30 cold-L2 calls. Also h_q 64 (b128 s_q1) once per round.
import os, sys, statistics
sys.path.insert(0, os.getcwd())
import torch
from mla_ext.bench import sparse as sb
from mla_ext.bench.harness import Timer
os.environ["MLA_EXT_FORCE_PORTABLE"] = "1"
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["8", "16", "32"]
timer = Timer(warmup=3, iters=30)
cache, table = sb._pool(128, "fp8_ds_mla")
idx2 = sb._indices(128, 2, table); idx1 = sb._indices(128, 1, table)
q2 = torch.randn(128, 2, 128, 576, dtype=torch.bfloat16, device="cuda")
q1 = torch.randn(128, 1, 64, 576, dtype=torch.bfloat16, device="cuda")
flops = 2 * 128 * 2 * 128 * 2048 * (576 + 512)
ref = {}
res = {v: [] for v in variants}; res64 = {v: [] for v in variants}
for r in range(rounds):
    for v in (variants if r % 2 == 0 else variants[::-1]):
        os.environ["MLA_EXT_SPARSE_ROW_THREADS"] = v
        f = lambda: torch.ops.mla_ext.sparse_decode_mla(q2, cache, idx2, sb.SOFTMAX_SCALE, "fp8_ds_mla", None, None)
        out = f()[0]
        if "8" in ref: assert torch.equal(out, ref["8"]), f"rows {v}: output differs from rows 8"
        else: ref[v] = out
        res[v].append(timer.time_us(f, f"ab_{v}"))
        g = lambda: torch.ops.mla_ext.sparse_decode_mla(q1, cache, idx1, sb.SOFTMAX_SCALE, "fp8_ds_mla", None, None)
        res64[v].append(timer.time_us(g, f"ab64_{v}"))
        print(f"round {r} rows {v}: h128 {res[v][-1]:.1f} us ({flops / res[v][-1] / 1e6:.1f} TFLOPS), h64 {res64[v][-1]:.1f} us", flush=True)
print("| row gather | h_q128 us (rounds) | median | TFLOPS | h_q64 b128 us median |")
print("|---|---|---:|---:|---:|")
for v in variants:
    m = statistics.median(res[v])
    print(f"| {v} | {' / '.join(f'{x:.1f}' for x in res[v])} | {m:.1f} | {flops / m / 1e6:.1f} | {statistics.median(res64[v]):.1f} |")
