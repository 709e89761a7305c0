#!/usr/bin/env bash
# Session 17, call 8: fp8 raw rows with the second half of a stage 32 bytes on (kRowHalfShift; conflict-free PV loads,
# two bulk copies per whole tile). Tests and memcheck of that build (the working tree's library), then an alternated
# A/B against the build without it (.variants/base = 2e89ad7's kernels), ab2.py (harness: 100 ms warm-up per case).
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent
d=$PWD/bench/results/logs; o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
snap() { tar czf "$OUT/call8.tgz" -C "$o" . ; }
for v in base half; do mkdir -p /tmp/v/$v; cp -r mla_ext /tmp/v/$v/; xz -dc .variants/$v.so.xz > /tmp/v/$v/mla_ext/_C.abi3.so; done
export PYTHONPATH=$PWD:$PWD/tests MLA_EXT_FORCE_PORTABLE=1
echo "== tests $(el)"
timeout 200 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py \
  -k "fp8 or ds_mla or row_loaders or one_long or cuda_graph or small or raw_rows or seq_lens or long_pieces" > "$o/pytest_portable.txt" 2>&1
tail -1 "$o/pytest_portable.txt"; grep -E "^FAILED|Error" "$o/pytest_portable.txt" | head -5
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
  -k "small_for_sanitizer or (long_pieces and fp8]) or (small_whole_tile and fp8])" tests/test_decode_gpu.py > "$o/memcheck.txt" 2>&1
echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1) $(grep -E 'passed|failed' "$o/memcheck.txt" | tail -1) $(el)"; snap
echo "== A/B $(el)"
c=fp8:128:4096:64,fp8:128:4096:128,fp8:128:4096:16,fp8:32:16384:64,fp8_ds_mla:128:4096:128
for r in 1 2 3; do for v in base half; do
  timeout 80 python3 $d/s16_diag/ab2.py /tmp/v/$v $v $c 2>&1 | grep -E "^AB|Error|error" | tee -a "$o/ab.txt"
done; done; snap
echo "== done $(el)"
