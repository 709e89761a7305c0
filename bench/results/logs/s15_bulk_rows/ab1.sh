#!/usr/bin/env bash
# Session 15 call: portable fp8_ds_mla raw rows by cp.async.bulk (one copy per 16-row quarter) against
# the cp.async raw rows (MLA_EXT_DECODE_BULK_ROWS=0): tests forced portable, sanitizers, alternated bench.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_FLASHMLA_SO=/nonexistent
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
echo "== tests forced portable $(el)"
MLA_EXT_FORCE_PORTABLE=1 timeout 240 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py \
  -k "fp8_ds_mla or ds_mla or row_loaders or fp8_16_rows or one_long or large_batch or cuda_graph or small_for_sanitizer or raw_rows" > "$o/pytest.txt" 2>&1
tail -4 "$o/pytest.txt"
echo "== sanitizers $(el)"
for tool in memcheck racecheck synccheck; do
  MLA_EXT_FORCE_PORTABLE=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or raw_rows_selected" tests/test_decode_gpu.py > "$o/$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$o/$tool.txt" | tail -1) $(grep -E 'passed|failed' "$o/$tool.txt" | tail -1)"
done
echo "== bench $(el)"
for r in 1 2; do
  for v in 1 0; do
    MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_DECODE_BULK_ROWS=$v timeout 120 python3 bench/bench_decode.py --only "fp8_ds_mla memory-bound" > "$o/bench_bulk${v}_r$r.txt" 2>&1
    echo "bulk=$v round $r: $(grep -E '^\| fp8_ds_mla memory' "$o/bench_bulk${v}_r$r.txt" | awk -F'|' '{printf "%s ", $3}') copy: $(grep -o 'copy [0-9]* GB/s' "$o/bench_bulk${v}_r$r.txt")"
  done
done
echo "== done $(el)"
cp "$o"/* "$OUT"/
