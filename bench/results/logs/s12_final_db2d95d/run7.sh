#!/usr/bin/env bash
# Session 12, call 7: the final build (db2d95d): every GPU test, memcheck on the small cases, the portable sparse benchmark.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); find "$o" -mindepth 1 -delete
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$o/gpu.txt"
timeout 120 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests > "$o/pytest.txt" 2>&1; echo "tests: $(tail -1 "$o/pytest.txt")"; grep -E "^FAILED" "$o/pytest.txt" | head; snap
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider \
  -m gpu -k "sanitizer or small or padding_and_int32 or empty_cache" tests > "$o/memcheck.txt" 2>&1
echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1) $(grep -E 'passed|failed' "$o/memcheck.txt" | tail -1)"; snap
MLA_EXT_FORCE_PORTABLE=1 timeout 60 $py bench/bench_sparse.py --quick > "$o/bench_sparse_portable.txt" 2>&1; grep -E "^\| fp8|h_q 16 / h_q 64|roofline" "$o/bench_sparse_portable.txt" | grep -v Flash | cut -c1-110; snap
