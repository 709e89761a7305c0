#!/usr/bin/env bash
# Session 17, call 3 (main's kernels): racecheck's hazards on test_fp8_16_rows_long_pieces with thread indices
# (--racecheck-report hazard), and ds_order.py (inputs or history: why decode.bench times fp8_ds_mla 2.5% above ab2.py).
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
snap() { tar czf "$OUT/call3.tgz" -C "$o" . ; }
export PYTHONPATH=$PWD:$PWD/tests MLA_EXT_FORCE_PORTABLE=1
echo "== ds_order $(el)"
timeout 120 python3 bench/results/logs/s17_ring/ds_order.py $PWD 2>&1 | tee "$o/ds_order.txt"
timeout 120 python3 bench/results/logs/s17_ring/ds_order.py $PWD 2>&1 | tee -a "$o/ds_order.txt"; snap
for v in "bulk X=1 64-fp8_ds_mla" "cpasync MLA_EXT_DECODE_BULK_ROWS=0 64-fp8]"; do
  set -- $v
  timeout 150 env $2 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 6 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "long_pieces and $3" tests/test_decode_gpu.py > "$o/racecheck_$1.txt" 2>&1
  echo "racecheck $1 rc=$? $(grep -h 'RACECHECK SUMMARY' "$o/racecheck_$1.txt" | tail -1) $(grep -E 'passed|failed' "$o/racecheck_$1.txt" | tail -1) $(el)"
  grep -m 12 -E "hazard|Thread|at " "$o/racecheck_$1.txt" | cut -c1-260
done; snap
echo "== done $(el)"
