#!/usr/bin/env bash
# Session 13, call 8: 64-byte-piece copies of fp8_ds_mla rows with 4 threads per row (kGranuleCopies) in the
# portable fp8 16-row decode kernel, against the default 8 threads per row, same build
# (MLA_EXT_DECODE_ROW_THREADS=4 selects it), alternated; then its decode tests, memcheck and racecheck.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
for v in 8 4 8 4; do
  MLA_EXT_DECODE_ROW_THREADS=$v MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "fp8_ds_mla memory-bound" > "$o/ab_$v.txt" 2>&1
  echo "rows$v: $(grep -E '^\| fp8' "$o/ab_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; cat "$o/ab_$v.txt" >> "$o/ab_all.txt"; snap
done
MLA_EXT_DECODE_ROW_THREADS=4 MLA_EXT_FORCE_PORTABLE=1 timeout 200 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py -k "not row_loaders" > "$o/pytest_rows4.txt" 2>&1
echo "decode tests forced portable, 4 threads per row: $(tail -1 "$o/pytest_rows4.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_rows4.txt" | head -10; snap
timeout 200 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py -k "row_loaders" > "$o/pytest_loaders.txt" 2>&1
echo "loader tests: $(tail -1 "$o/pytest_loaders.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_loaders.txt" | head -10; snap
for tool in memcheck racecheck; do
  MLA_EXT_DECODE_ROW_THREADS=4 MLA_EXT_FORCE_PORTABLE=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or small_whole_tile" tests/test_decode_gpu.py > "$o/san_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/san_$tool.txt" | tail -1) $(tail -1 "$o/san_$tool.txt") $(el)"; snap
done
