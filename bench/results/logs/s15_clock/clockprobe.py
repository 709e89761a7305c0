# Session 15: what SM clock do the portable fp8 16-row decode kernels run at? Runs each case's graphed
# decode back to back for ~2 s while nvidia-smi samples the clocks (printed by the caller).
import os, sys, time, torch
sys.path.insert(0, os.getcwd())
from mla_ext.bench.decode import make_inputs, run_op, graphed
from mla_ext.decode import get_decode_plan
for fmt in sys.argv[1].split(","):
    inp = make_inputs([4096] * 128, 1, 16, 64, fmt)
    plan = get_decode_plan(inp["seq_lens"], 1, 16, fmt)
    replay = graphed(lambda: run_op(inp, True, plan=plan))
    for _ in range(20): replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.time(); n = 0
    print(f"BEGIN {fmt} {time.strftime('%H:%M:%S')}.{int(time.time()*1000)%1000:03d}", flush=True)
    s.record()
    while time.time() - t0 < 2.0:
        for _ in range(200): replay()
        n += 200
        torch.cuda.synchronize()
    e.record(); torch.cuda.synchronize()
    print(f"END {fmt} {time.strftime('%H:%M:%S')}.{int(time.time()*1000)%1000:03d} back-to-back {s.elapsed_time(e)*1000/n:.1f} us/call over {n}", flush=True)
    time.sleep(0.5)
