#!/usr/bin/env bash
# Session 15: synccheck / racecheck / memcheck of the bulk raw-row kernel (tests without the torch profiler).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); find "$o" -mindepth 1 -delete
for tool in synccheck memcheck racecheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  MLA_EXT_FORCE_PORTABLE=1 timeout 200 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or (small_whole_tile and fp8_ds_mla) or (fp8_16_rows_portable_kernel and fp8_ds_mla and 16-)" tests/test_decode_gpu.py > "$o/$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$o/$tool.txt" | tail -1) $(grep -E 'passed|failed' "$o/$tool.txt" | tail -1)"
done
grep -B2 -A12 "=========" "$o/synccheck.txt" | head -60
cp "$o"/* "$OUT"/
