#!/usr/bin/env bash
# One call on the GPU machine: GPU tests, compute-sanitizer, benchmarks, one Nsight Compute run.
# Usage (from the repository root, the built library in mla_ext/):
#   bash bench/gpu_check.sh [OUT_DIR]        # OUT_DIR defaults to $OUT or bench/results/latest
# Prints a short table last. Exits non-zero if a test or the sanitizer fails.
set -uo pipefail
out=${1:-${OUT:-bench/results/latest}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"

echo "== GPU tests"
$py -m pytest -q -m gpu tests > "$out/pytest.txt" 2>&1 || status=1
tail -15 "$out/pytest.txt"

echo "== compute-sanitizer memcheck (cache write, small case)"
compute-sanitizer --tool memcheck --error-exitcode 9 $py -m pytest -q -p no:cacheprovider \
  tests/test_cache_write_gpu.py -k sanitizer > "$out/sanitizer.txt" 2>&1 || status=1
tail -4 "$out/sanitizer.txt"

echo "== python -m mla_ext"
$py -m mla_ext --no-bench 2>&1 | tail -8

echo "== Nsight Compute: cache write, fp8_ds_mla, 65536 tokens"
ncu --clock-control none --nvtx --nvtx-include "mla_ext.profile/" -k regex:concat_and_cache -c 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  $py bench/bench_cache_write.py --profile > "$out/ncu_cache_write.txt" 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Local Memory" \
  "$out/ncu_cache_write.txt" | head -12

echo "== benchmark"
$py bench/bench_cache_write.py --json "$out" 2>&1 | tail -25
exit $status
