# Session 9 call 11: tile-pairs kernel with m_b handed over through an mbarrier: racecheck on every small
# attention case (gpu_check.sh's list), decode tests, memcheck + synccheck on the small wgmma cases, h_q 128 bench.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$OUT; t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s]"; }
attn_small="small_for_sanitizer or small_whole_tile or small_wgmma or (small_fp8_16_head_paths and (default or copy0)) \
or (small_fp8_64_head_paths and default and not 70) or small_fp8_16_head_paths_long_list"
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/racecheck_wgmma.txt 2>&1; echo "racecheck small_wgmma rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck_wgmma.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck_wgmma.txt | tail -1) $(el)"; grep -m2 "Race reported" $o/racecheck_wgmma.txt | cut -c1-200
timeout 200 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest_decode.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest_decode.txt) $(el)"; grep -E "^FAILED" $o/pytest_decode.txt | head -5
for tool in memcheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 60 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'ERROR SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"
done
for v in head split; do
  env_extra=""; [ $v = split ] && env_extra="MLA_EXT_DECODE_PAIRS=0"
  (env $env_extra MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_$v.txt 2>&1)
  echo "$v: $(grep -E '^\| (auto|fp8)' $o/bench_$v.txt | awk -F'|' '{printf "%s ", $3}') $(el)"
done
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$attn_small" tests/test_decode_gpu.py tests/test_sparse_gpu.py > $o/racecheck_all.txt 2>&1; echo "racecheck all attention small cases rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck_all.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck_all.txt | tail -1) $(el)"
