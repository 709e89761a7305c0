# Session 6: decode TMA boxes issued one per thread (HEAD, branch tma-spread) vs main f626624 (.wt/pre), alternating; decode tests first.
export PYTHONUNBUFFERED=1
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf $OUT/all.tgz -C $o . ; }
root=$PWD
PYTHONPATH=$root:$root/tests timeout 120 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) [$(( $(date +%s)-t0 ))s]"; grep -E "^FAILED|^E  " $o/pytest.txt | head -6; snap
for r in 1 2; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d:$d/tests timeout 60 $py bench/bench_decode.py --only memory-bound > $o/bench_${v}_$r.txt 2>&1)
    echo "== $v run $r [$(( $(date +%s)-t0 ))s]"; grep -E "^\| fp8" $o/bench_${v}_$r.txt | cut -c1-90; grep -E "faster" $o/bench_${v}_$r.txt | cut -c1-100; snap
  done
done
PYTHONPATH=$root:$root/tests timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu -k "small_for_sanitizer or small_whole_tile" tests/test_decode_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) [$(( $(date +%s)-t0 ))s]"; snap
