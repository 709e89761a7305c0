# Session 8: decode TMA issue after the QK^T wgmma (head) vs cb26986 (.wt/pre), alternating; fp8 decode GPU tests first.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
(PYTHONPATH=$root:$root/tests timeout 200 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "fp8" tests/test_decode_gpu.py > $o/pytest.txt 2>&1); echo "decode fp8 tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
for r in 1 2 3; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 100 python3 bench/bench_decode.py --only "fp8" --iters 30 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| fp8' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
grep -E '^\| fp8' $o/bench_head_1.txt | awk -F'|' '{print $2}'
