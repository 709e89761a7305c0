"""EXPERIMENT (not kept): time the resident-weight TMA v_up kernels under producer-schedule knobs
(MLA_EXT_VUP_TMA_KNOBS) next to torch.bmm and the cp.async wgmma kernel, cold L2, median."""
from __future__ import annotations

import itertools
import json
import os
import sys

import torch

from mla_ext.bench.absorb import _weights, L, P, V
from mla_ext.bench.harness import Timer, measure_roofline

out_dir = sys.argv[1]
timer = Timer()
roof = measure_roofline(timer)
print(f"roofline: copy {roof.copy_GBps:.0f} GB/s, mm {roof.bf16_mm_TFLOPS:.0f} TFLOPS", flush=True)
rows = []


def t_us(fn, name):
    return timer.time_us(fn, name)


def run(kernel, knobs, x, w):
    os.environ["MLA_EXT_VUP_KERNEL"] = kernel
    if knobs:
        os.environ["MLA_EXT_VUP_TMA_KNOBS"] = knobs
    else:
        os.environ.pop("MLA_EXT_VUP_TMA_KNOBS", None)
    try:
        return t_us(lambda: torch.ops.mla_ext.v_up(x, w, None), "knob")
    finally:
        os.environ.pop("MLA_EXT_VUP_KERNEL", None)
        os.environ.pop("MLA_EXT_VUP_TMA_KNOBS", None)


def grid(kernel, full):
    s = 6 if kernel == "tma128" else 12
    firsts = (2, 3, 4, 6) if kernel == "tma128" else (3, 4, 6, 8, 12)
    combos = [""]  # default = old schedule
    for wup, first in itertools.product((0, 1), firsts):
        combos.append(f"wup={wup},first={first}")
    if full:
        for first, later, rot, hint, promo in itertools.product(firsts, (s // 2 + 1, s), (0, 1), (0, 1), (128, 256)):
            combos.append(f"wup=0,first={first},later={later},rot={rot},hint={hint},promo={promo}")
    return combos


def case(h, t, kernels, full, reps=1):
    w = _weights(h, "cuda").w_uv
    x = torch.randn(t, h, L, device="cuda", dtype=torch.bfloat16)
    res = {}
    for rep in range(reps):
        res.setdefault(("bmm", ""), []).append(t_us(lambda: torch.bmm(x.transpose(0, 1), w), "bmm"))
        for k in ("wgmma", "tmas:64x128", "tmas"):
            res.setdefault((k, ""), []).append(run(k, "", x, w))
        for k in kernels:
            for knobs in grid(k, full):
                res.setdefault((k, knobs), []).append(run(k, knobs, x, w))
    bmm = min(res[("bmm", "")])
    for (k, knobs), v in sorted(res.items(), key=lambda kv: min(kv[1])):
        rows.append(dict(h=h, t=t, kernel=k, knobs=knobs, us=[round(u, 3) for u in v], best=round(min(v), 3),
                         vs_bmm=round(bmm / min(v), 3)))
    top = sorted(res.items(), key=lambda kv: min(kv[1]))[:12]
    print(f"== H={h} T={t}: bmm {res[('bmm','')]}", flush=True)
    for (k, knobs), v in top:
        print(f"  {k:12s} {knobs:50s} {' '.join(f'{u:7.2f}' for u in v)}  x{bmm / min(v):.3f}", flush=True)
    return res


r256 = case(128, 256, ("tma128", "tma64"), full=True)
# the best 10 at H=128 T=256, again, 3 more times interleaved with bmm
best = [kv[0] for kv in sorted(r256.items(), key=lambda kv: min(kv[1])) if kv[0][0].startswith("tma")][:10]
w = _weights(128, "cuda").w_uv
x = torch.randn(256, 128, L, device="cuda", dtype=torch.bfloat16)
confirm = {}
for rep in range(3):
    confirm.setdefault(("bmm", ""), []).append(t_us(lambda: torch.bmm(x.transpose(0, 1), w), "bmm"))
    confirm.setdefault(("wgmma", ""), []).append(run("wgmma", "", x, w))
    for k, knobs in best:
        confirm.setdefault((k, knobs), []).append(run(k, knobs, x, w))
print("== confirm H=128 T=256 (3 reps)", flush=True)
for (k, knobs), v in sorted(confirm.items(), key=lambda kv: sorted(kv[1])[1]):
    print(f"  {k:12s} {knobs:50s} {' '.join(f'{u:7.2f}' for u in v)}", flush=True)
    rows.append(dict(h=128, t=256, kernel=k, knobs=knobs, us=[round(u, 3) for u in v], confirm=True))
del x
for h, t in ((128, 64), (128, 128), (128, 512), (16, 256), (128, 8192), (128, 1)):
    case(h, t, ("tma128", "tma64"), full=False, reps=2)
json.dump(dict(roofline=roof.__dict__, gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(out_dir, "knob_sweep.json"), "w"), indent=1)
