# Session 17, call 6: what makes a new fp8_ds_mla case slow in its first ~50 timed calls (warm.py: 100 ms of warm-up
# takes 2.5-3.5% off fp8_ds_mla, nothing off bf16 or fp8)? Calls, time since the cache was written, or the writing
# itself? Same process, plans and graphs kept alive. Usage: python mech.py ROOT
import sys, time
sys.path.insert(0, sys.argv[1])
import torch
from mla_ext.bench.decode import make_inputs, run_op, graphed
from mla_ext.decode import get_decode_plan
from mla_ext.bench.harness import Timer

timer = Timer(iters=50)
n = 1 << 30
src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
dst = torch.empty_like(src)
timer.time_us(lambda: dst.copy_(src))
del src, dst
keep, log = {}, []


def new(name, fmt="fp8_ds_mla", bs=128):
    inp = make_inputs([4096] * 128, 1, 16, bs, fmt)
    plan = get_decode_plan(inp["seq_lens"], 1, 16, fmt)
    keep[name] = (inp, plan, graphed(lambda: run_op(inp, True, plan=plan)))


def t(name, tag=""):
    log.append(f"{name}{tag} {timer.time_us(keep[name][2], name):.1f}")


new("A"); t("A"); t("A"); t("A")
new("B"); t("B"); t("B")
new("C"); torch.cuda.synchronize(); time.sleep(0.5); t("C", "(+0.5s idle)"); t("C")
kv = keep["A"][0]["kv_cache"]
kv.copy_(kv.clone()); torch.cuda.synchronize(); t("A", "(rewritten)"); t("A")
new("bf", "auto"); t("bf"); t("A"); t("B")
new("D"); t("D"); t("D"); t("D")
new("F8", "fp8", 64); t("F8"); t("F8")
print(" | ".join(log), flush=True)
