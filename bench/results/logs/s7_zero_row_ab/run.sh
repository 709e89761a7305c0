# Session 7: sparse fp8_ds_mla quick bench, a8153bd (.wt/pre) vs ae1afc2 (zero row in the 64-head kernel), alternating.
export PYTHONUNBUFFERED=1
o=$(mktemp -d); t0=$(date +%s); root=$PWD
el() { echo "[$(( $(date +%s)-t0 ))s]"; }
snap() { tar czf $OUT/all.tgz -C $o . ; }
for r in 1 2 3 4; do
  for v in pre head; do
    if [ $v = pre ]; then d=$root/.wt/pre; else d=$root; fi
    (cd $d && PYTHONPATH=$d MLA_EXT_FLASHMLA_SO=/nonexistent timeout 60 python3 bench/bench_sparse.py --quick > $o/bench_${v}_$r.txt 2>&1)
    echo "$v $r: $(grep -E '^\| fp8' $o/bench_${v}_$r.txt | awk -F'|' '{printf "%s ", $3}') $(el)"; snap
  done
done
