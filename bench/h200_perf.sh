#!/usr/bin/env bash
# One device call for the speed work (issue 5): the seed shape with the previous kernels
# (build/base/smla-bench, if carried) and the current ones, the GPU tests, the float64 check and
# the DSv4 shapes. Most important first, each step under its own timeout, logs under $OUT.
# Usage (repo root, build/bin and optionally build/base carried): bench/h200_perf.sh [seconds for extra shapes]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SMLA_TEST_REQUIRE_CUDA=1  # a CUDA test that skips here is a failure (tests/cuda_required.hpp)
export SMLA_CACHE_DIR=/tmp/smla-cache SMLA_LOG_LEVEL=warn
B=build/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
step() { local t=$1 name=$2; shift 2; echo "== $name"; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "   rc=$?" >> "$OUT/$name.log"; }
source "$(dirname "$0")/find_cublas.sh"  # SMLA_CUBLAS_LIBRARY for the GEMM rate of --breakdown
if [ -x build/base/smla-bench ]; then
  step 60 base_breakdown build/base/smla-bench --breakdown; cat "$OUT/base_breakdown.log"
fi
step 60 new_breakdown $B/smla-bench --breakdown; cat "$OUT/new_breakdown.log"
step 150 test_e2e $B/test_e2e
step 150 test_api $B/test_api
[ -x $B/test_cublas_api ] && step 60 test_cublas_api $B/test_cublas_api
for t in test_e2e test_api test_cublas_api; do [ -f "$OUT/$t.log" ] || continue; grep -E "^\[  (PASSED|FAILED)|Failure|rc=" "$OUT/$t.log" | head -20; done
step 100 seed_check $B/smla-bench --check; grep -E "check|smla|rc=" "$OUT/seed_check.log"
# register/spill report of the kernels the runtime compiled (cubins in the disk cache)
if command -v cuobjdump > /dev/null; then
  for f in $(find "$SMLA_CACHE_DIR" -type f | head -40); do
    s=$(cuobjdump -sass "$f" 2>/dev/null) || continue
    n=$(echo "$s" | grep -oE "Function : [a-z_]+" | head -1)
    echo "$n $f HMMA=$(echo "$s" | grep -c HMMA) HGMMA=$(echo "$s" | grep -c HGMMA) LDL/STL=$(echo "$s" | grep -cE 'LDL|STL')"
  done > "$OUT/sass.txt" 2>&1; grep -E "dq|dkv" "$OUT/sass.txt"
fi
for s in 4096,128,5120,1152 4096,64,5120,640 4096,128,4128,160 8192,128,9216,512 4096,128,5120,1024; do
  # through step(): a timeout or failure shows its rc; only the JSON line joins shapes.json
  step "${1:-60}" "shape_$s" $B/smla-bench --shape "$s" --json
  grep -E '^\{' "$OUT/shape_$s.log" | tee -a "$OUT/shapes.json"; grep -E 'rc=' "$OUT/shape_$s.log"
done
