# Session 10 call 2: tile-pairs kernel with page boxes (block sizes 8/16/32). pages = branch pairs-pages.
export PYTHONUNBUFFERED=1
root=$PWD; o=$(mktemp -d); t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
gunzip -c .wt/s10/pages.so.gz > mla_ext/_C.abi3.so
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest_decode.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest_decode.txt) $(el)"; grep -E "^FAILED" $o/pytest_decode.txt | head -8; snap
sel="small_wgmma or past_block_table"
for tool in racecheck memcheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 90 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$sel" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'RACECHECK SUMMARY\|ERROR SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; grep -m2 "Race reported\|Invalid" $o/$tool.txt | cut -c1-160; snap
done
for r in 1 2; do
  for v in pairs split; do
    env_extra=""; [ $v = split ] && env_extra="MLA_EXT_DECODE_PAIRS=0"
    (env $env_extra MLA_EXT_FLASHMLA_SO=/nonexistent timeout 50 python3 bench/bench_decode.py --only "compute-bound bs16" --iters 20 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (auto|fp8)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s %s ", $3, $5}') $(el)"; snap
  done
done
