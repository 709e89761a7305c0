#!/usr/bin/env bash
# One call on the GPU machine: every GPU test, compute-sanitizer memcheck on the small cases of
# every op, racecheck and synccheck on the attention kernels (default and forced-portable paths),
# Nsight Compute runs of the cache write and the decode split kernels, and every benchmark (JSON +
# markdown; with the FlashMLA peer when third_party_peers/ holds it, see mla_ext/bench/flashmla_peer.py).
# Usage (from the repository root, with the built library in mla_ext/):
#   bash bench/gpu_check.sh [OUT_DIR] [PART]  # OUT_DIR defaults to $OUT or bench/results/latest
# PART: checks (tests and sanitizers, ~7 min on an H200), bench (Nsight Compute and benchmarks,
# ~4 min), or all (the default): two calls fit a 10-minute limit per command where one would not.
# Set MLA_EXT_COMMIT to the commit being measured (the GPU machine's copy has no .git).
# Prints a short summary last; exits non-zero if a test or the sanitizer fails. Everything it
# writes is also packed into OUT_DIR/gpu_check.tar.gz (the device tool returns at most 8 files).
set -uo pipefail
dest=${1:-${OUT:-bench/results/latest}}
part=${2:-all}
case $part in checks|bench|all) ;; *) echo "PART must be checks, bench or all, not '$part'" >&2; exit 2 ;; esac
out=$(mktemp -d)
# Only this run's files: on the GPU machine a fresh temporary directory has come back holding an earlier
# session's files (its /tmp is restored between loans), which then went into the archive.
find "$out" -mindepth 1 -delete
trap 'tar -czf "$dest/gpu_check.tar.gz" -C "$out" . && cp "$out"/*.md "$dest"/ 2>/dev/null' EXIT
mkdir -p "$dest"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
status=0
summary=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"

# The attention kernels' small cases that racecheck and synccheck follow (the shared-memory
# pipelines: TMA tiles, bulk copies, copy warps, wgmma); every small case under memcheck.
attn_small="small_for_sanitizer or small_whole_tile or small_wgmma or (small_fp8_16_head_paths and (default or copy0 or cpasync)) \
or (small_fp8_64_head_paths and (default or portable) and not 70) or small_fp8_16_head_paths_long_list"

if [ "$part" != bench ]; then
echo "== GPU tests"
timeout 400 $py -m pytest -q -m gpu --tb=line tests > "$out/pytest.txt" 2>&1 || status=1
tail -15 "$out/pytest.txt"
summary+=("tests: $(tail -1 "$out/pytest.txt")")

echo "== compute-sanitizer memcheck (small cases of every op)"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider \
  -m gpu -k "sanitizer or small or padding_and_int32 or empty_cache" tests > "$out/sanitizer.txt" 2>&1 || status=1
tail -3 "$out/sanitizer.txt"
summary+=("memcheck: $(grep -h 'ERROR SUMMARY' "$out/sanitizer.txt" | tail -1), $(grep -E 'passed|failed' "$out/sanitizer.txt" | tail -1)")

echo "== compute-sanitizer racecheck (small cases of the attention kernels)"
timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider \
  -m gpu -k "$attn_small" tests/test_decode_gpu.py tests/test_sparse_gpu.py > "$out/racecheck.txt" 2>&1 || status=1
tail -3 "$out/racecheck.txt"
summary+=("racecheck: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out/racecheck.txt" | tail -1), $(grep -E 'passed|failed' "$out/racecheck.txt" | tail -1)")

echo "== compute-sanitizer synccheck (small cases of the attention kernels; more tracked mbarriers than the default)"
timeout 300 compute-sanitizer --tool synccheck --num-cuda-barriers 4096 --error-exitcode 9 --print-limit 5 $py -m pytest -q \
  -p no:cacheprovider -m gpu -k "$attn_small" tests/test_decode_gpu.py tests/test_sparse_gpu.py > "$out/synccheck.txt" 2>&1 || status=1
tail -3 "$out/synccheck.txt"
summary+=("synccheck: $(grep -h 'ERROR SUMMARY' "$out/synccheck.txt" | tail -1), $(grep -E 'passed|failed' "$out/synccheck.txt" | tail -1)")

