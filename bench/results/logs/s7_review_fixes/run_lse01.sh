# Session 7: the sparse quick benchmark with the peer's lse bound at 0.1.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d)
timeout 100 python3 bench/bench_sparse.py --quick > $o/bench_sparse_lse01.txt 2>&1; echo "sparse rc=$?"; grep -E "peer|FlashMLA|as fast|disagree" $o/bench_sparse_lse01.txt | cut -c1-130
tar czf $OUT/all.tgz -C $o .
