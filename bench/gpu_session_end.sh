#!/usr/bin/env bash
# The validation call of a session on the H200, most important first, each step under its own timeout:
# the seed shape's breakdown with the dense GEMM rate, the float64 check (seed and V4-Flash), the per-phase
# GPU test, the C API test, then the other DSv4 shapes' breakdowns. The side-by-side with torch.compile is
# its own call (bench/side_by_side.py, ~8 minutes for the six shapes).
# Usage (repo root on the H200, build/bin and build/lib carried): bash bench/gpu_session_end.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=build/bin
export SMLA_CACHE_DIR=/tmp/smla-session SMLA_LOG_LEVEL=warn
source "$(dirname "$0")/find_cublas.sh"
step() { local t=$1 name=$2; shift 2; echo "== $name"; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "   rc=$?" >> "$OUT/$name.log"; }
step 60 breakdown $B/smla-bench --breakdown; cat "$OUT/breakdown.log"
step 150 check_seed $B/smla-bench --check; grep -E "check|rc=" "$OUT/check_seed.log"
step 150 check_flash $B/smla-bench --check --shape 4096,64,5120,640; grep -E "check|rc=" "$OUT/check_flash.log"
step 200 phases_gpu $B/test_phases_gpu; grep -E "^\[  (PASSED|FAILED)|Failure|rc=" "$OUT/phases_gpu.log" | head
step 60 test_api $B/test_api; grep -E "^\[  (PASSED|FAILED)|Failure|rc=" "$OUT/test_api.log" | head
for s in 4096,128,5120,1152 4096,64,5120,640 4096,128,4128,160 8192,128,9216,512 4096,128,5120,1024; do
  # (a 1024^3 GEMM is too small to be a rate to compare with: its fraction is cut from the end-to-end line)
  step 60 "breakdown_$s" $B/smla-bench --breakdown --gemm-n 1024 --shape "$s"
  grep -vE "^dense GEMM|^phase" "$OUT/breakdown_$s.log" | sed -E 's/, [0-9.]+% of the dense GEMM rate//' 
done
