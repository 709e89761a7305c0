# Session 9 call 9: racecheck option check on the tile-pairs kernel, then gpu_check.sh's bench part at ec0e500.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
compute-sanitizer --help 2>&1 | grep -i -A2 "racecheck-indirect\|racecheck-memcpy-async\|racecheck-num-hazards" > $OUT/exp.txt
timeout 60 compute-sanitizer --tool racecheck --racecheck-indirect-barrier-dependence yes --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py >> $OUT/exp.txt 2>&1; echo "racecheck indirect rc=$? $(grep -h 'RACECHECK SUMMARY' $OUT/exp.txt | tail -1) $(grep -E 'passed|failed' $OUT/exp.txt | tail -1)"
head -8 $OUT/exp.txt
MLA_EXT_COMMIT=ec0e500 bash bench/gpu_check.sh $OUT bench 2>&1 | tail -40
