#!/usr/bin/env bash
# Session 14, call 6: the partial-score barrier of the mma.sync fp8 16-row kernel split into two 4-warp barriers
# (half = the warps of one kh; base = 1682f18): forced portable A/B (alternating, 3 rounds), then tests, memcheck,
# racecheck and synccheck of the half build.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
gunzip -c .wt/s14/carry/C_before.so.gz > /tmp/C_base.so; gunzip -c .wt/s14/carry/C_half.so.gz > /tmp/C_half.so
use() { cp /tmp/C_$1.so mla_ext/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
for v in base half base half base half; do
  use $v
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "memory-bound" > "$o/ab_$v.txt" 2>&1
  echo "$v: $(grep -E '^\| fp8' "$o/ab_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; cat "$o/ab_$v.txt" >> "$o/ab_all.txt"; snap
done
use half
MLA_EXT_FORCE_PORTABLE=1 timeout 150 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > "$o/pytest_portable.txt" 2>&1
echo "decode tests forced portable: $(tail -1 "$o/pytest_portable.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_portable.txt" | head -10; snap
timeout 100 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py -k "raw_rows or fp8_16 or row_loaders or whole_tile or ds_mla" > "$o/pytest_default.txt" 2>&1
echo "fp8 16-row tests, default env: $(tail -1 "$o/pytest_default.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_default.txt" | head -10; snap
for tool in memcheck racecheck synccheck; do
  MLA_EXT_FORCE_PORTABLE=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or small_whole_tile" tests/test_decode_gpu.py > "$o/san_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/san_$tool.txt" | tail -1) $(tail -1 "$o/san_$tool.txt") $(el)"; snap
done
