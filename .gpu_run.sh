#!/usr/bin/env bash
# v_up GPU check: absorb tests, memcheck of the small cases, benchmark + v_up kernel sweep.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_COMMIT=${COMMIT}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
t0=$(date +%s)
timeout 75 python3 -m pytest -q --maxfail=30 -m gpu --tb=line -p no:cacheprovider tests/test_absorb_gpu.py > $OUT/pytest.txt 2>&1
echo "pytest rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR)|Error|error" $OUT/pytest.txt | head -12; tail -1 $OUT/pytest.txt
t0=$(date +%s)
timeout 50 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k sanitizer tests/test_absorb_gpu.py > $OUT/memcheck.txt 2>&1
echo "memcheck rc=$? ($(( $(date +%s) - t0 )) s): $(grep -h 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1) $(tail -1 $OUT/memcheck.txt)"
t0=$(date +%s)
timeout 70 python3 bench/bench_absorb.py --json $OUT ${SWEEP:+--sweep-v-up $OUT} > $OUT/bench.txt 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E "^\| (v_up|torch bmm)" $OUT/bench.txt | awk -F'|' '{printf "%s|%s|%s\n", $2, $3, $6}'
grep -A8 "Issue 4 bar" $OUT/bench.txt | tail -6
tail -3 $OUT/bench.txt | grep -v "^wrote"
