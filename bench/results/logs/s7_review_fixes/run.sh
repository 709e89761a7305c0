# Session 7: review fixes: FlashMLA peer (lse check, guarded calls) in the quick benchmarks; the 16-head copy0 variant with its proxy fence back (tests, sanitizers).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
timeout 100 python3 bench/bench_sparse.py --quick > $o/bench_sparse.txt 2>&1; echo "sparse rc=$? $(el)"; grep -E "peer|FlashMLA|as fast|disagree" $o/bench_sparse.txt | cut -c1-130; snap
timeout 150 python3 bench/bench_decode.py --quick > $o/bench_decode.txt 2>&1; echo "decode rc=$? $(el)"; grep -E "peer:|as fast|disagree|no comparable" $o/bench_decode.txt | cut -c1-130; snap
K="small_fp8_16_head_paths and copy0"
timeout 60 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider -k "fp8_16_head or copy0 or scale_spread or rising" tests/test_sparse_gpu.py > $o/pytest.txt 2>&1; echo "tests: $(tail -1 $o/pytest.txt) $(el)"; grep -E "^FAILED|^E  " $o/pytest.txt | head -5; snap
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_sparse_gpu.py > $o/racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' $o/racecheck.txt | tail -1) $(grep -E 'passed|failed' $o/racecheck.txt | tail -1) $(el)"; snap
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_sparse_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h 'ERROR SUMMARY' $o/synccheck.txt | tail -1) $(grep -E 'passed|failed' $o/synccheck.txt | tail -1) $(el)"; snap
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$K" tests/test_sparse_gpu.py > $o/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $o/memcheck.txt | tail -1) $(grep -E 'passed|failed' $o/memcheck.txt | tail -1) $(el)"; snap
