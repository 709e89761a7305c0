# Session 10 call 8: fp8 16-row sm90 kernel with its whole-page TMA boxes spread over team warps 0-5
# (fp8spread) against main's build (pages_v3: SASS-identical to main), alternating; then tests + sanitizers.
export PYTHONUNBUFFERED=1
root=$PWD; o=$(mktemp -d); t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
use() { gunzip -c .wt/s10/$1.so.gz > mla_ext/_C.abi3.so; }
for r in 1 2; do
  for v in pages_v3 fp8spread; do
    use $v
    (MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "fp8" --iters 30 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (fp8)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
use fp8spread
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest_decode.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest_decode.txt) $(el)"; grep -E "^FAILED" $o/pytest_decode.txt | head -8; snap
sel="small_for_sanitizer or small_whole_tile"
for tool in racecheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 80 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$sel" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'RACECHECK SUMMARY\|ERROR SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; snap
done