# The portable kernels (what sm100 runs; on sm90 the fp8 ones copy raw rows by cp.async.bulk on mbarriers).
# synccheck needs the larger barrier table here too: with its default, the fp8 16-row kernel's runs end in the
# tool's "overflow of tracked cuda::barrier structures" and a launch failure, depending only on where the
# kernel's rows lie in shared memory (bench/results/logs/s18_synccheck).
portable_small="small_for_sanitizer or small_whole_tile"
for tool in racecheck synccheck; do
  echo "== compute-sanitizer $tool, forced portable (small decode and sparse cases)"
  extra=(); [ $tool = synccheck ] && extra=(--num-cuda-barriers 4096)
  MLA_EXT_FORCE_PORTABLE=1 timeout 200 compute-sanitizer --tool $tool "${extra[@]}" --error-exitcode 9 --print-limit 5 $py -m pytest \
    -q -p no:cacheprovider -m gpu -k "$portable_small" tests/test_decode_gpu.py tests/test_sparse_gpu.py \
    > "$out/${tool}_portable.txt" 2>&1 || status=1
  tail -3 "$out/${tool}_portable.txt"
  summary+=("$tool portable: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out/${tool}_portable.txt" | tail -1), $(grep -E 'passed|failed' "$out/${tool}_portable.txt" | tail -1)")
done

fi

if [ "$part" != checks ]; then
echo "== Nsight Compute: cache write, fp8_ds_mla, 65536 tokens"
timeout 120 ncu --clock-control none --nvtx --nvtx-include "mla_ext.profile/" -k regex:concat_and_cache -c 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  $py bench/bench_cache_write.py --profile > "$out/ncu_cache_write.txt" 2>&1
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per Thread" "$out/ncu_cache_write.txt" | head -6

echo "== Nsight Compute: decode split kernels, memory-bound b128 x 4096 h_q 16 (bf16, fp8_ds_mla) and compute-bound h_q 128 (bf16)"
for c in "auto memory-bound b=128|auto.b128.s1.h16.bs64|auto" "fp8_ds_mla memory-bound b=128|fp8_ds_mla.b128.s1.h16.bs64|fp8_ds_mla" \
         "auto compute-bound b=128|auto.b128.s1.h128.bs64|auto_h128"; do
  IFS='|' read -r only range name <<< "$c"
  MLA_EXT_FLASHMLA_SO=/nonexistent timeout 120 ncu --nvtx --nvtx-include "mla_ext.decode_mla.$range/" -k regex:decode_split -c 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    $py bench/bench_decode.py --only "$only" --iters 2 > "$out/ncu_decode_$name.txt" 2>&1
  echo "-- $name"
  grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Local Memory Spilling Requests  |Warp Cycles Per Issued" "$out/ncu_decode_$name.txt" | head -7
done

echo "== benchmarks"
for bench in bench/bench_*.py; do
  name=$(basename "$bench" .py)
  timeout 300 $py "$bench" --json "$out" > "$out/$name.txt" 2>&1 || { status=1; echo "$name FAILED"; }
  tail -40 "$out/$name.txt"
done
echo "== sparse benchmark, portable kernels only (MLA_EXT_FORCE_PORTABLE=1: what sm100 runs; issue 5's bars are written for it)"
MLA_EXT_FORCE_PORTABLE=1 timeout 120 $py bench/bench_sparse.py --quick --json "$out" > "$out/bench_sparse_portable.txt" 2>&1 \
  || { status=1; echo "bench_sparse (portable) FAILED"; }
tail -8 "$out/bench_sparse_portable.txt"
echo "== decode benchmark, portable kernels only (MLA_EXT_FORCE_PORTABLE=1: what sm100 runs; issue 3's bars are written for it)"
MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 200 $py bench/bench_decode.py --json "$out" > "$out/bench_decode_portable.txt" 2>&1 \
  || { status=1; echo "bench_decode (portable) FAILED"; }
tail -16 "$out/bench_decode_portable.txt"
fi
printf '%s\n' "${summary[@]}"
exit $status
