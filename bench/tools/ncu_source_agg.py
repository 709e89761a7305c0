"""Aggregate an Nsight Compute source page (``--page source --print-source sass --csv``):
executed instructions and warp-stall samples per opcode, per execution count (instructions
executed the same number of times belong to the same loop level: e.g. once per 64-key tile), and
the top stall lines. Usage: python bench/tools/ncu_source_agg.py FILE.csv [top_n]"""
import collections
import csv
import re
import sys

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
hdr_i = next(i for i, r in enumerate(rows) if any(c == "Source" for c in r))
hdr = rows[hdr_i]


def col(name):
    return next((i for i, c in enumerate(hdr) if c.startswith(name)), None)


src, ex, st = col("Source"), col("Instructions Executed"), col("Warp Stall Sampling (All")
by_op, stall_op = collections.Counter(), collections.Counter()
by_count, stall_count, n_count = collections.Counter(), collections.Counter(), collections.Counter()
lines = []
for r in rows[hdr_i + 1:]:
    if len(r) <= max(src, ex, st):
        continue
    s = r[src].strip()
    op = re.sub(r"^@!?U?P\w+\s+", "", s).split(" ")[0]
    try:
        e, w = float(r[ex] or 0), float(r[st] or 0)
    except ValueError:
        continue
    by_op[op] += e
    stall_op[op] += w
    by_count[e] += e
    stall_count[e] += w
    n_count[e] += 1
    lines.append((w, e, s))
tot, tots = sum(by_op.values()), max(sum(stall_op.values()), 1)
print(f"total executed {tot:.0f} warp-instructions, stall samples {tots:.0f}")
print("by opcode:")
for op, e in by_op.most_common(30):
    print(f"  {op:26s} exec {e / tot * 100:5.1f}%  stall {stall_op[op] / tots * 100:5.1f}%")
print("by execution count (count: instructions at that count, share of executed, share of stalls):")
for c, e in sorted(by_count.items(), key=lambda kv: -kv[1])[:12]:
    print(f"  {c:10.0f}: {n_count[c]:5d} instr  exec {e / tot * 100:5.1f}%  stall {stall_count[c] / tots * 100:5.1f}%")
print("top stall instructions:")
for w, e, s in sorted(lines, reverse=True)[:top_n]:
    print(f"  {w / tots * 100:5.1f}% exec {e:9.0f}  {s[:100]}")
