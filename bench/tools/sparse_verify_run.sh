#!/usr/bin/env bash
# Sparse verification run on the GPU machine (repository root, built library in mla_ext/): sparse
# GPU tests; the benchmark with the default kernels (JSON + md) and, fp8_ds_mla only, with each
# variant of the sm90 64-head kernel (MLA_EXT_SPARSE_SM90=cpasync or bulk) and the portable kernel, all in the same
# run; compute-sanitizer memcheck on small 64-head cases; a source-level profile of the default
# fp8_ds_mla b128 s_q2 h_q128 kernel. Results in $OUT/all.tgz, packed after every step.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
timeout 80 $py -m pytest -q -m gpu --tb=short --maxfail=10 -p no:cacheprovider tests/test_sparse_gpu.py > "$o/pytest.txt" 2>&1
echo "tests: $(tail -1 "$o/pytest.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest.txt" | head -20; snap
mkdir -p "$o/default"
timeout 45 $py bench/bench_sparse.py --json "$o/default" > "$o/bench_default.txt" 2>&1; echo "bench default rc=$? $(el)"
grep -E "^\| (auto|fp8)|roofline|self check|Error|h_q 16 /" "$o/bench_default.txt" | cut -c1-120; snap
for v in ${VARIANTS-cpasync bulk portable}; do
  mkdir -p "$o/$v"
  if [ "$v" = portable ]; then e="MLA_EXT_FORCE_PORTABLE=1"; else e="MLA_EXT_SPARSE_SM90=$v"; fi
  env $e timeout 30 $py bench/bench_sparse.py --quick --json "$o/$v" > "$o/bench_$v.txt" 2>&1; echo "bench $v rc=$? $(el)"
  grep -E "^\| fp8" "$o/bench_$v.txt" | cut -c1-100; snap
done
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu \
  -k "small_fp8_64_head_paths and not 70 and (default or cpasync or portable)" tests/test_sparse_gpu.py > "$o/memcheck.txt" 2>&1
echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1) $(tail -1 "$o/memcheck.txt") $(el)"; snap
timeout 40 ncu -o "$o/prof" --nvtx --nvtx-include "mla_ext.profile/" -k regex:sparse -c 1 --section SourceCounters \
  --section WarpStateStats --section SpeedOfLight --section LaunchStats $py bench/profile_sparse.py > "$o/ncu.log" 2>&1
ncu -i "$o/prof.ncu-rep" --page details > "$o/details.txt" 2>&1
ncu -i "$o/prof.ncu-rep" --page source --print-source sass --csv > "$o/src.csv" 2>&1
echo "== profile $(el)"; grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|L1/TEX Cache|Registers Per|Warp Cycles Per Issued" "$o/details.txt" | head -8
$py bench/tools/ncu_source_agg.py "$o/src.csv" 12 > "$o/agg.txt" 2>&1; sed -n 1,18p "$o/agg.txt" | cut -c1-110
gzip "$o/src.csv"; rm -f "$o/prof.ncu-rep"; snap
echo "== summary $(el)"; tail -1 "$o/pytest.txt"; grep -h "^| fp8_ds_mla b128 s_q2" "$o"/bench_*.txt | cut -c1-100
