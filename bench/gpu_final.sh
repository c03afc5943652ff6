#!/usr/bin/env bash
# Final device call of a session: GPU correctness of everything on main, then cache timings.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=build/bin
export SMLA_CACHE_DIR=/tmp/smla-final-cache
run() { local t=$1; shift; timeout "$t" "$@" > "$OUT/$(basename $1).log" 2>&1; echo "$(basename $1): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$(basename $1).log" | tr '\n' ' ')"; grep -E "Failure|FAILED  \]" "$OUT/$(basename $1).log" | head -5; }
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
