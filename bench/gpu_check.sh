#!/usr/bin/env bash
# Every GPU check and benchmark, from a checkout with the built library in mla_ext/, on a GPU.
#
#   bash bench/gpu_check.sh [checks|bench|all] [--out DIR] [--logs DIR] [--commit C] [--flashmla DIR]
#
# checks  every GPU test, then compute-sanitizer on the small cases: memcheck (every op), racecheck
#         and synccheck (the attention kernels, also with MLA_EXT_FORCE_PORTABLE=1: the portable
#         kernels, what sm100 runs).
# bench   builds the FlashMLA peer in the background as the script starts (third_party_peers/, a
#         git-ignored folder, holds build_flashmla.sh and FlashMLA's source archive; never committed),
#         waits for it, then runs every benchmark, each writing <name>.json and <name>.md into --out.
# all     both (the default); the FlashMLA build overlaps the checks. checks takes ~5 minutes on an
#         H200 (the sanitizers dominate), bench ~2 more.
#
#   --out DIR       where the results go (default bench/results)
#   --logs DIR      outputs of the tests, sanitizers, FlashMLA build and benchmarks (default: a new
#                   temporary folder, printed at the end)
#   --commit C      the commit measured, written into the results (default: git rev-parse --short
#                   HEAD where the checkout has .git)
#   --flashmla DIR  where FlashMLA is built and imported from (default /tmp/flashmla)
#
# Prints a short summary last; exits non-zero if a test, a sanitizer or a benchmark fails.
set -uo pipefail

usage() { sed -n '2,22p' "$0"; }
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

part=all out=bench/results logs="" commit="" flashmla=/tmp/flashmla
while [ $# -gt 0 ]; do
  case $1 in
    checks|bench|all) part=$1 ;;
    --out|--logs|--commit|--flashmla)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
      case $1 in --out) out=$2 ;; --logs) logs=$2 ;; --commit) commit=$2 ;; --flashmla) flashmla=$2 ;; esac
      shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
out=$(abspath "$out")
flashmla=$(abspath "$flashmla")
logs=$(abspath "${logs:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}")
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$out" "$logs"
[ -z "$commit" ] && [ -e .git ] && commit=$(git rev-parse --short HEAD 2>/dev/null || true)

export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
status=0
summary=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$logs/gpu.txt"

# FlashMLA first: its build (~2 minutes) runs while the checks do.
fm_pid=""
if [ "$part" != checks ]; then
  if [ -f third_party_peers/build_flashmla.sh ]; then
    # Alongside the checks, the build gets half the cores (unless MAX_JOBS says otherwise).
    jobs=$(nproc)
    [ "$part" = all ] && jobs=$(( (jobs + 1) / 2 ))
    jobs=${MAX_JOBS:-$jobs}
    echo "== building FlashMLA into $flashmla in the background ($jobs jobs)"
    MAX_JOBS=$jobs bash third_party_peers/build_flashmla.sh "$flashmla" > "$logs/flashmla_build.txt" 2>&1 &
    fm_pid=$!
  else
    echo "== third_party_peers/build_flashmla.sh not found: the benchmarks run without the FlashMLA peer"
  fi
fi

last() { grep -E "$2" "$1" 2>/dev/null | tail -1; }

# run_sanitizer TOOL default|portable SELECTION [TOOL OPTIONS...]: pytest's GPU tests matching
# SELECTION under compute-sanitizer; "portable" forces the portable kernels (the user switch).
run_sanitizer() {
  local tool=$1 path=$2 selection=$3 name rc force=""
  shift 3
  name=$tool$([ "$path" = portable ] && echo _portable)
  [ "$path" = portable ] && force=1
  echo "== compute-sanitizer $tool ($path kernels): -k \"$selection\""
  MLA_EXT_FORCE_PORTABLE=$force timeout 300 compute-sanitizer --tool "$tool" "$@" --error-exitcode 9 --print-limit 5 \
    $py -m pytest -q -p no:cacheprovider -m gpu -k "$selection" tests > "$logs/$name.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  tail -3 "$logs/$name.txt"
  summary+=("$name: $([ $rc -eq 124 ] && echo "TIMED OUT, ")$(last "$logs/$name.txt" 'ERROR SUMMARY|RACECHECK SUMMARY'), $(last "$logs/$name.txt" 'passed|failed|error')")
}

# run_bench NAME SCRIPT [OPTIONS...]: one benchmark, writing NAME.json and NAME.md into $out.
run_bench() {
  local name=$1 rc
  shift
  echo "== $name: $py $* ${common[*]}"
  timeout 540 $py "$@" "${common[@]}" > "$logs/$name.txt" 2>&1
  rc=$?
  tail -30 "$logs/$name.txt"
  [ $rc -eq 0 ] || status=1
  summary+=("$name: $(if [ $rc -eq 0 ]; then echo ok; elif [ $rc -eq 124 ]; then echo "TIMED OUT"; else echo "FAILED (exit $rc)"; fi)")
}

if [ "$part" != bench ]; then
  echo "== GPU tests"
  timeout 400 $py -m pytest -q -m gpu --tb=line tests > "$logs/pytest.txt" 2>&1 || status=1
  tail -15 "$logs/pytest.txt"
  summary+=("tests: $(tail -1 "$logs/pytest.txt")")

  # Deliberately simple -k selections, so that they still match when tests are renamed: the tests
  # meant for the sanitizers have "small" or "sanitizer" in their names; racecheck and synccheck
  # (the slow tools) follow the attention kernels only ("decode" or "sparse" in the test's name or file).
  every_small="small or sanitizer"
  attention_small="(small or sanitizer) and (decode or sparse)"
  run_sanitizer memcheck default "$every_small"
  run_sanitizer racecheck default "$attention_small"
  # --num-cuda-barriers 4096: the fp8 kernels track more mbarriers than synccheck's default table holds (it fails them).
  run_sanitizer synccheck default "$attention_small" --num-cuda-barriers 4096
  run_sanitizer racecheck portable "$attention_small"
  run_sanitizer synccheck portable "$attention_small" --num-cuda-barriers 4096
fi

if [ "$part" != checks ]; then
  if [ -n "$fm_pid" ]; then
    echo "== waiting for the FlashMLA build"
    if wait "$fm_pid"; then tail -1 "$logs/flashmla_build.txt"; else echo "FlashMLA build failed:"; tail -5 "$logs/flashmla_build.txt"; fi
  fi
  common=(--json "$out")
  [ -n "$commit" ] && common+=(--commit "$commit")
  peer=(--flashmla "$flashmla")
  run_bench decode_vs_flashmla bench/bench_decode.py "${peer[@]}"
  run_bench decode_portable bench/bench_decode.py --portable "${peer[@]}"
  run_bench sparse_vs_flashmla bench/bench_sparse.py "${peer[@]}"
  run_bench sparse_portable bench/bench_sparse.py --portable "${peer[@]}"
  run_bench sparse_v4_vs_flashmla bench/bench_sparse_v4.py "${peer[@]}"
  run_bench host bench/bench_host.py "${peer[@]}"
  run_bench absorb bench/bench_absorb.py
  run_bench cache_write bench/bench_cache_write.py
fi

echo
echo "== summary (logs: $logs)"
printf '%s\n' "${summary[@]}"
if [ "$part" != checks ]; then
  echo
  $py bench/summarize.py "$out"
fi
exit $status
