# Session 8: after the review fixes (755f843): all decode GPU tests, memcheck / racecheck / synccheck on the small wgmma cases and the new past-the-table cases.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 240 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -12; snap
K="small_wgmma or (past_block_table and (128 or 64-64))"
for tool in memcheck racecheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 120 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; snap
done
