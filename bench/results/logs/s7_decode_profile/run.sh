# Session 7: Nsight Compute source-level profiles of the sm90 fp8_ds_mla decode kernel at block size 16 and 64 (b128 x 4096, h_q 16).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MLA_EXT_FLASHMLA_SO=/nonexistent
o=$(mktemp -d); t0=$(date +%s)
for bs in 16 64; do
  if [ $bs = 16 ]; then only="fp8_ds_mla memory-bound bs16"; else only="fp8_ds_mla memory-bound b=128"; fi
  timeout 120 ncu -o $o/prof_bs$bs --nvtx --nvtx-include "mla_ext.decode_mla.fp8_ds_mla.b128.s1.h16.bs$bs/" -k regex:decode_split -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section InstructionStats --section SchedulerStats \
    python3 bench/bench_decode.py --only "$only" --iters 2 > $o/ncu_bs$bs.log 2>&1
  ncu -i $o/prof_bs$bs.ncu-rep --page details > $o/details_bs$bs.txt 2>&1
  ncu -i $o/prof_bs$bs.ncu-rep --page source --print-source sass --csv > $o/src_bs$bs.csv 2>&1
  echo "== bs$bs [$(( $(date +%s)-t0 ))s]"; grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots|Registers Per|Executed Ipc A|Warp Cycles Per Issued|Executed Instructions  |No Eligible" $o/details_bs$bs.txt | head -12
  gzip $o/src_bs$bs.csv; rm -f $o/prof_bs$bs.ncu-rep
  tar czf $OUT/all.tgz -C $o .
done
