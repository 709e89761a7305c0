# Session 17, call 5: the memory-bound decode cases as bench_decode.py times them (decode.bench: roofline first, then
# the cases in order, 5 warm-up calls each), alternated in one process with the same cases timed after ~100 ms of
# their own timed-loop steps (Timer(warmup_ms=100)): is each case, fp8_ds_mla above all, measured in the state the
# previous case left the GPU in? Usage: python warm.py ROOT
import sys, time
sys.path.insert(0, sys.argv[1])
from mla_ext.bench import decode
from mla_ext.bench.harness import Timer, measure_roofline

t0 = time.time()
plain, warm = Timer(iters=50), Timer(iters=50, warmup_ms=100)
roofline = measure_roofline(plain)
print(f"roofline: copy {roofline.copy_GBps:.0f} GB/s, mm {roofline.bf16_mm_TFLOPS:.0f} TFLOPS", flush=True)


def run(tag, timer):
    start = time.time() - t0
    us = {r.case: r.us for r in decode.bench(timer, roofline, only="memory-bound")}
    name = lambda c: f"{c.split()[0]}/{c.split('bs=')[1]}{'/b32' if 'b=32' in c else ''}"
    short = [f"{name(c)} {t:.1f}" for c, t in us.items()]
    ratios = [f"{name(c)[len('fp8_ds_mla/'):]} {us['auto' + c[len('fp8_ds_mla'):]] / t:.3f}x"
              for c, t in us.items() if c.startswith("fp8_ds_mla")]
    print(f"[{start:.0f}-{time.time() - t0:.0f}s] {tag}: " + " | ".join(short) + " || ds/bf16: " + ", ".join(ratios), flush=True)


for r in range(2):
    run("5 warm-up calls", plain)
    run("100 ms warm-up", warm)
