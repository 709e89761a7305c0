#!/usr/bin/env bash
# Session 17, call 9 (cdf899c's library): racecheck and synccheck of the forced-portable small cases (single-piece
# CTAs: every block size through the fp8 16-row kernel), the default path's tests of the mma.sync fp8 kernel (fp16 q
# on sm90), then bench/gpu_check.sh's bench part (Nsight Compute runs and every benchmark).
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent MLA_EXT_COMMIT=cdf899c
o=$OUT/checks; mkdir -p $o; t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
export PYTHONPATH=$PWD:$PWD/tests
for tool in racecheck synccheck; do
  MLA_EXT_FORCE_PORTABLE=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or small_whole_tile" tests/test_decode_gpu.py > "$o/$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$o/$tool.txt" | tail -1) $(grep -E 'passed|failed' "$o/$tool.txt" | tail -1) $(el)"
done
timeout 60 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py -k "fp16 or fp8_16_rows_portable or raw_rows or long_pieces or row_loaders" > "$o/pytest_default.txt" 2>&1
echo "default-path tests: $(tail -1 "$o/pytest_default.txt") $(el)"
mkdir -p $OUT/b; timeout 280 bash bench/gpu_check.sh $OUT/b bench > $OUT/b/run.txt 2>&1; echo "bench rc=$? $(el)"
grep -E "of copy|faster|FAILED" $OUT/b/run.txt | tail -16
