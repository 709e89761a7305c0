#!/usr/bin/env bash
# Session 17, call 2 (main's kernels, ring reverted): where do call 1's racecheck hazards and synccheck fault come
# from? The sanitizers on the forced-portable 16-row fp8 kernel with bulk copies and with cp.async raw rows
# (MLA_EXT_DECODE_BULK_ROWS=0), on the new multi-piece test; then order.py with nvidia-smi sampling clocks and power.
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
snap() { tar czf "$OUT/call2.tgz" -C "$o" . ; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,power.limit --format=csv,noheader | tee "$o/gpu.txt"
compute-sanitizer --version | tail -1; compute-sanitizer --help | grep -i -B1 -A3 "barrier" > "$o/sanitizer_help.txt"; head -20 "$o/sanitizer_help.txt"
export PYTHONPATH=$PWD:$PWD/tests MLA_EXT_FORCE_PORTABLE=1
echo "== tests $(el)"
timeout 120 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py -k "long_pieces or small_whole_tile or raw_rows_selected or row_loaders" > "$o/pytest.txt" 2>&1
tail -1 "$o/pytest.txt"
s() {  # tool label env... -- selection
  local tool=$1 label=$2; shift 2
  env "$@" timeout 150 compute-sanitizer --tool $tool $SAN_EXTRA --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "$SEL" tests/test_decode_gpu.py > "$o/${tool}_$label.txt" 2>&1
  echo "$tool $label rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$o/${tool}_$label.txt" | tail -1) $(grep -h 'overflow' "$o/${tool}_$label.txt" | head -1 | cut -c1-80) $(grep -E 'passed|failed' "$o/${tool}_$label.txt" | tail -1) $(el)"
}
SEL="long_pieces"
s racecheck bulk X=1
s racecheck cpasync MLA_EXT_DECODE_BULK_ROWS=0
s memcheck bulk X=1
SEL="small_whole_tile and 64 and not 128"
s synccheck bulk X=1
s synccheck cpasync MLA_EXT_DECODE_BULK_ROWS=0
if compute-sanitizer --help | grep -q num-cuda-barriers; then SAN_EXTRA="--num-cuda-barriers 256" s synccheck bulk_nb256 X=1; fi
SEL="small_for_sanitizer"
s racecheck small_bulk X=1
snap
echo "== order $(el)"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 250 > "$o/smi.csv" 2>&1 &
smi=$!
date +%H:%M:%S.%N | tee "$o/order_start.txt"
timeout 200 python3 bench/results/logs/s17_ring/order.py $PWD 2>&1 | tee "$o/order.txt"
kill $smi; snap
echo "== done $(el)"
