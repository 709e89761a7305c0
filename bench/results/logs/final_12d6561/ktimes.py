# Session 15: per-kernel GPU times (torch profiler) of one graphed decode step, forced portable:
# split kernel and combine of fp8_ds_mla b32 x 16K against b128 x 4096, and the planner's shape.
import os, sys, torch
sys.path.insert(0, os.getcwd())
from mla_ext.bench.decode import make_inputs, run_op, graphed
from mla_ext.decode import get_decode_plan
for b, n in ((128, 4096), (32, 16384)):
    for fmt in ("fp8_ds_mla", "auto"):
        inp = make_inputs([n] * b, 1, 16, 64, fmt)
        plan = get_decode_plan(inp["seq_lens"], 1, 16, fmt)
        replay = graphed(lambda: run_op(inp, True, plan=plan))
        for _ in range(5): replay()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20): replay()
            torch.cuda.synchronize()
        agg = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                k = e.name.split("<")[0].split("(")[0][-40:]
                agg.setdefault(k, []).append(e.device_time)
        print(f"{fmt} b{b} x {n}:", ", ".join(f"{k} {sorted(v)[len(v)//2]:.1f} us x{len(v)//20}" for k, v in agg.items()))
