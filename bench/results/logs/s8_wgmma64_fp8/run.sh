# Session 8: the sm90 64-row wgmma decode kernel for the fp8 formats (staging + dequant): all decode GPU tests, sanitizers on the small wgmma cases, h_q128 bench default vs MLA_EXT_DECODE_WGMMA=0 (same run).
export PYTHONUNBUFFERED=1
o=$(mktemp -d); t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 240 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -12; snap
for tool in memcheck racecheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 90 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; snap
done
for r in 1 2; do
  for v in wgmma portable64; do
    if [ $v = wgmma ]; then e=1; else e=0; fi
    MLA_EXT_DECODE_WGMMA=$e MLA_EXT_FLASHMLA_SO=/nonexistent timeout 150 python3 bench/bench_decode.py --only "h_q=128" --iters 20 > $o/bench_${v}_$r.txt 2>&1
    echo "$v $r: $(grep -E '^\| (auto|fp8)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
grep -E '^\| (auto|fp8)' $o/bench_wgmma_1.txt | awk -F'|' '{print $2 $5}'
