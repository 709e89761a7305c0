"""EXPERIMENT (not kept): one launch each of torch.bmm, the wgmma kernel and TMA candidates at
H=128 T=256 inside the NVTX range mla_ext.profile, for ncu --nvtx-include "mla_ext.profile/"."""
import json
import os
import sys

import torch

from mla_ext.bench.absorb import _weights, L

h, t = int(sys.argv[1]), int(sys.argv[2])
cands = [("wgmma", ""), ("tma128", "")]
if len(sys.argv) > 3 and sys.argv[3] == "--cands":  # kernel:knobs;kernel:knobs
    cands = [tuple((c.split(":", 1) + [""])[:2]) for c in sys.argv[4].split(";")]
elif len(sys.argv) > 3 and os.path.exists(sys.argv[3]):
    rows = json.load(open(sys.argv[3]))["rows"]
    mine = [r for r in rows if r["h"] == h and r["t"] == t and r["kernel"].startswith("tma") and r["knobs"] and "best" in r]
    mine.sort(key=lambda r: r["best"])
    cands += [(r["kernel"], r["knobs"]) for r in mine[:2]]
else:
    cands += [("tma128", "wup=0,first=3")]
print("profiled in order: bmm, " + ", ".join(f"{k} [{kn}]" for k, kn in cands), flush=True)
w = _weights(h, "cuda").w_uv
x = torch.randn(t, h, L, device="cuda", dtype=torch.bfloat16)


def launch(k, kn):
    os.environ["MLA_EXT_VUP_KERNEL"] = k
    os.environ["MLA_EXT_VUP_TMA_KNOBS"] = kn
    if not kn:
        del os.environ["MLA_EXT_VUP_TMA_KNOBS"]
    torch.ops.mla_ext.v_up(x, w, None)


for k, kn in cands:
    launch(k, kn)
torch.bmm(x.transpose(0, 1), w)
torch.cuda.synchronize()
with torch.cuda.nvtx.range("mla_ext.profile"):
    torch.bmm(x.transpose(0, 1), w)
    for k, kn in cands:
        launch(k, kn)
torch.cuda.synchronize()
