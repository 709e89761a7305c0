# Session 7: sm90 fp8_ds_mla 64-head kernel, bulk copies spread over lanes 0-7 of all 8 warps (was threads 0-63): tests, A/B vs a8153bd (.wt/pre), sanitizers.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "64_head or small_for_sanitizer or matches_reference" tests/test_sparse_gpu.py > $o/pytest_64.txt 2>&1; echo "64-head tests: $(tail -1 $o/pytest_64.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest_64.txt | head -8; snap
for r in 1 2 3; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d timeout 60 python3 bench/bench_sparse.py --quick > $o/bench_${v}_$r.txt 2>&1)
    echo "== $v run $r $(el)"; grep -E "^\| fp8" $o/bench_${v}_$r.txt | cut -c1-75; grep "same indices =" $o/bench_${v}_$r.txt; snap
  done
done
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > $o/pytest.txt 2>&1; echo "sparse tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
K="small_fp8_64_head_paths and default and not 70"
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_sparse_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_sparse_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h "ERROR SUMMARY" $o/synccheck.txt | tail -1) $(grep -E "passed|failed" $o/synccheck.txt | tail -1) $(el)"; snap
