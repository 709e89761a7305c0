# Session 18, call 5: bench/micro/synccheck_bulk_probe.cu again, now built on csrc's own mbarrier / bulk-copy
# helpers (absorb/sm90/tma.cuh, common/sm80.cuh) instead of its copies of them; synccheck at every shift, with
# the tool's default barrier table.
nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -o /tmp/bulk_probe bench/micro/synccheck_bulk_probe.cu || exit 1
for s in 0 16 32 64 128; do for w in 0 1; do
  r=$(timeout 120 compute-sanitizer --tool synccheck /tmp/bulk_probe $s $w 2>&1)
  echo "shift $s whole $w rc $? | $(echo "$r" | grep -m1 '^shift') | $(echo "$r" | grep -c -i overflow) overflow | $(echo "$r" | grep 'ERROR SUMMARY')"
done; done
