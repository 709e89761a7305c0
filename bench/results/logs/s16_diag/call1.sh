#!/usr/bin/env bash
# Session 16, call 1 (forced portable): the timed call's GPU timeline, per-SM active cycles of the split
# kernels, a source-level profile of the fp8_ds_mla bulk-row kernel, and an alternated A/B of four builds
# (.variants/*.so.xz, sm_90a only): base, spread (bulk issue by lane 0 of warps 0-3), pref (L2 prefetch of
# the team's tile after next), both, pdl (split kernels trigger their dependents at the start; combine reads the
# plan before its griddepcontrol.wait).
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent MLA_EXT_FORCE_PORTABLE=1
d=$PWD/bench/results/logs/s16_diag; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
snap() { tar czf "$OUT/call1.tgz" -C "$o" . ; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader | tee "$o/gpu.txt"
for v in base spread pref both pdl; do mkdir -p /tmp/v/$v; cp -r mla_ext /tmp/v/$v/; xz -dc .variants/$v.so.xz > /tmp/v/$v/mla_ext/_C.abi3.so; done
echo "== timeline $(el)"
timeout 150 python3 $d/timeline.py /tmp/v/base 2>&1 | grep -v Warn | tee "$o/timeline.txt"; snap
echo "== A/B $(el)"
for r in 1 2; do for v in base spread pref both pdl; do
  timeout 60 python3 $d/ab.py /tmp/v/$v $v 2>&1 | grep -E "^AB|Error|error" | tee -a "$o/ab.txt"
done; done; snap
echo "== per-SM active cycles $(el)"
for c in fp8_ds_mla:128:4096:64 auto:128:4096:64; do
  timeout 90 ncu --clock-control none --nvtx --nvtx-include "mla_ext.ab.${c%%:*}/" -k regex:decode_split -c 1 \
    --metrics sm__cycles_active.max,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_elapsed.max,smsp__warps_launched.sum \
    --print-metric-instances values python3 $d/ab.py /tmp/v/base ncu $c > "$o/ncu_sm_${c%%:*}.txt" 2>&1
  grep -E "sm__cycles|launched" "$o/ncu_sm_${c%%:*}.txt" | cut -c1-400
done; snap
echo "== source profile, fp8_ds_mla bulk kernel $(el)"
timeout 150 ncu -o "$o/prof_ds" --nvtx --nvtx-include "mla_ext.ab.fp8_ds_mla/" -k regex:decode_split -c 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section Occupancy \
  python3 $d/ab.py /tmp/v/base prof fp8_ds_mla:128:4096:64 > "$o/ncu_prof.log" 2>&1
ncu -i "$o/prof_ds.ncu-rep" --page details > "$o/details_ds.txt" 2>&1
ncu -i "$o/prof_ds.ncu-rep" --page source --print-source sass --csv > "$o/src_ds.csv" 2>&1; gzip "$o/src_ds.csv"; rm -f "$o/prof_ds.ncu-rep"
grep -E "Duration|Elapsed Cycles|SM Active|Warp Cycles Per Issued" "$o/details_ds.txt" | head -5
snap; echo "== done $(el)"
cat "$o/ab.txt"
