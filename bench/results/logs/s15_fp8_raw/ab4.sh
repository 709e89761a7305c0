#!/usr/bin/env bash
# Session 15 call: fp8 (576-byte rows) raw rows by bulk copies (C_fp8raw, default) against the 4-thread row
# copies of the same build (MLA_EXT_DECODE_BULK_ROWS=0) and of main (C_bulk = 12d6561), fp8 memory-bound
# b128 x 4096 bs 64, forced portable, alternated; then fp8 decode tests forced portable and sanitizers.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_FLASHMLA_SO=/nonexistent MLA_EXT_FORCE_PORTABLE=1
d=.wt/s15e/carry; for v in fp8raw bulk; do gunzip -c $d/C_$v.so.gz > /tmp/C_$v.so; done
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
for r in 1 2; do
  for v in fp8raw:1 fp8raw:0 bulk:1; do
    so=${v%:*}; br=${v#*:}; cp /tmp/C_$so.so mla_ext/_C.abi3.so
    MLA_EXT_DECODE_BULK_ROWS=$br timeout 60 python3 bench/bench_decode.py --only "fp8 memory-bound" > "$o/bench_${so}_${br}_r$r.txt" 2>&1
    echo "$so bulk_rows=$br round $r: $(grep -E '^\| fp8 memory' "$o/bench_${so}_${br}_r$r.txt" | awk -F'|' '{printf "%s ", $3}') $(el)"
  done
done
cp /tmp/C_fp8raw.so mla_ext/_C.abi3.so
timeout 100 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py -k "(fp8 and not fp8_ds_mla) or row_loaders or raw_rows" > "$o/pytest.txt" 2>&1
echo "tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|Error" "$o/pytest.txt" | head -5
sel="small_for_sanitizer or (small_whole_tile and not fp8_ds_mla) or (fp8_16_rows_portable_kernel and not fp8_ds_mla and 16-)"
for tool in memcheck synccheck racecheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 100 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "$sel" tests/test_decode_gpu.py > "$o/$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$o/$tool.txt" | tail -1) $(grep -E 'passed|failed' "$o/$tool.txt" | tail -1) $(el)"
done
tar czf "$OUT/ab4.tgz" -C "$o" .
