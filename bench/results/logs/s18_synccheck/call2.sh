# Session 18, call 2: synccheck of the forced-portable fp8 kernel (small_whole_tile, bs 64) for more builds
# (sm_90a): half64 / half96 = rows 32-63 shifted by 64 / 96 bytes; order0 = the half-shift code (PV key
# order, two copies per tile) with no shift; half32 (main) and base (2e89ad7) with --num-cuda-barriers.
# Then bench/gpu_check.sh's bench part on the full build of main (mla_ext/_C.abi3.so as carried).
set -u
L=$OUT/logs; mkdir -p $L
xz -dkc .variants/main.so.xz > /tmp/main.so
for v in base half32 order0 half64 half96; do xz -dkc .variants/$v.so.xz > .variants/$v.so; done
K='small_whole_tile and 64-fp8]'
run_case() {  # variant, extra sanitizer flags, log suffix
  cp .variants/$1.so mla_ext/_C.abi3.so
  MLA_EXT_FORCE_PORTABLE=1 timeout 150 compute-sanitizer --tool synccheck $2 python3 -m pytest -q -x -p no:cacheprovider -m gpu -k "$K" tests/test_decode_gpu.py > $L/lib_$1$3.txt 2>&1; rc=$?
  tar czf $OUT/logs.tgz -C $OUT logs
  echo "lib $1 $3 rc $rc overflow $(grep -c overflow $L/lib_$1$3.txt) | $(tail -1 $L/lib_$1$3.txt)"
}
run_case order0 "" ""
run_case half64 "" ""
run_case half96 "" ""
run_case half32 "--num-cuda-barriers 4096" "_nb4096"
run_case half32 "--num-cuda-barriers 65536" "_nb65536"
run_case base "--num-cuda-barriers 4096" "_nb4096"
cp /tmp/main.so mla_ext/_C.abi3.so
rm -rf .variants
export MLA_EXT_COMMIT=${MLA_EXT_COMMIT:-unknown} MLA_EXT_FLASHMLA_SO=/nonexistent
bash bench/gpu_check.sh $OUT/b bench > $L/bench_stdout.txt 2>&1; echo "bench rc $?"
tar czf $OUT/logs.tgz -C $OUT logs
tail -30 $L/bench_stdout.txt
