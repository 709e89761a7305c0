# Session 9 call 7: racecheck experiments on the tile-pairs kernel's m_b exchange: v1 = warpgroup 1 waits at the
# m_b barrier too (bar.sync on both sides), v2 = barrier ids of the two maxima swapped. Small tests + h_q 128 bench each.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
for v in v1 v2; do
  cp $root/.wt/$v/mla_ext/_C.abi3.so $root/mla_ext/_C.abi3.so; export PYTHONPATH=$root:$root/tests
  timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma and (auto-64 or auto-128)" tests/test_decode_gpu.py > $o/racecheck_$v.txt 2>&1; echo "$v racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck_$v.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck_$v.txt | tail -1) $(el)"; grep -m2 "Race reported\|and Read\|and Write" $o/racecheck_$v.txt; snap
  timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "(64_row and auto and default) or small_wgmma" tests/test_decode_gpu.py > $o/pytest_$v.txt 2>&1; echo "$v tests: $(tail -1 $o/pytest_$v.txt) $(el)"; snap
  (MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_$v.txt 2>&1)
  echo "$v: $(grep -E '^\| (auto|fp8)' $o/bench_$v.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
done
