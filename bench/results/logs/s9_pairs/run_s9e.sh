# Session 9 call 5: racecheck of the tile-pairs kernel with a block fence before the maxima arrivals (hazard detail if still flagged), quick A/B.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
timeout 70 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma and auto-64" tests/test_decode_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; grep -m4 "Race reported\|and Read\|and Write" $o/racecheck.txt; snap
if grep -q "Race reported" $o/racecheck.txt; then
timeout 120 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 12 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma and auto-64" tests/test_decode_gpu.py > $o/racecheck_hazard.txt 2>&1; echo "hazard report $(el)"; grep -B2 -A8 -m3 "hazard" $o/racecheck_hazard.txt | head -60; snap
fi
timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "64_row or small_wgmma or env_selects" tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; snap
(MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_head.txt 2>&1)
echo "head: $(grep -E '^\| (auto|fp8)' $o/bench_head.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
