# Session 7: compute-sanitizer synccheck on the decode TMA kernels (main), with more tracked barriers.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
for nb in 4096; do
  timeout 200 compute-sanitizer --tool synccheck --num-cuda-barriers $nb --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "small_whole_tile or small_for_sanitizer" tests/test_decode_gpu.py > $o/synccheck_$nb.txt 2>&1; echo "synccheck nb=$nb rc=$? $(grep -h 'ERROR SUMMARY' $o/synccheck_$nb.txt | tail -1) $(grep -E 'passed|failed' $o/synccheck_$nb.txt | tail -1) $(grep -c 'Warning' $o/synccheck_$nb.txt) warnings $(el)"; snap
done
grep -m3 -A8 "Error\|Warning" $o/synccheck_4096.txt | head -30
