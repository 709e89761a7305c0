#!/usr/bin/env bash
# Session 17, call 1: the descriptor ring (kBulkTiles) on the H200. Forced-portable fp8 decode tests, the
# sanitizers on small cases and the long-piece test, then an alternated A/B of the same build with
# MLA_EXT_DECODE_BULK_TILES=0 (warp 0's per-tile lookups, = main's kernel) against the ring (ab2.py of session 16).
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent
d=$PWD/bench/results/logs/s17_ring; o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
snap() { tar czf "$OUT/call1.tgz" -C "$o" . ; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv,noheader | tee "$o/gpu.txt"
export PYTHONPATH=$PWD:$PWD/tests
echo "== tests $(el)"
MLA_EXT_FORCE_PORTABLE=1 timeout 240 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py \
  -k "fp8 or ds_mla or row_loaders or one_long or cuda_graph or small or raw_rows or seq_lens or long_pieces" > "$o/pytest_portable.txt" 2>&1
tail -3 "$o/pytest_portable.txt"
timeout 60 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py -k "long_pieces or fp16 or raw_rows" > "$o/pytest_default.txt" 2>&1
tail -2 "$o/pytest_default.txt"; snap
for tool in memcheck racecheck synccheck; do
  MLA_EXT_FORCE_PORTABLE=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or (long_pieces and 64) or (small_whole_tile and (64 or 128))" tests/test_decode_gpu.py > "$o/$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$o/$tool.txt" | tail -1) $(grep -E 'passed|failed' "$o/$tool.txt" | tail -1) $(el)"
done; snap
echo "== A/B $(el)"
export MLA_EXT_FORCE_PORTABLE=1
c=fp8_ds_mla:128:4096:64,fp8_ds_mla:128:4096:128,fp8_ds_mla:32:16384:64,fp8:128:4096:64,fp8:128:4096:128,auto:128:4096:128,auto:128:4096:64
for r in 1 2 3; do for v in 0 1; do
  MLA_EXT_DECODE_BULK_TILES=$v timeout 90 python3 bench/results/logs/s16_diag/ab2.py $PWD tiles=$v $c 2>&1 | grep -E "^AB|Error|error" | tee -a "$o/ab.txt"
done; done; snap
echo "== done $(el)"
