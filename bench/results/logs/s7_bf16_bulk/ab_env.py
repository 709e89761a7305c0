"""A/B of a kernel-selecting environment variable in one process, same indices, alternating:
python ab_env.py ROOT VAR v1,v2 [fmt]. Times b128 s_q1 h_q16 topk 2048 per value, then h_q 64 on the same indices."""
import os, sys
root, var, values = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
fmt = sys.argv[4] if len(sys.argv) > 4 else "auto"
sys.path.insert(0, root)
import torch  # noqa
import mla_ext  # noqa
from mla_ext.bench import sparse as S  # noqa
from mla_ext.bench.harness import Timer, measure_roofline  # noqa

timer = Timer()
rf = measure_roofline(timer)
print(f"root {root} fmt {fmt}: copy {rf.copy_GBps:.0f} GB/s, bf16 mm {rf.bf16_mm_TFLOPS:.0f} TFLOPS")
cache, table = S._pool(128, fmt)
idx = S._indices(128, 1, table)
q16 = torch.randn(128, 1, 16, 576, dtype=torch.bfloat16, device="cuda")
q64 = torch.randn(128, 1, 64, 576, dtype=torch.bfloat16, device="cuda")
f16 = lambda: torch.ops.mla_ext.sparse_decode_mla(q16, cache, idx, S.SOFTMAX_SCALE, fmt, None, None)  # noqa
f64 = lambda: torch.ops.mla_ext.sparse_decode_mla(q64, cache, idx, S.SOFTMAX_SCALE, fmt, None, None)  # noqa
ref = None
for rep in range(int(os.environ.get("REPS", "3"))):
    line = []
    for v in values:
        os.environ[var] = v
        o16, _ = f16()
        if ref is None:
            ref = o16.float()
        else:
            assert (o16.float() - ref).abs().max() < 2e-2, "outputs differ between paths"
        line.append(f"{var}={v} h16 {timer.time_us(f16, 'h16'):.1f}")
    os.environ.pop(var, None)
    line.append(f"h64 {timer.time_us(f64, 'h64'):.1f}")
    print(f"rep {rep}: " + "  ".join(line), flush=True)
