#!/usr/bin/env bash
# Session 13, call 5: block-table load for the tile after goes out before the tile copies (page-first) in the
# fp8 16-row decode kernel's cp.async path: forced-portable A/B against ba8582a's build (alternated), then the
# decode GPU tests forced portable and memcheck on the small cases with page-first.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
use() { cp .wt/s13/C_$1.so mla_ext/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
for v in base pf base pf; do
  use $v
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "memory-bound b=128 s_q=1 h_q=16 len=4096 bs=64" > "$o/ab_$v.txt" 2>&1
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "fp8_ds_mla memory-bound" >> "$o/ab_$v.txt" 2>&1
  echo "$v: $(grep -E '^\| (fp8|auto)' "$o/ab_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; cat "$o/ab_$v.txt" >> "$o/ab_all.txt"; snap
done
use pf
MLA_EXT_FORCE_PORTABLE=1 timeout 200 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > "$o/pytest_portable.txt" 2>&1
echo "decode tests forced portable: $(tail -1 "$o/pytest_portable.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_portable.txt" | head -10; snap
MLA_EXT_FORCE_PORTABLE=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu \
  -k "small_for_sanitizer or small_whole_tile" tests/test_decode_gpu.py > "$o/san_memcheck.txt" 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$o/san_memcheck.txt" | tail -1) $(tail -1 "$o/san_memcheck.txt") $(el)"; snap
