#!/usr/bin/env bash
# Session 14, call 3: on top of the raw-row copies (e0cfadf = raw): v2 = P's A fragments by ldmatrix.x4 and the
# fp8_ds_mla PV scales as two 128-bit loads per tile; v3 = v2 + (raw rows) the block-table read before the first
# half of the copies. Forced portable A/B (alternating), sm90 default once each, then tests of v3.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
for v in raw v2 v3; do gunzip -c .wt/s14/carry/C_$v.so.gz > /tmp/C_$v.so; done
use() { cp /tmp/C_$1.so mla_ext/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
for v in raw v2 v3 raw v2 v3; do
  use $v
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "memory-bound" > "$o/ab_$v.txt" 2>&1
  echo "$v: $(grep -E '^\| fp8' "$o/ab_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; cat "$o/ab_$v.txt" >> "$o/ab_all.txt"; snap
done
for v in raw v3; do
  use $v
  MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "memory-bound b=128" > "$o/sm90_$v.txt" 2>&1
  echo "sm90 default $v: $(grep -E '^\| fp8' "$o/sm90_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; snap
done
use v3
timeout 150 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py -k "raw_rows or fp8_16 or row_loaders or whole_tile or ds_mla" > "$o/pytest_v3_default.txt" 2>&1
echo "v3 fp8 16-row tests, default: $(tail -1 "$o/pytest_v3_default.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_v3_default.txt" | head -10; snap
MLA_EXT_FORCE_PORTABLE=1 timeout 200 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > "$o/pytest_v3_portable.txt" 2>&1
echo "v3 decode tests forced portable: $(tail -1 "$o/pytest_v3_portable.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_v3_portable.txt" | head -10; snap
