# Session 10 call 1: tile-pairs kernel variants. next = pairs-next (fb2fbad: next a's dims 0-255 copied
# before the m_b wait), mbar = pairs-mbar (every warpgroup hand-off through an mbarrier). pre = main 20db9e9.
export PYTHONUNBUFFERED=1
root=$PWD; o=$OUT; t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s]"; }
export PYTHONPATH=$root:$root/tests
gunzip -c .wt/s10/pre.so.gz > .wt/pre/mla_ext/_C.abi3.so
use() { gunzip -c .wt/s10/$1.so.gz > mla_ext/_C.abi3.so; }
for v in mbar next; do
  use pairs-$v
  timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/racecheck_$v.txt 2>&1; echo "$v racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck_$v.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck_$v.txt | tail -1) $(el)"; grep -m2 "Race reported" $o/racecheck_$v.txt | cut -c1-160
  timeout 120 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest_$v.txt 2>&1; echo "$v decode tests: $(tail -1 $o/pytest_$v.txt) $(el)"; grep -E "^FAILED" $o/pytest_$v.txt | head -5
done
use pairs-mbar
for tool in memcheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 70 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/${tool}_mbar.txt 2>&1; echo "mbar $tool rc=$? $(grep -h 'ERROR SUMMARY' $o/${tool}_mbar.txt | tail -1) $(grep -E 'passed|failed' $o/${tool}_mbar.txt | tail -1) $(el)"
done
for r in 1 2; do
  for v in pre next mbar; do
    [ $(( $(date +%s)-t0 )) -gt 530 ] && { echo "skip bench $v $r (time)"; continue; }
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; use pairs-$v; fi
    (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 50 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (auto|fp8)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"
  done
done
