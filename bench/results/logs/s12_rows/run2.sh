#!/usr/bin/env bash
# Session 12, call 2: the sm90 64-head kernel scaling scores before the max (huge-score test, sparse tests,
# racecheck), 16 threads per gathered row (the kPvRaw default now; MLA_EXT_SPARSE_ROW_THREADS=16 for the
# 16-head and bf16 kernels) under the forced-portable tests and the sanitizers, the A/B of 8 against 16 on
# every portable sparse kernel, and the default-path sparse benchmark.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
timeout 100 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > "$o/pytest_sparse.txt" 2>&1
echo "sparse tests: $(tail -1 "$o/pytest_sparse.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_sparse.txt" | head -12; snap
for rt in "" 16 8; do
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_SPARSE_ROW_THREADS=$rt timeout 100 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py \
    -k "not selects_kernel and not 16_head_paths and not row_threads" > "$o/pytest_portable_rows$rt.txt" 2>&1
  echo "portable tests rows '$rt': $(tail -1 "$o/pytest_portable_rows$rt.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_portable_rows$rt.txt" | head -8; snap
done
sel="small_for_sanitizer or (small_fp8_64_head_paths and portable and not 70) or h16_reads_same_rows_as_h64 or (split_paths_and_odd_heads and 140)"
for tool in memcheck racecheck; do
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_SPARSE_ROW_THREADS=16 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $py -m pytest -q \
    -p no:cacheprovider tests/test_sparse_gpu.py -k "$sel" > "$o/san_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/san_$tool.txt" | tail -1) $(tail -1 "$o/san_$tool.txt") $(el)"; snap
done
timeout 60 $py .wt/s12/scale_sweep.py > "$o/scale_sweep.txt" 2>&1; echo "sweep rc=$? $(el)"; grep "128" "$o/scale_sweep.txt" | cut -c1-300; snap
timeout 200 $py .wt/s12/ab_rows2.py 3 > "$o/ab_rows2.txt" 2>&1; echo "ab rc=$? $(el)"; snap
timeout 60 $py bench/bench_sparse.py --quick > "$o/bench_default.txt" 2>&1; echo "bench default rc=$? $(el)"; snap
echo "== summary $(el)"; tail -1 "$o/pytest_sparse.txt"; for rt in "" 16 8; do tail -1 "$o/pytest_portable_rows$rt.txt"; done
grep -E "^\|" "$o/bench_default.txt" | cut -c1-100
grep -E "^\||rows" "$o/ab_rows2.txt" | grep -v round
