# Session 7 final verification: all GPU tests, all benchmarks (JSON + md), sanitizers, decode ncu headlines.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_COMMIT=$1
py=python3; o=$(mktemp -d); t0=$(date +%s)
snap() { tar czf $OUT/all.tgz -C $o . ; }
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 200 $py -m pytest -q -m gpu --tb=line -p no:cacheprovider tests > $o/pytest.txt 2>&1; echo "tests: $(tail -1 $o/pytest.txt) $(el)"
grep -E "^FAILED|Error" $o/pytest.txt | head -10; snap
mkdir -p $o/res
timeout 200 $py bench/bench_decode.py --json $o/res > $o/bench_decode.txt 2>&1; echo "decode bench rc=$? $(el)"; grep -E "faster|bar|MISSED|as fast|peer:" $o/bench_decode.txt | head -16; snap
timeout 150 $py bench/bench_sparse.py --json $o/res > $o/bench_sparse.txt 2>&1; echo "sparse bench rc=$? $(el)"; grep -E "same indices =|h_q128|as fast|peer:" $o/bench_sparse.txt | cut -c1-120; snap
timeout 60 $py bench/bench_absorb.py --json $o/res > $o/bench_absorb.txt 2>&1; echo "absorb bench rc=$? $(el)"; grep -E "MISSED|speedup" $o/bench_absorb.txt | head -8; snap
timeout 30 $py bench/bench_cache_write.py --json $o/res > $o/bench_cache_write.txt 2>&1; echo "cache bench rc=$? $(el)"; snap
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu -k "sanitizer or small or padding_and_int32 or empty_cache" tests > $o/sanitizer.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/sanitizer.txt | tail -1) $(grep -E 'passed|failed' $o/sanitizer.txt | tail -1) $(el)"; snap
timeout 220 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu -k "small_for_sanitizer or small_whole_tile or (small_fp8_16_head_paths and (default or copy0)) or (small_fp8_64_head_paths and default and not 70) or small_fp8_16_head_paths_long_list" tests/test_decode_gpu.py tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
for fmt in fp8_ds_mla fp8 auto; do
  timeout 25 ncu --nvtx --nvtx-include "mla_ext.decode_mla.$fmt.b128.s1.h16.bs64/" -k regex:decode_split -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis $py bench/bench_decode.py --only "$fmt memory-bound b=128" --iters 2 > $o/ncu_decode_$fmt.txt 2>&1
  echo "ncu $fmt: $(grep -E 'Duration|DRAM Throughput|Achieved Occupancy|Registers Per Thread|Spilling Requests  ' $o/ncu_decode_$fmt.txt | awk '{print $1,$2,$NF}' | tr '\n' ';') $(el)"
done
snap
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 --print-limit 5 $py -m pytest -q -p no:cacheprovider -m gpu -k "small_fp8_16_head_paths or small_for_sanitizer or (small_fp8_64_head_paths and default and not 70)" tests/test_sparse_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h 'ERROR SUMMARY' $o/synccheck.txt | tail -1) $(grep -E 'passed|failed' $o/synccheck.txt | tail -1) $(el)"; snap
echo "== summary"; tail -1 $o/pytest.txt; grep -h "same indices =" $o/bench_sparse.txt; grep -h "faster" $o/bench_decode.txt | head -6
