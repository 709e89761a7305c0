# Session 9 call 1: branch shared-piece (f2a2b43) vs main a9b5053 (.wt/pre): all decode GPU tests on shared-piece,
# racecheck + synccheck on the decode wgmma small cases, A/B of memory-bound + h_q 128 cases (2 rounds),
# portable fp8_ds_mla numbers, and an Nsight Compute profile of the portable fp8_ds_mla split kernel.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 200 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY\|ERROR SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 60 compute-sanitizer --tool synccheck --num-cuda-barriers 4096 --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_wgmma" tests/test_decode_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h 'ERROR SUMMARY' $o/synccheck.txt | tail -1) $(grep -E 'passed|failed' $o/synccheck.txt | tail -1) $(el)"; snap
(MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_decode.py --only "memory-bound" --iters 20 > $o/bench_portable.txt 2>&1)
echo "portable: $(grep -E '^\| (auto|fp8)' $o/bench_portable.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent timeout 100 ncu --nvtx --nvtx-include "mla_ext.decode_mla.fp8_ds_mla.b128.s1.h16.bs64/" -k regex:decode_split -c 1 \
    --set full --import-source yes -o $o/ncu_portable_ds python3 bench/bench_decode.py --only "fp8_ds_mla memory-bound b=128" --iters 2 > $o/ncu_portable_ds.log 2>&1
ncu --import $o/ncu_portable_ds.ncu-rep --page details > $o/ncu_portable_ds.txt 2>&1
ncu --import $o/ncu_portable_ds.ncu-rep --page source --csv --print-source sass > $o/ncu_portable_ds_sass.csv 2>&1
echo "ncu: $(grep -E 'Duration|Warp Cycles Per Issued|Registers Per' $o/ncu_portable_ds.txt | head -3 | tr -s ' ' | tr '\n' ';') $(el)"; snap
for r in 1 2; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 80 python3 bench/bench_decode.py --only "bound" --iters 20 > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| (auto|fp8)' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
