"""Session 7 A/B: bf16 16-head sparse decode, ring of 5 32-key K slots (MLA_EXT_SPARSE_BF16_RING=1) vs
2 K buffers (=0), same process, same indices, alternating; plus h_q 64 on the same indices."""
import os, sys
root = sys.argv[1]
sys.path.insert(0, root)
import torch  # noqa
import mla_ext  # noqa
from mla_ext.bench import sparse as S  # noqa
from mla_ext.bench.harness import Timer, measure_roofline  # noqa

timer = Timer()
rf = measure_roofline(timer)
print(f"root {root}: copy {rf.copy_GBps:.0f} GB/s, bf16 mm {rf.bf16_mm_TFLOPS:.0f} TFLOPS")
cache, table = S._pool(128, "auto")
idx = S._indices(128, 1, table)
q16 = torch.randn(128, 1, 16, 576, dtype=torch.bfloat16, device="cuda")
q64 = torch.randn(128, 1, 64, 576, dtype=torch.bfloat16, device="cuda")
f16 = lambda: torch.ops.mla_ext.sparse_decode_mla(q16, cache, idx, S.SOFTMAX_SCALE, "auto", None, None)  # noqa
f64 = lambda: torch.ops.mla_ext.sparse_decode_mla(q64, cache, idx, S.SOFTMAX_SCALE, "auto", None, None)  # noqa
modes = ["1", "0"] if len(sys.argv) < 3 else sys.argv[2].split(",")
ref = None
for rep in range(int(os.environ.get("REPS", "3"))):
    line = []
    for m in modes:
        os.environ["MLA_EXT_SPARSE_BF16_RING"] = m
        o16, l16 = f16()
        if ref is None:
            ref = (o16.float(), l16)
        else:
            assert (o16.float() - ref[0]).abs().max() < 2e-2, "outputs differ between paths"
        line.append(f"ring={m} h16 {timer.time_us(f16, 'h16'):.1f}")
    t64 = timer.time_us(f64, "h64")
    line.append(f"h64 {t64:.1f}")
    print(f"rep {rep}: " + "  ".join(line), flush=True)
