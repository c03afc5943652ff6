#!/usr/bin/env bash
# One device call at the end of a session, most important first, each step under its own timeout
# (the whole fits a short device budget): seed breakdown with the dense GEMM rate, the float64
# check, smla-tune on the two shapes issue 6 names, the side-by-side on the seed shape, test_api.
# Usage (repo root on the H200, build/bin and build/lib carried): bash bench/gpu_session_end.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=build/bin
export SMLA_CACHE_DIR=/tmp/smla-session SMLA_LOG_LEVEL=warn SMLA_TUNING_DB=$OUT/tuning.json
source "$(dirname "$0")/find_cublas.sh"
step() { local t=$1 name=$2; shift 2; echo "== $name"; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "   rc=$?" >> "$OUT/$name.log"; }
step 40 breakdown $B/smla-bench --breakdown; cat "$OUT/breakdown.log"
step 30 check $B/smla-bench --check; grep -E "check|rc=" "$OUT/check.log"
step 150 tune_seed $B/smla-tune --shape 4096,128,5120,512 --max-seconds 90; grep -vE "^\[[0-9]+/" "$OUT/tune_seed.log" | tail -16
step 150 tune_flash $B/smla-tune --shape 4096,64,5120,640 --max-seconds 90; grep -vE "^\[[0-9]+/" "$OUT/tune_flash.log" | tail -16
step 110 side_by_side python3 bench/side_by_side.py --shapes 4096,128,5120,512 --time-budget 60 --json "$OUT/side_by_side.json"; tail -12 "$OUT/side_by_side.log"
step 40 test_api $B/test_api; grep -E "^\[  (PASSED|FAILED)|Failure|rc=" "$OUT/test_api.log" | head
