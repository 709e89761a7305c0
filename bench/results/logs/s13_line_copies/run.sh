#!/usr/bin/env bash
# Session 13, call 2: line-aligned cp.async copies of fp8_ds_mla rows in the portable fp8 16-row decode
# kernel: decode GPU tests forced portable, memcheck/racecheck on small cases, same-GPU A/B against main
# (alternating builds), and a profile of the new copies' shared wavefronts.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
use() { cp .wt/s13/C_$1.so mla_ext/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
use line
MLA_EXT_FORCE_PORTABLE=1 timeout 200 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > "$o/pytest_portable.txt" 2>&1
echo "decode tests forced portable: $(tail -1 "$o/pytest_portable.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_portable.txt" | head -10; snap
timeout 200 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py -k "row_loaders or fp8_16_rows_portable or ds_mla" > "$o/pytest_loaders.txt" 2>&1
echo "loader tests: $(tail -1 "$o/pytest_loaders.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_loaders.txt" | head -10; snap
for tool in memcheck racecheck; do
  MLA_EXT_FORCE_PORTABLE=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or small_whole_tile" tests/test_decode_gpu.py > "$o/san_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/san_$tool.txt" | tail -1) $(tail -1 "$o/san_$tool.txt") $(el)"; snap
done
for v in main line main line; do
  use $v
  MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 $py bench/bench_decode.py --only "fp8_ds_mla memory-bound" > "$o/ab_$v.txt" 2>&1
  echo "$v: $(grep roofline "$o/ab_$v.txt") | $(grep -E '^\| fp8_ds_mla' "$o/ab_$v.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; cat "$o/ab_$v.txt" >> "$o/ab_all.txt"; snap
done
MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 $py bench/bench_decode.py --only "auto memory-bound" > "$o/bf16.txt" 2>&1
echo "bf16 portable: $(grep -E '^\| auto' "$o/bf16.txt" | awk -F'|' '{printf "%s %s; ", $2, $3}') $(el)"; snap
MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 150 ncu -o "$o/prof_line" --nvtx --nvtx-include "mla_ext.decode_mla.fp8_ds_mla.b128.s1.h16.bs64/" -k regex:decode_split -c 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
  $py bench/bench_decode.py --only "fp8_ds_mla memory-bound b=128" --iters 2 > "$o/ncu_line.log" 2>&1
ncu -i "$o/prof_line.ncu-rep" --page details > "$o/details_line.txt" 2>&1
ncu -i "$o/prof_line.ncu-rep" --page source --print-source sass --csv > "$o/src_line.csv" 2>&1; gzip "$o/src_line.csv"; rm -f "$o/prof_line.ncu-rep"
echo "ncu line: $(grep -E 'Duration|Warp Cycles Per Issued' "$o/details_line.txt" | tr -s ' ' | tr '\n' ';') $(el)"; snap
