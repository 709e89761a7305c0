# Nsight Compute source-level profiles of the sm90 fp8_ds_mla 16-head kernel, 8 and 16 warps (b128 s_q1 h_q16).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
o=$(mktemp -d); t0=$(date +%s)
for w in 8 16; do
  MLA_EXT_SPARSE_M16_WARPS=$w timeout 80 ncu -o $o/prof_w$w --nvtx --nvtx-include "mla_ext.profile/" -k regex:sparse -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    python3 bench/profile_sparse.py --b 128 --s-q 1 --h-q 16 > $o/ncu_w$w.log 2>&1
  ncu -i $o/prof_w$w.ncu-rep --page details > $o/details_w$w.txt 2>&1
  ncu -i $o/prof_w$w.ncu-rep --page source --print-source sass --csv > $o/src_w$w.csv 2>&1
  ncu -i $o/prof_w$w.ncu-rep --page raw --csv > $o/raw_w$w.csv 2>&1
  echo "== w$w [$(( $(date +%s)-t0 ))s]"; grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots|Registers Per|Executed Ipc A|Warp Cycles Per Issued|Achieved Active" $o/details_w$w.txt | head -12
  gzip $o/src_w$w.csv $o/raw_w$w.csv; rm -f $o/prof_w$w.ncu-rep
  tar czf $OUT/all.tgz -C $o .
done
