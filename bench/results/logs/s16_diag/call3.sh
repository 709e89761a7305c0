#!/usr/bin/env bash
# Session 16, call 3: forced-portable fp8 decode tests of the tile1 build (pdl + one bulk copy per tile when a
# tile is one page, per-quarter valid-row counts as row flags), then an alternated A/B of pdl against tile1
# (ab2.py), and the combine's CTAs per row (MLA_EXT_COMBINE_CHUNKS) on the split b32 x 16K cases with pdl.
export PYTHONUNBUFFERED=1 MLA_EXT_FLASHMLA_SO=/nonexistent
d=$PWD/bench/results/logs/s16_diag; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
snap() { tar czf "$OUT/call3.tgz" -C "$o" . ; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
for v in pdl tile1; do mkdir -p /tmp/v/$v; cp -r mla_ext /tmp/v/$v/; xz -dc .variants/$v.so.xz > /tmp/v/$v/mla_ext/_C.abi3.so; done
cp /tmp/v/tile1/mla_ext/_C.abi3.so mla_ext/_C.abi3.so
export PYTHONPATH=$PWD:$PWD/tests
echo "== tests, tile1 $(el)"
MLA_EXT_FORCE_PORTABLE=1 timeout 200 python3 -m pytest -q -m gpu --tb=short tests/test_decode_gpu.py \
  -k "fp8_ds_mla or ds_mla or fp8 or row_loaders or one_long or large_batch or cuda_graph or small_for_sanitizer or raw_rows or seq_lens" > "$o/pytest_portable.txt" 2>&1
tail -3 "$o/pytest_portable.txt"
MLA_EXT_FORCE_PORTABLE=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu \
  -k "small_for_sanitizer" tests/test_decode_gpu.py > "$o/memcheck.txt" 2>&1
echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1) $(grep -E 'passed|failed' "$o/memcheck.txt" | tail -1)"; snap
echo "== A/B $(el)"
export MLA_EXT_FORCE_PORTABLE=1
c=fp8_ds_mla:128:4096:64,fp8_ds_mla:128:4096:128,fp8_ds_mla:128:4096:16,fp8_ds_mla:32:16384:64,fp8:128:4096:64
for r in 1 2 3; do for v in pdl tile1; do
  timeout 80 python3 $d/ab2.py /tmp/v/$v $v $c 2>&1 | grep -E "^AB|Error|error" | tee -a "$o/ab.txt"
done; done; snap
echo "== combine CTAs per row, pdl $(el)"
for ch in 1 2 4; do
  MLA_EXT_COMBINE_CHUNKS=$ch timeout 80 python3 $d/ab2.py /tmp/v/pdl "pdl chunks=$ch" fp8_ds_mla:32:16384:64,auto:32:16384:64 2>&1 | grep -E "^AB|Error" | tee -a "$o/ab.txt"
done; snap
echo "== done $(el)"
