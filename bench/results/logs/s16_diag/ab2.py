# Session 16, call 2: one build's memory-bound portable decode cases, timed as the harness does (cold L2,
# 50k-cycle spin, event pair around the graphed call, median of 60) plus the torch profiler's GPU timeline of
# the same loop (split kernel time, and from its end to the end of combine). No matmul roofline in the same
# process (it heats the GPU and slowed the cycle-bound fp8 kernels by up to 15% right after it, call 1);
# the copy roofline is measured first. Usage: python ab2.py ROOT LABEL [fmt:b:len:bs,...]
import os, statistics, sys
sys.path.insert(0, sys.argv[1])
import torch
import mla_ext
from mla_ext.bench.decode import make_inputs, run_op, graphed
from mla_ext.decode import get_decode_plan
from mla_ext.bench.harness import Timer

assert os.path.dirname(mla_ext.__file__).startswith(os.path.abspath(sys.argv[1])), mla_ext.__file__
label = sys.argv[2]
cases = (sys.argv[3] if len(sys.argv) > 3 else
         "fp8_ds_mla:128:4096:64,fp8_ds_mla:128:4096:128,fp8_ds_mla:32:16384:64,fp8:128:4096:64,"
         "auto:128:4096:64,auto:128:4096:128,auto:32:16384:64").split(",")
timer = Timer(iters=60)
n = 1 << 30
src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
dst = torch.empty_like(src)
copy = 2 * n / (timer.time_us(lambda: dst.copy_(src), "copy") * 1e-6) / 1e9
del src, dst


def timeline(fn, iters=12):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            timer.flush_l2()
            torch.cuda._sleep(50_000)
            fn()
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.time_range.start)
    split, tail = [], []
    for i, e in enumerate(ev):
        if "decode_split" in e.name:
            comb = next((x for x in ev[i + 1:i + 3] if "combine" in x.name), None)
            split.append(e.time_range.end - e.time_range.start)
            if comb is not None:
                tail.append(comb.time_range.end - e.time_range.end)
    return statistics.median(split), statistics.median(tail) if tail else float("nan")


out = []
for c in cases:
    fmt, b, ln, bs = c.split(":")
    b, ln, bs = int(b), int(ln), int(bs)
    inp = make_inputs([ln] * b, 1, 16, bs, fmt)
    plan = get_decode_plan(inp["seq_lens"], 1, 16, fmt)
    replay = graphed(lambda: run_op(inp, True, plan=plan))
    us = timer.time_us(replay, f"ab.{fmt}")
    split, tail = timeline(replay)
    nbytes = b * ln * inp["kv_cache"].stride(1) * inp["kv_cache"].element_size() + inp["q"].numel() * 2 * (1 + 512 / 576)
    out.append(f"{fmt}/b{b}x{ln}/bs{bs} {us:.1f} ({nbytes / (us * 1e-6) / 1e9 / copy:.3f}; split {split:.1f} tail {tail:.1f})")
    del replay, inp
print(f"AB {label}: copy {copy:.0f} | " + " | ".join(out), flush=True)
