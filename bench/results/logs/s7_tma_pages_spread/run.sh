# Session 7: decode kTmaPages (block sizes 8/16/32): page j's TMA boxes issued by warp j from page ids in shared memory. Tests, A/B vs a8153bd (.wt/pre), sanitizers.
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent
o=$(mktemp -d); t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
PYTHONPATH=$root:$root/tests timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
for r in 1 2 3; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d timeout 60 python3 bench/bench_decode.py --only "memory-bound bs16" > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (fp8|auto)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s|%s ", $2, $3}') $(el)"; snap
  done
done
K="small_for_sanitizer or small_whole_tile"
PYTHONPATH=$root:$root/tests timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_decode_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
PYTHONPATH=$root:$root/tests timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_decode_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
PYTHONPATH=$root:$root/tests timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_whole_tile" tests/test_decode_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h 'ERROR SUMMARY' $o/synccheck.txt | tail -1) $(grep -E 'passed|failed' $o/synccheck.txt | tail -1) $(el)"; snap
