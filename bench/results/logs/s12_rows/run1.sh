#!/usr/bin/env bash
# Session 12, call 1: every GPU test (the fixed spec, the sm90 64-head row max rounded up, the huge-score
# test back in tests/), the row-gather variants of the portable kPvRaw kernel (16, 32 = row runs) under the
# forced-portable sparse tests and memcheck/racecheck, the scale sweep, then the same-process A/B.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
timeout 150 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests > "$o/pytest_all.txt" 2>&1
echo "tests all: $(tail -1 "$o/pytest_all.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_all.txt" | head -16; snap
for rt in 32 16; do
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_SPARSE_ROW_THREADS=$rt timeout 100 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py \
    -k "not selects_kernel and not 16_head_paths and not row_threads and not pvdequant" > "$o/pytest_rows$rt.txt" 2>&1
  echo "tests portable rows $rt: $(tail -1 "$o/pytest_rows$rt.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_rows$rt.txt" | head -8; snap
done
for tool in memcheck racecheck; do
  MLA_EXT_SPARSE_ROW_THREADS=32 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $py -m pytest -q -x -p no:cacheprovider tests/test_sparse_gpu.py \
    -k "test_small_fp8_64_head_paths and (1-128-2-portable or 3-40-3-portable)" > "$o/san_rows32_$tool.txt" 2>&1
  echo "$tool rows 32 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/san_rows32_$tool.txt" | tail -1) $(tail -1 "$o/san_rows32_$tool.txt") $(el)"; snap
done
timeout 60 $py .wt/s12/scale_sweep.py > "$o/scale_sweep.txt" 2>&1; echo "sweep rc=$? $(el)"; cat "$o/scale_sweep.txt" | cut -c1-400; snap
timeout 120 $py .wt/s12/ab_rows.py 4 8,16,32 > "$o/ab_rows.txt" 2>&1; echo "ab rc=$? $(el)"; snap
echo "== summary $(el)"; tail -1 "$o/pytest_all.txt"; tail -1 "$o/pytest_rows32.txt"; tail -1 "$o/pytest_rows16.txt"
tail -6 "$o/ab_rows.txt"
