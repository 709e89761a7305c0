# Session 6: sparse fp8_ds_mla 16-head kernel with 16 warps vs 8 (same run, A/B interleaved).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf $OUT/all.tgz -C $o . ; }
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $o/gpu.txt
timeout 120 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > $o/pytest.txt 2>&1; echo "sparse tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -20; snap
for i in 1 2; do
  for w in 16 8; do
    MLA_EXT_SPARSE_M16_WARPS=$w timeout 40 python3 bench/bench_sparse.py --quick > $o/bench_w${w}_$i.txt 2>&1
    echo "sm90 w$w run$i: $(grep -E 'h_q16,|same indices =' $o/bench_w${w}_$i.txt | cut -c1-70 | tr '\n' ' ') $(el)"
  done
done; snap
for w in 16 8; do
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_SPARSE_M16_WARPS=$w timeout 40 python3 bench/bench_sparse.py --quick > $o/bench_portable_w${w}.txt 2>&1
  echo "portable w$w: $(grep -E 'h_q16,|same indices =' $o/bench_portable_w${w}.txt | cut -c1-70 | tr '\n' ' ') $(el)"
done; snap
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths and (default-16 or cpasync-16) and not w8" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths and not w8" tests/test_sparse_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
echo "== summary"; tail -1 $o/pytest.txt; grep -h "same indices =" $o/bench_*.txt
