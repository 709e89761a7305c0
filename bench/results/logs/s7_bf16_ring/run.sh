# Session 7: bf16 16-head ring of K slots: tests, A/B (in-process ring=1 vs 0, and the a8153bd build in .wt/pre), sanitizers.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "bf16_16_head or bf16_ring" tests/test_sparse_gpu.py > $o/pytest_ring.txt 2>&1; echo "ring tests: $(tail -1 $o/pytest_ring.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest_ring.txt | head -8; snap
timeout 70 python3 .wt/d/ab_ring.py $PWD > $o/ab_head.txt 2>&1; echo "== head $(el)"; tail -4 $o/ab_head.txt; snap
(cd .wt/pre && PYTHONPATH=$PWD timeout 50 python3 ../d/ab_ring.py $PWD 0 > $o/ab_pre.txt 2>&1); echo "== pre (a8153bd) $(el)"; tail -4 $o/ab_pre.txt; snap
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py > $o/pytest.txt 2>&1; echo "sparse tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -8; snap
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_bf16_16_head_paths" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_bf16_16_head_paths" tests/test_sparse_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_bf16_16_head_paths and not ring0" tests/test_sparse_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h "ERROR SUMMARY" $o/synccheck.txt | tail -1) $(grep -E "passed|failed" $o/synccheck.txt | tail -1) $(el)"; snap
