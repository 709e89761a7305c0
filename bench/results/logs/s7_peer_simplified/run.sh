# Session 7: the simplified FlashMLA peer plumbing (1e392ac) in the quick decode and sparse benchmarks.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d)
timeout 100 python3 bench/bench_sparse.py --quick > $o/bench_sparse.txt 2>&1; echo "sparse rc=$?"; grep -E "^\||as fast|disagree|not run" $o/bench_sparse.txt | cut -c1-120
timeout 150 python3 bench/bench_decode.py --quick > $o/bench_decode.txt 2>&1; echo "decode rc=$?"; grep -E "as fast|disagree|not run|no comparable" $o/bench_decode.txt | cut -c1-130
tar czf $OUT/all.tgz -C $o .
