#!/usr/bin/env bash
# Sparse dev run on the GPU machine (from the repository root, built library in mla_ext/):
# sparse GPU tests, the sparse benchmark with the default kernels and with MLA_EXT_FORCE_PORTABLE=1
# (fp8_ds_mla only: same-run A/B of the 64-head kernels), and Nsight Compute source-level profiles
# of the fp8_ds_mla b128 s_q2 h_q128 kernel, both paths. Everything lands in $OUT/all.tgz (packed
# after every step: a killed run keeps what it had).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
timeout ${TEST_S:-70} $py -m pytest -q -m gpu --tb=short --maxfail=8 -p no:cacheprovider tests/test_sparse_gpu.py ${TESTK:+-k "$TESTK"} > "$o/pytest.txt" 2>&1
echo "tests: $(tail -1 "$o/pytest.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest.txt" | head -16; snap
mkdir -p "$o/default" "$o/portable"
timeout 50 $py bench/bench_sparse.py --json "$o/default" > "$o/bench_default.txt" 2>&1; echo "bench default rc=$? $(el)"
grep -E "^\| (auto|fp8)|roofline|self check|Error" "$o/bench_default.txt" | cut -c1-120; snap
MLA_EXT_FORCE_PORTABLE=1 timeout 35 $py bench/bench_sparse.py --quick --json "$o/portable" > "$o/bench_portable.txt" 2>&1; echo "bench portable rc=$? $(el)"
grep -E "^\| (auto|fp8)|roofline|Error" "$o/bench_portable.txt" | cut -c1-120; snap
for path in ${PROF-sm90 portable}; do
  env=""; [ "$path" = portable ] && env="MLA_EXT_FORCE_PORTABLE=1"
  env $env timeout 45 ncu -o "$o/prof_$path" --nvtx --nvtx-include "mla_ext.profile/" -k regex:sparse -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section Occupancy \
    $py bench/profile_sparse.py > "$o/ncu_$path.log" 2>&1
  ncu -i "$o/prof_$path.ncu-rep" --page details > "$o/details_$path.txt" 2>&1
  ncu -i "$o/prof_$path.ncu-rep" --page source --print-source sass --csv > "$o/src_$path.csv" 2>&1
  echo "== profile $path $(el)"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Cache|Issue Slots|Registers Per|Executed Ipc A" "$o/details_$path.txt" | head -12
  $py bench/tools/ncu_source_agg.py "$o/src_$path.csv" 20 > "$o/agg_$path.txt" 2>&1; sed -n 1,60p "$o/agg_$path.txt" | cut -c1-120
  gzip "$o/src_$path.csv"; rm -f "$o/prof_$path.ncu-rep"; snap
done
echo "== summary $(el)"; tail -1 "$o/pytest.txt"; grep -E "^\| fp8_ds_mla b128 s_q2" "$o/bench_default.txt" "$o/bench_portable.txt" | cut -c1-120
