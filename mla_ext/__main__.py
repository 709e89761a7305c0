"""``python -m mla_ext``: what is installed, every op checked against the reference, and (on a
GPU) the main benchmark cases with the roofline measured in the same run.

Options: ``--quick`` (fewer benchmark cases), ``--no-bench``, ``--json DIR`` (write results).
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch

import mla_ext
from mla_ext.bench import absorb, cache_write
from mla_ext.bench import decode as decode_bench
from mla_ext.bench import sparse as sparse_bench
from mla_ext.bench.harness import forced_portable

# (op name, module with self_check(device) and bench(timer, roofline, quick)); each op joins here.
OPS = [
    (cache_write.NAME, cache_write),
    (decode_bench.NAME, decode_bench),
    (sparse_bench.NAME, sparse_bench),
    (absorb.NAME, absorb),
]


def _environment() -> bool:
    print(f"mla_ext {mla_ext.__version__}  ({mla_ext._library.LIBRARY_PATH})")
    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}")
    if not torch.cuda.is_available():
        print("GPU: none found. The ops run their CPU implementation (the reference); no timings.")
        return False
    props = torch.cuda.get_device_properties(0)
    arch = f"sm{props.major}{props.minor}"
    print(f"GPU: {props.name}, {arch}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB")
    forced = forced_portable()
    sm90 = (props.major, props.minor) == (9, 0) and not forced
    print("kernel paths: portable (mma.sync, cp.async) for every op"
          + (" (MLA_EXT_FORCE_PORTABLE set)" if forced else "")
          + ("; sm90-specific: decode (fp8 caches with <= 32 rows: QK^T on wgmma, TMA tiles; every format"
             " with > 32 rows: wgmma, 16-bit and fp8_ds_mla caches copied by TMA in tile pairs), sparse fp8_ds_mla"
             " (wgmma for 64-head tiles, bulk-copy gather), v_up (wgmma, large T)" if sm90 else ""))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mla_ext", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer benchmark cases")
    parser.add_argument("--no-bench", action="store_true", help="check only, no timings")
    parser.add_argument("--json", metavar="DIR", help="write <op>.json/.md results into DIR")
    args = parser.parse_args(argv)

    has_gpu = _environment()
    device = "cuda" if has_gpu else "cpu"
    failures = 0
    print(f"\nchecks against the reference ({device}):")
    for name, module in OPS:
        try:
            print(f"  {name}: ok, {module.self_check(device)}")
        except Exception:  # report every op, then fail
            failures += 1
            print(f"  {name}: FAILED")
            traceback.print_exc()

    if has_gpu and not args.no_bench:
        from mla_ext.bench.harness import Timer, format_table, measure_roofline, write_results

        timer = Timer()
        roofline = measure_roofline(timer)
        print(f"\nroofline now: copy {roofline.copy_GBps:.0f} GB/s, bf16 matmul {roofline.bf16_mm_TFLOPS:.0f} TFLOPS")
        for name, module in OPS:
            rows = module.bench(timer, roofline, quick=args.quick)
            print("\n" + format_table(rows, name))
            if args.json:
                write_results(name, rows, roofline, args.json)
    print("\nall checks passed" if failures == 0 else f"\n{failures} op(s) FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
