# Session 11 diagnostic: sparse fp8_ds_mla against the fp32 spec as softmax_scale grows (where do the kernels
# start to differ?), per path; also the dense decode's fp8_ds_mla for comparison is not run (time).
import os, sys, torch, math
sys.path.insert(0, 'tests'); sys.path.insert(0, '.')
import mla_ext
from mla_ext import reference
from sparse_cases import make_cache, make_indices
def cosd(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(1 - (a @ b) / (a.norm() * b.norm() + 1e-300))
torch.manual_seed(0)
b, h_q, topk, bs = 2, 128, 700, 64
nb = max(2, (b * 400) // bs)
cache, good, _ = make_cache(nb, bs, "fp8_ds_mla", "cuda")
idx = make_indices(b, 1, topk, good, nb * bs)
q = torch.randn(b, 1, h_q, 576, dtype=torch.bfloat16, device="cuda")
os.environ["MLA_EXT_SPARSE_NUM_SPLITS"] = "1"
for path in ("default", "portable", "pvdequant"):
    os.environ.pop("MLA_EXT_FORCE_PORTABLE", None); os.environ.pop("MLA_EXT_SPARSE_PV_RAW", None)
    if path != "default": os.environ["MLA_EXT_FORCE_PORTABLE"] = "1"
    if path == "pvdequant": os.environ["MLA_EXT_SPARSE_PV_RAW"] = "0"
    for hh in (16, 128):
        qq = q[:, :, :hh].contiguous()
        row = []
        for e in (-4, 8, 12, 14, 16, 18, 20, 22):
            s = 2.0 ** e
            out, lse = mla_ext.sparse_decode_mla(qq, cache, idx, s, "fp8_ds_mla")
            ro, rl = reference.sparse_decode_mla(qq, cache, idx, s, "fp8_ds_mla")
            fin = bool(torch.isfinite(out).all())
            row.append(f"2^{e}: {cosd(out.float(), ro.float()):.1e}{'' if fin else ' NONFINITE'} lse {float((lse - rl).abs().max() / rl.abs().max()):.0e}")
        print(path, hh, " | ".join(row), flush=True)
