#!/usr/bin/env bash
# Session 12, call 5 (experiment, issue 3): the portable fp8 16-row decode kernel with 16 threads per cache row
# (MLA_EXT_DECODE_ROW_THREADS=16; 52-56 bytes of spills in this build): decode fp8 tests forced portable with it,
# memcheck of the portable 16-row tests, then the memory-bound b128 x 4096 h_q 16 cases with 4 / 8 / 16 threads
# per row, forced portable, two alternating rounds (the env is read once per process).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
MLA_EXT_DECODE_ROW_THREADS=16 MLA_EXT_FORCE_PORTABLE=1 timeout 150 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py \
  -k "fp8 and not row_loaders and not selects" > "$o/pytest_rows16.txt" 2>&1
echo "decode fp8 tests rows 16: $(tail -1 "$o/pytest_rows16.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_rows16.txt" | head -8; snap
MLA_EXT_DECODE_ROW_THREADS=16 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $py -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py \
  -k "fp8_16_rows_portable_kernel" > "$o/san_memcheck.txt" 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$o/san_memcheck.txt" | tail -1) $(tail -1 "$o/san_memcheck.txt") $(el)"; snap
for r in 1 2; do
  for v in 4 8 16; do
    MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_DECODE_ROW_THREADS=$v timeout 60 $py bench/bench_decode.py --only "memory-bound b=128 s_q=1 h_q=16 len=4096 bs=64" > "$o/bench_rows$v.$r.txt" 2>&1
    echo "== rows $v round $r $(el)"; grep -E "^\| fp8" "$o/bench_rows$v.$r.txt" | cut -c1-100; snap
  done
done
