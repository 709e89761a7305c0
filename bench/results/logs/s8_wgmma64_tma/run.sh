# Session 8 (second run, flags fixed): wgmma 64-row decode kernel with TMA whole-page tiles issued during S + ex2.approx (head) vs 8cbacdb (.wt/pre); decode tests + sanitizers first.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 200 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "64_row or wgmma or heads or s_q or block_sizes or fp16 or long or large or one_long or graph" tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -12; snap
for tool in memcheck racecheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 90 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; snap
done
for r in 1 2; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 100 python3 bench/bench_decode.py --only "auto" --iters 20 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| auto' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
grep -E '^\| auto' $o/bench_head_1.txt | awk -F'|' '{print $2}'
timeout 100 ncu --nvtx --nvtx-include "mla_ext.decode_mla.auto.b128.s1.h128.bs64/" -k regex:decode_split -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis python3 bench/bench_decode.py --only "auto compute-bound b=128" --iters 2 > $o/ncu_wgmma.txt 2>&1; echo "ncu rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued|Issue Slots Busy|Tensor" $o/ncu_wgmma.txt | head -12; snap
