# Session 10 call 5: whole-page copies spread over the 4 warps (spread) against pairs-pages v3 (v3), alternating.
export PYTHONUNBUFFERED=1
root=$PWD; o=$(mktemp -d); t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
use() { gunzip -c .wt/s10/$1.so.gz > mla_ext/_C.abi3.so; }
for r in 1 2 3; do
  for v in pages_v3 spread; do
    use $v
    (MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (auto|fp8)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
use spread
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest_decode.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest_decode.txt) $(el)"; grep -E "^FAILED" $o/pytest_decode.txt | head -8; snap
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma or past_block_table" tests/test_decode_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
