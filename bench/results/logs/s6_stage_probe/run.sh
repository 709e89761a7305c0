# Probe: is the sm90 16-head fp8_ds_mla kernel bound by gather latency? 3 staging buffers (1 tile in flight) vs 4 (2).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
PROBE_STAGES3=1 MLA_EXT_SPARSE_M16_WARPS=8 timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py -k "16 and fp8" > $o/pytest.txt 2>&1; echo "tests stages3: $(tail -1 $o/pytest.txt) $(el)"
for i in 1 2; do
  MLA_EXT_SPARSE_M16_WARPS=8 timeout 40 python3 bench/bench_sparse.py --quick > $o/b4_$i.txt 2>&1; echo "stages4 run$i: $(grep -E 'h_q16,' $o/b4_$i.txt | cut -c1-70) $(el)"
  PROBE_STAGES3=1 MLA_EXT_SPARSE_M16_WARPS=8 timeout 40 python3 bench/bench_sparse.py --quick > $o/b3_$i.txt 2>&1; echo "stages3 run$i: $(grep -E 'h_q16,' $o/b3_$i.txt | cut -c1-70) $(el)"
done
tar czf $OUT/all.tgz -C $o .
