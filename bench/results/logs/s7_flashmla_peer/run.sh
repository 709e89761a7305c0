# Session 7: the FlashMLA peer in the sparse and decode benchmarks (quick cases).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
o=$(mktemp -d); t0=$(date +%s)
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > $o/gpu.txt
timeout 120 python3 bench/bench_sparse.py --quick > $o/bench_sparse.txt 2>&1; echo "sparse rc=$? $(el)"; grep -E "peer|FlashMLA|as fast" $o/bench_sparse.txt | cut -c1-150; snap
timeout 200 python3 bench/bench_decode.py --quick > $o/bench_decode.txt 2>&1; echo "decode rc=$? $(el)"; grep -E "peer|FlashMLA|as fast|Error|error" $o/bench_decode.txt | cut -c1-150; snap
tail -5 $o/bench_decode.txt
