#!/usr/bin/env bash
# Device run 1 (EXPERIMENT): knob'd TMA v_up kernels: tests, memcheck, knob sweep, ncu.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d)
pack() { tar -czf "$OUT/run1.tar.gz" -C "$o" . ; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
K="test_v_up and (tma128 or tma64)"
for knobs in "" "wup=0,first=3,rot=1,hint=1,promo=128" "wup=0,first=2,later=4,rot=1"; do
  MLA_EXT_VUP_TMA_KNOBS=$knobs timeout 60 python3 -m pytest -q -x -p no:cacheprovider -k "$K" tests/test_absorb_gpu.py > "$o/pytest_$knobs.txt" 2>&1
  echo "tests [$knobs]: $(tail -1 "$o/pytest_$knobs.txt")"
done
pack
MLA_EXT_VUP_TMA_KNOBS="wup=0,first=3,later=4,rot=1,hint=1,promo=128" timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 \
  python3 -m pytest -q -p no:cacheprovider -k "sanitizer and (tma128 or tma64)" tests/test_absorb_gpu.py > "$o/memcheck.txt" 2>&1
echo "memcheck: $(grep -h 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1) $(tail -1 "$o/memcheck.txt")"
pack
timeout 70 python3 bench/tmp/knob_sweep.py "$o" > "$o/sweep.txt" 2>&1
pack
timeout 45 ncu --clock-control none --nvtx --nvtx-include "mla_ext.profile/" -c 5 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section WarpStateStats \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
  python3 bench/tmp/prof_vup.py 128 256 "$o/knob_sweep.json" > "$o/ncu.txt" 2>&1
pack
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|gpu__time_duration|dram__bytes|Memory Throughput|profiled in order" "$o/ncu.txt" | head -60
cat "$o/sweep.txt" | head -150
