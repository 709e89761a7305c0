# Session 9 call 3: the tile-pairs wgmma decode kernel (decode_split_wgmma_pairs.cu): decode GPU tests,
# sanitizers on the small wgmma cases, A/B on the h_q 128 cases against main (.wt/pre) and MLA_EXT_DECODE_PAIRS=0.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
timeout 60 python3 -m pytest -q -x -m gpu --tb=short -p no:cacheprovider -k "small_wgmma or env_selects" tests/test_decode_gpu.py > $o/pytest_small.txt 2>&1; echo "small: $(tail -1 $o/pytest_small.txt) $(el)"; grep -E "^E  " $o/pytest_small.txt | head -8; snap
timeout 200 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED" $o/pytest.txt | head -8; grep -E "^E  " $o/pytest.txt | head -6; snap
for tool in memcheck racecheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 70 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'RACECHECK SUMMARY\|ERROR SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; snap
done
for r in 1 2; do
  for v in pre head split; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    env_extra=""; [ $v = split ] && env_extra="MLA_EXT_DECODE_PAIRS=0"
    (cd $d && env $env_extra PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (auto|fp8)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
