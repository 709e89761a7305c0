#!/usr/bin/env python3
"""One screen of the benchmark results in a folder: per result file its commit, GPU and headline.

    python bench/summarize.py [DIR]      # default bench/results

Reads only the JSON files the bench scripts write (no GPU, no mla_ext import).
"""

from __future__ import annotations

import json
import math
import os
import sys


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _versus_peer(rows: list[dict]) -> str:
    parts = []
    for fmt in sorted({r.get("format", "") for r in rows}, key=lambda f: f != "auto"):
        pairs = [(r["peer_us"], r["mla_ext_us"]) for r in rows if r.get("format", "") == fmt and r.get("peer_us")]
        if pairs:
            parts.append(f"{fmt or 'rows'}: {_geomean([p / m for p, m in pairs]):.2f}x FlashMLA (geomean), faster in "
                         f"{sum(p > m for p, m in pairs)}/{len(pairs)}")
        else:
            parts.append(f"{fmt or 'rows'}: no peer time")
    failed = sum("check_failed" in r for r in rows)
    return "; ".join(parts) + (f"; {failed} check(s) FAILED" if failed else "")


def _headline(name: str, doc: dict) -> str:
    rows = doc.get("rows", [])
    if name.startswith(("decode_", "sparse_")):
        return _versus_peer(rows)
    if name == "host":
        judged = [r for r in rows if r.get("met") is not None]
        missed = [r["op"] for r in judged if not r["met"]]
        not_met = f" (not met: {', '.join(missed)})" if missed else ""
        return f"bars met {len(judged) - len(missed)}/{len(judged)}{not_met}"
    if name == "absorb":
        ops = [r for r in rows if "speedup" in r]
        if not ops:
            return f"{len(rows)} rows"
        worst = min(ops, key=lambda r: r["speedup"])
        best = max(r["speedup"] for r in ops)
        return f"speed-up over PyTorch {worst['speedup']:.2f}x ({worst['case']}) to {best:.2f}x"
    if name == "cache_write":
        big = [r for r in rows if r.get("case", "").endswith("T=65536")]
        if big:
            fracs = ", ".join(f"{r['case'][:-len(' T=65536')]} {r['roofline_frac']:.2f}" for r in big)
            return f"65536 tokens: {fracs} of copy"
    return f"{len(rows)} rows"


def main(argv: list[str]) -> int:
    folder = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    names = sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".json")) if os.path.isdir(folder) else []
    if not names:
        print(f"no results in {folder}")
        return 1
    width = max(len(n) for n in names)
    for name in names:
        try:
            with open(os.path.join(folder, name + ".json")) as f:
                doc = json.load(f)
            print(f"{name:{width}s}  {doc.get('commit', '?'):>9s}  {doc.get('date', '?')}  {_headline(name, doc)}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{name:{width}s}  unreadable ({e})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
