# Session 8: sm90 64-row wgmma decode, P V of tile i left running into tile i + 1 (head) vs 755f843 (.wt/pre): 64-row and small wgmma tests, sanitizers on the small cases, A/B on the h_q 128 cases.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "64_row or wgmma or heads or s_q or past_block or out_buffers or fp16 or long or graph or compile" tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
for r in 1 2; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (auto|fp8)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
