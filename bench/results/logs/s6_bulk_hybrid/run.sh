# Probe: sm90 16-head fp8_ds_mla kernel, rows split between bulk copies (first N of each tile) and cp.async.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_SPARSE_M16_WARPS=8
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
for n in 32 48; do PROBE_BULK_N=$n timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py -k "16 and fp8 and not w8" > $o/pytest_$n.txt 2>&1; echo "tests bulk$n: $(tail -1 $o/pytest_$n.txt) $(el)"; grep -E "^FAILED" $o/pytest_$n.txt | head -5; done
for i in 1 2; do
  for n in 64 48 40 32; do
    PROBE_BULK_N=$n timeout 40 python3 bench/bench_sparse.py --quick > $o/b${n}_$i.txt 2>&1; echo "bulk$n run$i: $(grep -E 'h_q16,' $o/b${n}_$i.txt | cut -c1-70) $(el)"
  done
done
PROBE_BULK_N=32 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths and default and not w8" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"
tar czf $OUT/all.tgz -C $o .
