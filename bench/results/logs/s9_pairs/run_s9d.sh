# Session 9 call 4: tile-pairs kernel with the maxima double-buffered by pair parity: racecheck again, decode tests, A/B.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
timeout 70 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; grep -m4 "Race reported\|and Read\|and Write" $o/racecheck.txt; snap
timeout 200 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED" $o/pytest.txt | head -8; snap
for tool in memcheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 70 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'ERROR SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; snap
done
for v in pre head; do
  if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
  (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_${v}.txt 2>&1)
  echo "$v: $(grep -E '^\| (auto|fp8)' $o/bench_${v}.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
done
