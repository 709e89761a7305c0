"""EXPERIMENT (device run 2): v_up kernels and producer-schedule / L2-promotion knobs
(MLA_EXT_VUP_TMA_KNOBS) next to torch.bmm, cold L2, median per timing, several interleaved reps."""
from __future__ import annotations

import json
import os
import sys

import torch

from mla_ext.bench.absorb import _weights, L
from mla_ext.bench.harness import Timer, measure_roofline

out_dir = sys.argv[1]
timer = Timer()
roof = measure_roofline(timer)
print(f"roofline: copy {roof.copy_GBps:.0f} GB/s, mm {roof.bf16_mm_TFLOPS:.0f} TFLOPS", flush=True)
rows = []


def run(kernel, knobs, x, w, scale):
    if kernel == "auto":
        return timer.time_us(lambda: torch.ops.mla_ext.v_up(x, w, scale), "v_up")
    if kernel == "bmm":
        return timer.time_us(lambda: torch.bmm(x.transpose(0, 1), w), "bmm")
    env = {"MLA_EXT_VUP_KERNEL": kernel, "MLA_EXT_VUP_TMA_KNOBS": knobs}
    for k, v in env.items():
        if v:
            os.environ[k] = v
    try:
        return timer.time_us(lambda: torch.ops.mla_ext.v_up(x, w, scale), "v_up")
    finally:
        for k in env:
            os.environ.pop(k, None)


def case(h, t, cands, reps, fp8=False):
    ws = _weights(h, "cuda")
    w, scale = ws.uv(fp8)
    x = torch.randn(t, h, L, device="cuda", dtype=torch.bfloat16)
    res = {}
    for _ in range(reps):
        res.setdefault(("bmm", ""), []).append(run("bmm", "", x, ws.w_uv, None))
        for k, kn in cands:
            res.setdefault((k, kn), []).append(run(k, kn, x, w, scale))
    med = lambda v: sorted(v)[len(v) // 2]
    bmm = med(res[("bmm", "")])
    print(f"== H={h} T={t} {'fp8' if fp8 else 'bf16'} (median of {reps} reps; x = bmm median / median)", flush=True)
    for (k, kn), v in sorted(res.items(), key=lambda kv: med(kv[1])):
        print(f"  {k:12s} {kn:34s} med {med(v):7.2f}  x{bmm / med(v):.3f}  [{' '.join(f'{u:.2f}' for u in v)}]", flush=True)
        rows.append(dict(h=h, t=t, fp8=fp8, kernel=k, knobs=kn, us=[round(u, 3) for u in v], median=round(med(v), 3),
                         vs_bmm=round(bmm / med(v), 3)))
    del x


A = ""  # automatic choice
case(128, 256, [("auto", A), ("wgmma", ""), ("tma64", ""), ("tma128", ""), ("tma64p", ""), ("tma128p", ""),
                ("tma64p", "wpromo=256"), ("tma64p", "promo=0,wpromo=0"), ("tma64p", "pace=0,first=12"), ("tma64p", "first=3"),
                ("tma64p", "first=6"), ("tma64p", "first=8"), ("tma128p", "wpromo=256"), ("tma128p", "later=4")], reps=5)
case(128, 64, [("auto", A), ("tmas", "promo=128"), ("tmas", "promo=128,wpromo=128"), ("tma64", ""), ("tma64p", ""),
               ("tma64p", "wpromo=256"), ("tma64p", "pace=0,first=12")], reps=5)
case(128, 128, [("auto", A), ("tma64p", ""), ("tma128p", ""), ("tma64p", "wpromo=256")], reps=3)
case(128, 256, [("auto", A), ("tma64p", ""), ("tma128p", "")], reps=3, fp8=True)
for t in (512, 1024, 8192):
    case(128, t, [("auto", A), ("tma128", "promo=128"), ("tma128", "promo=128,wpromo=128"), ("tma64", ""), ("tma64p", ""),
                  ("tma128p", "")], reps=2 if t == 8192 else 3)
for t in (64, 128, 256):
    case(16, t, [("auto", A), ("tmas", "promo=128"), ("tmas", "promo=128,wpromo=128")], reps=3)
for t in (512, 8192):
    case(16, t, [("auto", A), ("tma64", "promo=128"), ("tma128", "promo=128"), ("tma64p", "")], reps=2)
json.dump(dict(roofline=roof.__dict__, gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(out_dir, "sweep2.json"), "w"), indent=1)
