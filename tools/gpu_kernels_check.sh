#!/usr/bin/env bash
# Device runner for the TileLang kernels: precompile, GPU tests, benchmarks, roofline report.
#
#   OUT=/some/dir tools/gpu_kernels_check.sh [all|tests|bench]      (default: all)
#
# Runs from any cwd (it cd's to the repo root), uses the ambient python (PY, default python3) with
# the repo's packages on PYTHONPATH (nothing is installed). Every stage has its own timeout, so a
# hung kernel costs at most that stage, and writes under $OUT:
#
#   env.txt                      GPU, driver, python / torch / tilelang versions
#   precompile.log / .json       every kernel bucket compiled in parallel (fills the TileLang
#                                disk cache; compile seconds per bucket)
#   test_<family>.log / .xml     pytest -v output and junit XML per kernel family
#   bench.log, bench.json        pytest-benchmark run (extra_info holds the roofline numbers)
#   roofline.md                  table: time, TB/s, %HBM, TFLOP/s, %bf16, reference time, targets
#   summary.txt                  exit code of every stage, pass/fail counts
#
# Stage budget (seconds): precompile 300, tests 200-240 each, benchmarks 420. "tests" and "bench"
# can run as two separate device calls on the same warm machine (the second reuses the disk
# cache; set SKIP_WS_BENCH=1 if the warp-specialized tests hung in the first call).
set -uo pipefail

MODE=${1:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH="$ROOT/packages/deepinfer-kernels/src:$ROOT/packages/deepinfer-model/src:$ROOT/packages/deepinfer-engine/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TILELANG_LOG_LEVEL=${TILELANG_LOG_LEVEL:-WARNING}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
PYTEST=("$PY" -m pytest -p no:cacheprovider)

stage() {   # stage NAME TIMEOUT CMD...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  local note=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note=" (TIMEOUT after ${limit}s)"
  echo "$name: rc=$rc $((SECONDS - t0))s$note" | tee -a "$SUMMARY"
  return $rc
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  "$PY" -c "import sys, torch, tilelang; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)); print('tilelang', tilelang.__version__)" 2>&1
  command -v nvcc && nvcc --version | tail -2
  git -C "$ROOT" log --oneline -1 2>/dev/null
} > "$OUT/env.txt" 2>&1

stage precompile 300 "$PY" tools/tilelang_precompile.py --json "$OUT/precompile.json" > "$OUT/precompile.log" 2>&1

run_tests() {
  local fam
  for fam in kv_store indexer moe; do
    stage "test_$fam" 240 "${PYTEST[@]}" "packages/deepinfer-kernels/tests/test_tilelang_$fam.py" -v \
      --junitxml="$OUT/test_$fam.xml" > "$OUT/test_$fam.log" 2>&1
  done
  # The pipelined sparse-MLA variant first: it has no inter-warpgroup barriers, so it cannot hang.
  stage test_sparse_mla_pipelined 200 "${PYTEST[@]}" packages/deepinfer-kernels/tests/test_tilelang_sparse_mla.py \
    -v -k "not warpspec" --junitxml="$OUT/test_sparse_mla_pipelined.xml" > "$OUT/test_sparse_mla_pipelined.log" 2>&1
  stage test_sparse_mla_ws 200 "${PYTEST[@]}" packages/deepinfer-kernels/tests/test_tilelang_sparse_mla.py \
    -v -k "not pipelined" --junitxml="$OUT/test_sparse_mla_ws.xml" > "$OUT/test_sparse_mla_ws.log" 2>&1
}

run_bench() {
  local kexpr="tilelang"
  # Do not benchmark the warp-specialized sparse-MLA variant if its tests hung in this run (or
  # SKIP_WS_BENCH=1 says they hung in an earlier call).
  if [ "${SKIP_WS_BENCH:-0}" = 1 ] || grep -Eq "test_sparse_mla_ws: rc=(124|137)" "$SUMMARY"; then
    kexpr="tilelang and not warpspec"
  fi
  stage bench 420 "${PYTEST[@]}" packages/deepinfer-kernels/benchmarks -k "$kexpr" --benchmark-only \
    --benchmark-json="$OUT/bench.json" --benchmark-columns=min,median,max,rounds -v > "$OUT/bench.log" 2>&1
  if [ -s "$OUT/bench.json" ]; then
    stage roofline 60 "$PY" tools/tilelang_roofline.py "$OUT/bench.json" --md "$OUT/roofline.md" \
      --precompile "$OUT/precompile.json" > /dev/null 2>&1
  fi
}

case "$MODE" in
  tests) run_tests ;;
  bench) run_bench ;;
  all) run_tests; run_bench ;;
  *) echo "usage: $0 [all|tests|bench]" >&2; exit 2 ;;
esac

{
  echo "---- pytest results"
  for f in "$OUT"/test_*.log; do
    [ -f "$f" ] && echo "$(basename "$f"): $(grep -E '^(=+ )?[0-9]+ (passed|failed)|^=+ .*(passed|failed|error).* =+$' "$f" | tail -1)"
  done
} >> "$SUMMARY"
cat "$SUMMARY"
