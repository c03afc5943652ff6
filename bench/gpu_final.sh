#!/usr/bin/env bash
# Final device call of a session: GPU correctness of everything on main, then cache timings.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=build/bin
export SMLA_TEST_REQUIRE_CUDA=1  # a CUDA test that skips here is a failure (tests/cuda_required.hpp)
export SMLA_CACHE_DIR=/tmp/smla-final-cache
# (the status saved first: "$(basename ...)" in the echo reset $?, and every test read rc=0, a crash too)
run() {
  local t=$1; shift
  local n; n=$(basename "$1")
  timeout "$t" "$@" > "$OUT/$n.log" 2>&1
  local rc=$?
  echo "$n: rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$n.log" | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" "$OUT/$n.log" | head -5
}
rm -rf "$SMLA_CACHE_DIR"
echo "== cold plan"; SMLA_LOG_LEVEL=info $B/smla-bench --repeat 5 --warmup 2 2> "$OUT/cold.log"; grep compiled "$OUT/cold.log"
source "$(dirname "$0")/find_cublas.sh"  # SMLA_CUBLAS_LIBRARY for the GEMM rate of --breakdown
echo "== warm plan, fresh process + breakdown"; $B/smla-bench --breakdown
run 120 $B/test_phases_gpu
run 60 $B/test_api
[ -x $B/test_cublas_api ] && run 60 $B/test_cublas_api
run 60 $B/test_multidevice
run 60 $B/test_seqpar
run 150 $B/test_e2e
