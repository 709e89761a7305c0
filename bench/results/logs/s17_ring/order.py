# Session 17, call 2: the memory-bound decode cases, timed as bench_decode.py does (decode.bench), four times in one
# process: right after the copy + matmul roofline (bench_decode.py's order), again at once, after 10 s idle, and right
# after another 55 runs of the 8192^3 matmul. Question: does the roofline's matmul slow the cycle-bound fp8 kernels
# measured after it (session 16 saw 5-15% in A/Bs), and how do the fp8_ds_mla vs bf16 ratios move?
# Usage: python order.py ROOT   (MLA_EXT_FORCE_PORTABLE=1 for the portable kernels)
import sys, time
sys.path.insert(0, sys.argv[1])
import torch
from mla_ext.bench import decode
from mla_ext.bench.harness import Timer, measure_roofline

t0 = time.time()
timer = Timer(iters=50)
roofline = measure_roofline(timer)
print(f"[{time.time() - t0:.1f}s] roofline: copy {roofline.copy_GBps:.0f} GB/s, mm {roofline.bf16_mm_TFLOPS:.0f} TFLOPS", flush=True)


def run(tag):
    start = time.time() - t0
    rows = decode.bench(timer, roofline, only="memory-bound")
    us = {r.case: r.us for r in rows}
    short = []
    for case, t in us.items():
        fmt = case.split()[0]
        short.append(f"{fmt}/{case.split('bs=')[1]}{'/b32' if 'b=32' in case else ''} {t:.1f}")
    ratios = []
    for case, t in us.items():
        if case.startswith("fp8_ds_mla"):
            twin = us.get("auto" + case[len("fp8_ds_mla"):])
            if twin:
                ratios.append(f"bs{case.split('bs=')[1]}{'/b32' if 'b=32' in case else ''} {twin / t:.3f}x")
    print(f"[{start:.1f}-{time.time() - t0:.1f}s] {tag}: " + " | ".join(short) + " || ds/bf16: " + ", ".join(ratios), flush=True)


run("after roofline")
run("again")
time.sleep(10)
run("after 10 s idle")
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
timer.time_us(lambda: torch.mm(a, b), "mm")
del a, b
run("after matmul")
