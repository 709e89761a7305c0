#!/usr/bin/env bash
# Session 12, call 3: the portable 16-head fp8_ds_mla kernel with 4 cp.async copy warps (mbarrier completion)
# under the sparse tests (default and forced portable) and memcheck / racecheck / synccheck; the A/B of ab3.py.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3; o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s)
snap() { tar czf "$OUT/all.tgz" -C "$o" . ; }
el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$o/gpu.txt"
timeout 100 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > "$o/pytest_sparse.txt" 2>&1
echo "sparse tests: $(tail -1 "$o/pytest_sparse.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_sparse.txt" | head -12; snap
MLA_EXT_FORCE_PORTABLE=1 timeout 100 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py \
  -k "not selects_kernel" > "$o/pytest_portable.txt" 2>&1
echo "portable tests: $(tail -1 "$o/pytest_portable.txt") $(el)"; grep -E "^FAILED|^E  " "$o/pytest_portable.txt" | head -8; snap
sel="small_for_sanitizer or (small_fp8_16_head_paths and not dequant) or h16_reads_same_rows_as_h64 or (huge_scores and 16)"
for tool in memcheck racecheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  MLA_EXT_FORCE_PORTABLE=1 timeout 120 compute-sanitizer --tool $tool $extra --error-exitcode 9 $py -m pytest -q -p no:cacheprovider \
    tests/test_sparse_gpu.py -k "$sel" > "$o/san_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/san_$tool.txt" | tail -1) $(tail -1 "$o/san_$tool.txt") $(el)"; snap
done
timeout 150 $py .wt/s12/ab3.py 3 > "$o/ab3.txt" 2>&1; echo "ab3 rc=$? $(el)"; snap
echo "== summary $(el)"; tail -1 "$o/pytest_sparse.txt"; tail -1 "$o/pytest_portable.txt"
grep -E "^\||h_q16" "$o/ab3.txt"
