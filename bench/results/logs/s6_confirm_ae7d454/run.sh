# Session 6 confirmation after the review fixes: sparse GPU tests, sanitizers on the 16-head long-list cases.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
timeout 90 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > $o/pytest.txt 2>&1; echo "sparse tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -6; snap
for tool in racecheck synccheck memcheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths_long_list" tests/test_sparse_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -hE 'RACECHECK SUMMARY|ERROR SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; snap
done
