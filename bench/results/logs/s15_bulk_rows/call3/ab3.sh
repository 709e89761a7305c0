#!/usr/bin/env bash
# Session 15 call: bulk copies issued before the wait for the current tile (C_syncfirst: team_sync, issue,
# then mbar_wait) against after it (C_bulk = 12d6561), alternated, forced portable; then the decode tests
# forced portable and the sanitizers on C_syncfirst.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_FLASHMLA_SO=/nonexistent
d=.wt/s15d/carry; for v in bulk syncfirst; do gunzip -c $d/C_$v.so.gz > /tmp/C_$v.so; done
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
for r in 1 2; do
  for v in syncfirst bulk; do
    cp /tmp/C_$v.so mla_ext/_C.abi3.so
    MLA_EXT_FORCE_PORTABLE=1 timeout 120 python3 bench/bench_decode.py --only "fp8_ds_mla memory-bound" > "$o/bench_${v}_r$r.txt" 2>&1
    echo "$v round $r: $(grep -E '^\| fp8_ds_mla memory' "$o/bench_${v}_r$r.txt" | awk -F'|' '{printf "%s ", $3}') $(el)"
  done
done
cp /tmp/C_syncfirst.so mla_ext/_C.abi3.so
MLA_EXT_FORCE_PORTABLE=1 timeout 150 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py \
  -k "fp8_ds_mla or ds_mla or row_loaders or fp8_16_rows or one_long or large_batch or cuda_graph or small_for_sanitizer or raw_rows" > "$o/pytest.txt" 2>&1
echo "tests: $(tail -1 $o/pytest.txt) $(el)"
bash .wt/s15d/sync.sh
tar czf "$OUT/ab3.tgz" -C "$o" .
