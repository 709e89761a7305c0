#!/bin/bash
# One device run (from the repository root: bench/run_sparse_gpu.sh): GPU tests, compute-sanitizer on the small case, benchmark. Prints a short table last.
export PYTHONPATH=.:tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 150 python3 -m pytest -q --tb=line tests/test_sparse_gpu.py 2>&1 | tail -40
timeout 100 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -q --tb=line -k small tests/test_sparse_gpu.py 2>&1 | tail -6
MLA_EXT_COMMIT=$(cat COMMIT 2>/dev/null) timeout 200 python3 bench/bench_sparse.py --json $OUT 2>&1 | tail -20
