# Probe: sm90 16-head fp8_ds_mla kernel with a ninth warp issuing all bulk row copies (PROBE_PRODUCER).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_SPARSE_M16_WARPS=8
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
PROBE_PRODUCER=1 timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py -k "16 and fp8 and not w8" > $o/pytest.txt 2>&1; echo "tests producer: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8
for i in 1 2; do
  timeout 40 python3 bench/bench_sparse.py --quick > $o/base_$i.txt 2>&1; echo "base run$i: $(grep -E 'h_q16,' $o/base_$i.txt | cut -c1-70) $(el)"
  PROBE_PRODUCER=1 timeout 40 python3 bench/bench_sparse.py --quick > $o/prod_$i.txt 2>&1; echo "producer run$i: $(grep -E 'h_q16,' $o/prod_$i.txt | cut -c1-70) $(el)"
done
PROBE_PRODUCER=1 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths and default and not w8" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"
tar czf $OUT/all.tgz -C $o .
