#!/usr/bin/env bash
# Session 15 call 1: SM clock during the forced-portable memory-bound decode (nvidia-smi sampling and
# Nsight Compute without clock control), fp8_ds_mla / fp8 / bf16, b128 x 4096 h_q 16 bs 64.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests MLA_EXT_FORCE_PORTABLE=1 MLA_EXT_FLASHMLA_SO=/nonexistent
o=$(mktemp -d); find "$o" -mindepth 1 -delete; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv | tee "$o/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 50 > "$o/smi.csv" &
smi=$!
python3 .wt/s15/clockprobe.py fp8_ds_mla,fp8,auto 2>&1 | tee "$o/probe.txt"
kill $smi
python3 - "$o" <<'PY'
import sys, csv, datetime, statistics
o = sys.argv[1]
rows = list(csv.reader(open(f"{o}/smi.csv")))[1:]
marks = [l.split() for l in open(f"{o}/probe.txt") if l.startswith(("BEGIN", "END"))]
def t(s): return datetime.datetime.strptime(s.strip()[-12:], "%H:%M:%S.%f").time()
for i in range(0, len(marks) - 1, 2):
    fmt, b, e = marks[i][1], t(marks[i][2]), t(marks[i + 1][2])
    sel = [r for r in rows if b <= t(r[0].split()[-1][:12]) <= e]
    clk = [int(r[1].split()[0]) for r in sel]; pw = [float(r[3].split()[0]) for r in sel]
    if clk: print(f"{fmt}: {len(clk)} samples, SM clock median {statistics.median(clk)} MHz (min {min(clk)}, max {max(clk)}), power median {statistics.median(pw):.0f} W, reasons {set(r[5].strip() for r in sel)}")
PY
echo "== ncu without clock control $(el)"
for fmt in fp8_ds_mla fp8 auto; do
  timeout 120 ncu --clock-control none --nvtx --nvtx-include "mla_ext.decode_mla.$fmt.b128.s1.h16.bs64/" -k regex:decode_split -c 3 \
    --section SpeedOfLight python3 bench/bench_decode.py --only "$fmt memory-bound b=128" --iters 3 > "$o/ncu_$fmt.txt" 2>&1
  echo "-- $fmt"; grep -E "SM Frequency|Elapsed Cycles|Duration|DRAM Throughput" "$o/ncu_$fmt.txt" | head -12
done
echo "== done $(el)"
cp "$o"/* "$OUT"/
