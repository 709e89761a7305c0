#!/usr/bin/env bash
# Session 14, call 4: where the next tile's copies are issued (before / after the tile's QK^T), forced portable:
# raw = e0cfadf (fp8_ds_mla raw rows: 5 of 11 copies before QK^T; fp8 rows: 4 of 9), before = all before,
# after = all after, more = 8 of 11 / 6 of 9 before. Alternating, two rounds.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
for v in raw before after more; do gunzip -c .wt/s14/carry/C_$v.so.gz > /tmp/C_$v.so; done
use() { cp /tmp/C_$1.so mla_ext/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
for v in raw before after more raw before after more; do
  use $v
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "memory-bound b=128" > "$o/ab_$v.txt" 2>&1
  echo "$v: $(grep -E '^\| fp8' "$o/ab_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; cat "$o/ab_$v.txt" >> "$o/ab_all.txt"; snap
done
