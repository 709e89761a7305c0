# Session 7: the synccheck step of bench/gpu_check.sh, alone.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
timeout 300 compute-sanitizer --tool synccheck --num-cuda-barriers 4096 --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k small tests/test_decode_gpu.py tests/test_sparse_gpu.py > $o/synccheck.txt 2>&1; echo "synccheck rc=$? $(grep -h 'ERROR SUMMARY' $o/synccheck.txt | tail -1) $(grep -E 'passed|failed' $o/synccheck.txt | tail -1) [$(( $(date +%s)-t0 ))s]"
tar czf $OUT/all.tgz -C $o .
