# Session 10 call 3: page-box tile pairs, second version (lanes copy their pages, block table read a pair ahead).
export PYTHONUNBUFFERED=1
root=$PWD; o=$(mktemp -d); t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
export PYTHONPATH=$root:$root/tests
gunzip -c .wt/s10/pages.so.gz > mla_ext/_C.abi3.so
timeout 100 python3 .wt/s10/order.py > $o/order.txt 2>&1; cat $o/order.txt | tail -8; echo "$(el)"; snap
timeout 150 python3 -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_decode_gpu.py > $o/pytest_decode.txt 2>&1; echo "decode tests: $(tail -1 $o/pytest_decode.txt) $(el)"; grep -E "^FAILED" $o/pytest_decode.txt | head -8; snap
sel="small_wgmma or past_block_table"
for tool in racecheck memcheck synccheck; do
  extra=""; [ $tool = synccheck ] && extra="--num-cuda-barriers 4096"
  timeout 90 compute-sanitizer --tool $tool $extra --error-exitcode 9 --print-limit 5 python3 -m pytest -q -p no:cacheprovider -m gpu -k "$sel" tests/test_decode_gpu.py > $o/$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'RACECHECK SUMMARY\|ERROR SUMMARY' $o/$tool.txt | tail -1) $(grep -E 'passed|failed' $o/$tool.txt | tail -1) $(el)"; grep -m2 "Race reported\|Invalid" $o/$tool.txt | cut -c1-160; snap
done
