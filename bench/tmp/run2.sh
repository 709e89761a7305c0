#!/usr/bin/env bash
# Device run 2: absorb GPU tests, memcheck of the small v_up cases, the absorb benchmark table,
# the schedule/promotion sweep and a short Nsight Compute comparison at H=128 T=256.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d)
pack() { tar -czf "$OUT/run2.tar.gz" -C "$o" . ; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_absorb_gpu.py tests/test_absorb_reference.py > "$o/pytest.txt" 2>&1
echo "tests: $(tail -1 "$o/pytest.txt")"; grep -E "^FAILED|Error" "$o/pytest.txt" | head -5
pack
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider \
  -k "sanitizer" tests/test_absorb_gpu.py > "$o/memcheck.txt" 2>&1
echo "memcheck: $(grep -h 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1) $(tail -1 "$o/memcheck.txt")"
pack
timeout 40 python3 bench/bench_absorb.py --json "$o" > "$o/bench_absorb.txt" 2>&1
pack
timeout 45 python3 bench/tmp/sweep2.py "$o" > "$o/sweep2.txt" 2>&1
pack
timeout 30 ncu --clock-control none --nvtx --nvtx-include "mla_ext.profile/" -c 4 --section SpeedOfLight \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sectors.avg.pct_of_peak_sustained_elapsed \
  python3 bench/tmp/prof_vup.py 128 256 --cands "tma64p:;tma64p:wpromo=256;tma64:" > "$o/ncu.txt" 2>&1
pack
grep -E "^  [a-z_]+.*\(|gpu__time_duration|lts__t_bytes|lts__t_sectors|L2 Cache Throughput|DRAM Throughput" "$o/ncu.txt" | head -40
grep -A8 "Issue 4 bar" "$o/bench_absorb.txt" | head -10
grep "v_up bf16\|torch bmm bf16" "$o/bench_absorb.txt" | head -30
cat "$o/sweep2.txt"
