#!/usr/bin/env bash
# Session 14, call 1: raw-row copies for the portable fp8_ds_mla 16-row decode kernel: quick correctness,
# same-GPU A/B against main (alternating builds; forced portable and the default sm90 path), then the
# decode GPU tests forced portable, the loader tests and memcheck/racecheck of small cases.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
use() { cp .wt/s14/C_$1.so mla_ext/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
use raw
timeout 150 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py -k "raw_rows or fp8_16_rows_portable or row_loaders" > "$o/pytest_quick.txt" 2>&1
echo "quick tests: $(tail -1 "$o/pytest_quick.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_quick.txt" | head -10; snap
for v in base raw base raw; do
  use $v
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "fp8_ds_mla memory-bound" > "$o/ab_$v.txt" 2>&1
  echo "$v: $(grep -E '^\| fp8_ds_mla' "$o/ab_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; cat "$o/ab_$v.txt" >> "$o/ab_all.txt"; snap
done
for v in base raw; do
  use $v
  MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "memory-bound b=128" > "$o/sm90_$v.txt" 2>&1
  echo "sm90 default $v: $(grep -E '^\| (fp8|auto)' "$o/sm90_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; snap
done
use raw
MLA_EXT_FORCE_PORTABLE=1 timeout 200 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > "$o/pytest_portable.txt" 2>&1
echo "decode tests forced portable: $(tail -1 "$o/pytest_portable.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_portable.txt" | head -10; snap
for tool in memcheck racecheck; do
  MLA_EXT_FORCE_PORTABLE=1 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or small_whole_tile" tests/test_decode_gpu.py > "$o/san_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/san_$tool.txt" | tail -1) $(tail -1 "$o/san_$tool.txt") $(el)"; snap
done
