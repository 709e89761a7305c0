# bs16 / bs64 compute-bound decode with pages shuffled or in order, tile-pairs vs tile-splitting kernel.
import os, sys, torch
sys.path.insert(0, os.getcwd())
from mla_ext.bench.decode import make_inputs, graphed
from mla_ext.bench.harness import Timer
from mla_ext.decode import get_decode_plan
from mla_ext.bench.decode import run_op
timer = Timer(iters=20)
for bs in (16, 32, 64):
    for shuffle in (True, False):
        inp = make_inputs([4096] * 128, 1, 128, bs, "auto", device="cuda", shuffle=shuffle)
        res = []
        for pairs in ("1", "0"):
            os.environ["MLA_EXT_DECODE_PAIRS"] = pairs
            plan = get_decode_plan(inp["seq_lens"], 1, 128, "auto")
            replay = graphed(lambda: run_op(inp, True, plan=plan))
            res.append(timer.time_us(replay, f"bs{bs}"))
        print(f"bs {bs} shuffle {shuffle}: pairs {res[0]:.1f} us, split {res[1]:.1f} us", flush=True)
        del inp
