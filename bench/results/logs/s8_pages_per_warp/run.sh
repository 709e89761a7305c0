# Session 8: decode page boxes one page per warp (head) vs 5eb3c13 (.wt/pre), alternating; fp8 decode GPU tests and sanitizers first; page-read micro.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 200 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "fp8" tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode fp8 tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_whole_tile" tests/test_decode_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 90 compute-sanitizer --tool synccheck --num-cuda-barriers 4096 --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_whole_tile" tests/test_decode_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h 'ERROR SUMMARY' $o/synccheck.txt | tail -1) $(grep -E 'passed|failed' $o/synccheck.txt | tail -1) $(el)"; snap
for r in 1 2 3; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 100 python3 bench/bench_decode.py --only "fp8_ds_mla memory-bound" --iters 30 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| fp8' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
grep -E '^\| fp8' $o/bench_head_1.txt | awk -F'|' '{print $2}'
timeout 100 python3 bench/micro/gather_rows.py > $o/gather_rows.txt 2>&1; echo "gather rc=$? $(el)"; tail -9 $o/gather_rows.txt; snap
