# Session 6: sparse sm90 16-head fp8_ds_mla with 4 copy warps (default) vs MLA_EXT_SPARSE_COPY_WARPS=0, same run.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 90 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > $o/pytest.txt 2>&1; echo "sparse tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
for i in 1 2 3; do
  timeout 40 python3 bench/bench_sparse.py --quick > $o/copy4_$i.txt 2>&1; echo "copy4 run$i: $(grep -E 'h_q16,|same indices =' $o/copy4_$i.txt | cut -c1-70 | tr '\n' ' ') $(el)"
  MLA_EXT_SPARSE_COPY_WARPS=0 timeout 40 python3 bench/bench_sparse.py --quick > $o/copy0_$i.txt 2>&1; echo "copy0 run$i: $(grep -E 'h_q16,|same indices =' $o/copy0_$i.txt | cut -c1-70 | tr '\n' ' ') $(el)"
done; snap
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths and (default or copy0) or small_for_sanitizer" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths or small_for_sanitizer" tests/test_sparse_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
for cw in 4 0; do MLA_EXT_SPARSE_COPY_WARPS=$cw timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths and default" tests/test_sparse_gpu.py > $o/synccheck_$cw.txt 2>&1; echo "synccheck copy$cw rc=$? $(grep -h "ERROR SUMMARY" $o/synccheck_$cw.txt | tail -1) $(grep -E "passed|failed" $o/synccheck_$cw.txt | tail -1) $(el)"; done; snap
