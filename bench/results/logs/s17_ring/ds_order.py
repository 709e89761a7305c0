# Session 17, call 3: fp8_ds_mla b128 x 4096 measured 111 us in ab2.py (session 16's A/B script) but 113.5-114 us in
# decode.bench (bench_decode.py) on the same build, while bf16 and fp8 agreed. Is it the inputs (each make_inputs draws
# a new random cache and page order) or what ran before in the process? Same process: graphs A.. kept alive and
# re-timed. Usage: python ds_order.py ROOT
import sys
sys.path.insert(0, sys.argv[1])
import torch
from mla_ext.bench.decode import make_inputs, run_op, graphed
from mla_ext.decode import get_decode_plan
from mla_ext.bench.harness import Timer

timer = Timer(iters=50)
n = 1 << 30
src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
dst = torch.empty_like(src)
print(f"copy {2 * n / (timer.time_us(lambda: dst.copy_(src), 'copy') * 1e-6) / 1e9:.0f} GB/s", flush=True)
del src, dst
graphs = {}


def new(name, fmt, bs, **kw):
    inp = make_inputs([4096] * 128, 1, 16, bs, fmt, **kw)
    plan = get_decode_plan(inp["seq_lens"], 1, 16, fmt)
    graphs[name] = (inp, plan, graphed(lambda: run_op(inp, True, plan=plan)))


log = []


def t(name):
    us = timer.time_us(graphs[name][2], name)
    log.append(f"{name} {us:.1f}")


new("ds1", "fp8_ds_mla", 128); t("ds1"); t("ds1")
new("bf", "auto", 128); t("bf"); t("ds1")
new("ds2", "fp8_ds_mla", 128); t("ds2"); t("ds1")
new("ds3", "fp8_ds_mla", 128); t("ds3")
new("ds4", "fp8_ds_mla", 128, shuffle=False); t("ds4")
new("fp8", "fp8", 64); t("fp8"); t("ds1"); t("ds2"); t("ds3"); t("ds4"); t("bf"); t("ds1")
print(" | ".join(log), flush=True)
