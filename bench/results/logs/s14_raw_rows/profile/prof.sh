#!/usr/bin/env bash
# Session 14, call 2: Nsight Compute source-level profiles of the portable fp8 16-row decode kernel
# (fp8_ds_mla and fp8, b128 x 4096 h_q 16 bs 64) after the raw-row copies (e0cfadf): where the stalls are now.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
cp .wt/s14/C_raw.so mla_ext/_C.abi3.so; py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
for c in "ds fp8_ds_mla" "fp8 fp8"; do
  set -- $c; name=$1; fmt=$2
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 150 ncu -o "$o/prof_$name" --nvtx --nvtx-include "mla_ext.decode_mla.$fmt.b128.s1.h16.bs64/" -k regex:decode_split -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    $py bench/bench_decode.py --only "$fmt memory-bound b=128" --iters 2 > "$o/ncu_$name.log" 2>&1
  ncu -i "$o/prof_$name.ncu-rep" --page details > "$o/details_$name.txt" 2>&1
  ncu -i "$o/prof_$name.ncu-rep" --page source --print-source sass --csv > "$o/src_$name.csv" 2>&1
  echo "== profile $name $(el)"; grep -E "Duration|DRAM Throughput|Registers Per|Warp Cycles Per Issued" "$o/details_$name.txt" | head -6
  gzip "$o/src_$name.csv"; rm -f "$o/prof_$name.ncu-rep"; snap
done
