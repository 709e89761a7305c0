#!/usr/bin/env bash
# Session 12, call 4: Nsight Compute source-level profiles of the portable fp8_ds_mla kernels at 890b68d:
# the 64-head kPvRaw kernel (16 threads per row) at b128 s_q2 h_q128, the 16-head copy-warp kernel at b128 h_q16.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
for c in "m64 --b 128 --s-q 2 --h-q 128" "m16 --b 128 --s-q 1 --h-q 16"; do
  set -- $c; name=$1; shift
  MLA_EXT_FORCE_PORTABLE=1 timeout 120 ncu -o "$o/prof_$name" --nvtx --nvtx-include "mla_ext.profile/" -k regex:sparse -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    $py bench/profile_sparse.py --fmt fp8_ds_mla "$@" > "$o/ncu_$name.log" 2>&1
  ncu -i "$o/prof_$name.ncu-rep" --page details > "$o/details_$name.txt" 2>&1
  ncu -i "$o/prof_$name.ncu-rep" --page source --print-source sass --csv > "$o/src_$name.csv" 2>&1
  echo "== profile $name $(el)"; grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|Registers Per|Warp Cycles Per Issued" "$o/details_$name.txt" | head -8
  $py bench/tools/ncu_source_agg.py "$o/src_$name.csv" 30 > "$o/agg_$name.txt" 2>&1; sed -n 1,40p "$o/agg_$name.txt" | cut -c1-150
  gzip "$o/src_$name.csv"; rm -f "$o/prof_$name.ncu-rep"; snap
done
