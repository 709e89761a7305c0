#!/usr/bin/env bash
# Session 15 call: sanitizers of the bulk raw-row kernel, then bulk copies issued at the tile's start
# (C_bulk) against after its QK^T (C_bulk_late), alternated, forced portable.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_FLASHMLA_SO=/nonexistent
d=.wt/s15c/carry; for v in bulk bulk_late; do gunzip -c $d/C_$v.so.gz > /tmp/C_$v.so; done
cp /tmp/C_bulk.so mla_ext/_C.abi3.so
bash .wt/s15c/sync.sh
o=$(mktemp -d); find "$o" -mindepth 1 -delete
for r in 1 2; do
  for v in bulk bulk_late; do
    cp /tmp/C_$v.so mla_ext/_C.abi3.so
    MLA_EXT_FORCE_PORTABLE=1 timeout 120 python3 bench/bench_decode.py --only "fp8_ds_mla memory-bound" > "$o/bench_${v}_r$r.txt" 2>&1
    echo "$v round $r: $(grep -E '^\| fp8_ds_mla memory' "$o/bench_${v}_r$r.txt" | awk -F'|' '{printf "%s ", $3}') copy: $(grep -o 'copy [0-9]* GB/s' "$o/bench_${v}_r$r.txt")"
  done
done
tar czf "$OUT/bench_ab2.tgz" -C "$o" .
