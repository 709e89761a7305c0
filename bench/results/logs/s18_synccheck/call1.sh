# Session 18, call 1: what makes synccheck fault on the fp8 half-shift kernel (dba204c)?
# (a) bench/micro/synccheck_bulk_probe.cu: the copy protocol alone, at shifts 0/16/32/128, whole/quarter copies.
# (b) the library, forced portable, the failing case under synccheck, for builds (sm_90a) of:
#     half32 = main (dba204c kernels), base = 2e89ad7 (no shift), half16 / half128 = shift 16 / 128 bytes,
#     dest0 = shift 32 in the layout but the bulk copies land unshifted (wrong results: synccheck only).
set -u
L=$OUT/logs; mkdir -p $L
nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/bulk_probe bench/micro/synccheck_bulk_probe.cu
for s in 0 16 32 128; do for w in 0 1; do
  /tmp/bulk_probe $s $w > $L/probe_plain_${s}_${w}.txt 2>&1; echo "probe plain shift $s whole $w rc $?"
  timeout 120 compute-sanitizer --tool synccheck /tmp/bulk_probe $s $w > $L/probe_sync_${s}_${w}.txt 2>&1
  echo "probe synccheck shift $s whole $w rc $? $(grep -c -i 'error\|overflow' $L/probe_sync_${s}_${w}.txt)"
done; done
for v in base half32 half16 half128 dest0; do xz -dkc .variants/$v.so.xz > .variants/$v.so; done
K='small_whole_tile and 64-fp8]'
run_case() {  # variant, extra sanitizer flags
  cp .variants/$1.so mla_ext/_C.abi3.so
  MLA_EXT_FORCE_PORTABLE=1 timeout 150 compute-sanitizer --tool synccheck $2 python3 -m pytest -q -x -p no:cacheprovider -m gpu -k "$K" tests/test_decode_gpu.py > $L/lib_$1$3.txt 2>&1; rc=$?
  tar czf $OUT/logs.tgz -C $OUT logs
  echo "lib $1 $3 rc $rc overflow $(grep -c overflow $L/lib_$1$3.txt) errors: $(grep -m1 'ERROR SUMMARY' $L/lib_$1$3.txt) | $(tail -1 $L/lib_$1$3.txt)"
}
run_case half32 "" ""
run_case base "" ""
run_case dest0 "" ""
run_case half16 "" ""
run_case half128 "" ""
run_case half32 "--missing-barrier-init-is-fatal no --show-backtrace device" "_nofatal"
cp .variants/half32.so mla_ext/_C.abi3.so
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
