# Session 7: sm90 bf16 16-head kernel with bulk row copies from 4 copy warps: tests, in-process A/B vs the portable cp.async kernel, sanitizers.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "bf16_16_head or bf16_gather" tests/test_sparse_gpu.py > $o/pytest_bf16.txt 2>&1; echo "bf16 16-head tests: $(tail -1 $o/pytest_bf16.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest_bf16.txt | head -8; snap
REPS=4 timeout 90 python3 .wt/d/ab_env.py $PWD MLA_EXT_SPARSE_SM90 bulk,cpasync > $o/ab_bulk.txt 2>&1; echo "== A/B $(el)"; tail -5 $o/ab_bulk.txt; snap
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > $o/pytest.txt 2>&1; echo "sparse tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_bf16_16_head_paths and default" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_bf16_16_head_paths" tests/test_sparse_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_bf16_16_head_paths and default" tests/test_sparse_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h "ERROR SUMMARY" $o/synccheck.txt | tail -1) $(grep -E "passed|failed" $o/synccheck.txt | tail -1) $(el)"; snap
