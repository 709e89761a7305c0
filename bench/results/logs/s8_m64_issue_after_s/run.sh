# Session 8: sparse, (a) sm90 64-head kernel: bulk copies spread over 8 warps and issued after the first S wgmma;
# (b) bf16 16-head: second gather pass after QK^T. Head vs c5d95b4 (.wt/pre), alternating; tests and racecheck first.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > $o/pytest.txt 2>&1; echo "sparse tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
K="(small_fp8_64_head_paths and default and not 70) or (matches_reference and (61-2-100-16-auto or 64-1-2048-16-auto))"
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_sparse_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
for r in 1 2; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 150 python3 bench/bench_sparse.py > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (fp8|auto)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') | $(grep -h 'same indices' $o/bench_${v}_$r.txt | grep -o '= [0-9.]*' | tr '\n' ' ') $(el)"; snap
  done
done
grep -E '^\| (fp8|auto)' $o/bench_head_1.txt | awk -F'|' '{print $2}'
MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 100 python3 bench/bench_decode.py --only "memory-bound" --iters 30 > $o/decode_portable.txt 2>&1; echo "portable decode rc=$? $(el)"; grep -E "^\|" $o/decode_portable.txt | awk -F'|' '{print $2 $3 $6}' | tail -n +3; snap
