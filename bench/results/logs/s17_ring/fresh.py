# Session 17, call 4: why is a freshly made fp8_ds_mla case ~3% slower in its first timing than when timed again
# later (ds_order.py)? Batches of 10 timed calls right after creation, each after an SM clock probe (a 400k-cycle
# torch.cuda._sleep timed with events: cycles / us = MHz). Variants: new inputs (make_inputs), a new graph over old
# inputs, a clone of old inputs (new memory, same bytes). Usage: python fresh.py ROOT
import statistics, sys
sys.path.insert(0, sys.argv[1])
import torch
from mla_ext.bench.decode import make_inputs, run_op, graphed
from mla_ext.decode import get_decode_plan
from mla_ext.bench.harness import Timer

timer = Timer(warmup=2, iters=10)
n = 1 << 30
src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
dst = torch.empty_like(src)
timer.time_us(lambda: dst.copy_(src))
del src, dst


def mhz():
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); torch.cuda._sleep(400_000); e.record(); torch.cuda.synchronize()
    return 400_000 / (s.elapsed_time(e) * 1e3)


def graph_of(inp, fmt):
    plan = get_decode_plan(inp["seq_lens"], 1, 16, fmt)
    return graphed(lambda: run_op(inp, True, plan=plan))


def batches(tag, g, k=8):
    out = []
    for _ in range(k):
        f = mhz()
        out.append(f"{timer.time_us(g):.1f}@{f:.0f}")
    print(f"{tag}: " + " ".join(out), flush=True)


ds1 = make_inputs([4096] * 128, 1, 16, 128, "fp8_ds_mla"); g1 = graph_of(ds1, "fp8_ds_mla")
batches("ds1 new", g1)
bf = make_inputs([4096] * 128, 1, 16, 128, "auto"); gb = graph_of(bf, "auto")
batches("bf new", gb, 4)
ds2 = make_inputs([4096] * 128, 1, 16, 128, "fp8_ds_mla"); g2 = graph_of(ds2, "fp8_ds_mla")
batches("ds2 new (after bf)", g2)
batches("ds1 again", g1, 3)
g2b = graph_of(ds2, "fp8_ds_mla")
batches("ds2 new graph, old inputs", g2b, 4)
ds3 = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in ds1.items()}; g3 = graph_of(ds3, "fp8_ds_mla")
batches("ds1 cloned (new memory)", g3, 4)
batches("bf again", gb, 2)
ds4 = make_inputs([4096] * 128, 1, 16, 128, "fp8_ds_mla"); g4 = graph_of(ds4, "fp8_ds_mla")
batches("ds4 new (after bf)", g4)
batches("ds2 again", g2, 3)
