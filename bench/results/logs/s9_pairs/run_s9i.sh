# Session 9 call 10: racecheck probe (.wt/rc/rc_probe.cu: four ways to hand a value from warpgroup 1 to 0) and
# the tile-pairs kernel with immediate ids on its warpgroup-local barrier.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
compute-sanitizer --tool racecheck --print-limit 20 .wt/rc/rc_probe > $OUT/probe.txt 2>&1; grep -E "Race reported|RACECHECK SUMMARY|sync:" $OUT/probe.txt | sed 's/(float \*, int)//' | cut -c1-150
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $OUT/racecheck_va.txt 2>&1; echo "vA racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $OUT/racecheck_va.txt | tail -1) $(grep -E 'passed|failed' $OUT/racecheck_va.txt | tail -1)"; grep -m2 "Race reported" $OUT/racecheck_va.txt | cut -c1-200
