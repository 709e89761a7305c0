# Session 16: one build's decode times for the memory-bound portable cases (the harness's Timer: cold L2,
# median of many), for alternated A/B runs of builds in separate processes.
# Usage: python ab.py ROOT LABEL [CASES]  (ROOT holds mla_ext/ with the build's library)
import os, sys
sys.path.insert(0, sys.argv[1])
import torch
import mla_ext
from mla_ext.bench.decode import make_inputs, run_op, graphed
from mla_ext.decode import get_decode_plan
from mla_ext.bench.harness import Timer, measure_roofline

assert os.path.dirname(mla_ext.__file__).startswith(os.path.abspath(sys.argv[1])), mla_ext.__file__
label = sys.argv[2]
cases = sys.argv[3].split(",") if len(sys.argv) > 3 else ["fp8_ds_mla:128:4096:64", "fp8_ds_mla:128:4096:128",
                                                          "fp8_ds_mla:32:16384:64", "fp8:128:4096:64",
                                                          "auto:32:16384:64"]
from mla_ext.bench.decode import run_reference, compare
for fmt in ("fp8_ds_mla", "fp8"):  # a quick check that the build computes the right thing
    for bs in (64, 16):
        inp = make_inputs([0, 100, 700, 4096, 129], 1, 16, bs, fmt)
        cos, lse_err = compare(*run_op(inp, True), *run_reference(inp, True))
        assert cos < 1e-5 and lse_err < 2e-3, (label, fmt, bs, cos, lse_err)
timer = Timer()
roof = measure_roofline(timer)
out = []
for c in cases:
    fmt, b, n, bs = c.split(":")
    b, n, bs = int(b), int(n), int(bs)
    inp = make_inputs([n] * b, 1, 16, bs, fmt)
    plan = get_decode_plan(inp["seq_lens"], 1, 16, fmt)
    replay = graphed(lambda: run_op(inp, True, plan=plan))
    us = timer.time_us(replay, f"ab.{fmt}")
    nbytes = b * n * inp["kv_cache"].stride(1) * inp["kv_cache"].element_size() + inp["q"].numel() * 2 * (1 + 512 / 576)
    out.append(f"{fmt}/b{b}x{n}/bs{bs} {us:.1f} ({nbytes / (us * 1e-6) / 1e9 / roof.copy_GBps:.3f})")
    del replay, inp
print(f"AB {label}: copy {roof.copy_GBps:.0f} | " + " | ".join(out), flush=True)
