#!/usr/bin/env bash
# Session 16, call 2: tests (forced portable fp8 decode, combine, graphs) and sanitizers of the e8pdl build
# (bulk copies by eighths, one per warp; split kernels trigger the combine's launch at their start), then an
# alternated A/B of base5 (5f01f93), pdl (the trigger alone) and e8pdl with ab2.py.
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent
d=$PWD/bench/results/logs/s16_diag; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
snap() { tar czf "$OUT/call2.tgz" -C "$o" . ; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
for v in base5 pdl e8pdl; do mkdir -p /tmp/v/$v; cp -r mla_ext /tmp/v/$v/; xz -dc .variants/$v.so.xz > /tmp/v/$v/mla_ext/_C.abi3.so; done
cp /tmp/v/e8pdl/mla_ext/_C.abi3.so mla_ext/_C.abi3.so
export PYTHONPATH=$PWD:$PWD/tests
echo "== tests, e8pdl $(el)"
MLA_EXT_FORCE_PORTABLE=1 timeout 200 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py \
  -k "fp8_ds_mla or ds_mla or fp8 or row_loaders or one_long or large_batch or cuda_graph or small_for_sanitizer or raw_rows or seq_lens" > "$o/pytest_portable.txt" 2>&1
tail -3 "$o/pytest_portable.txt"
timeout 120 python3 -m pytest -q -m gpu --tb=short tests/test_combine_gpu.py tests/test_decode_gpu.py -k "combine or layouts or cuda_graph or compile or opcheck or small or env_selects" > "$o/pytest_default.txt" 2>&1
tail -3 "$o/pytest_default.txt"; snap
echo "== sanitizers, e8pdl forced portable $(el)"
for tool in memcheck racecheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  MLA_EXT_FORCE_PORTABLE=1 timeout 100 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "small_for_sanitizer or raw_rows_selected" tests/test_decode_gpu.py tests/test_combine_gpu.py > "$o/$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$o/$tool.txt" | tail -1) $(grep -E 'passed|failed' "$o/$tool.txt" | tail -1)"
done; snap
echo "== A/B $(el)"
export MLA_EXT_FORCE_PORTABLE=1
for r in 1 2; do for v in base5 pdl e8pdl; do
  timeout 80 python3 $d/ab2.py /tmp/v/$v $v 2>&1 | grep -E "^AB|Error|error" | tee -a "$o/ab.txt"
done; done; snap
echo "== done $(el)"
