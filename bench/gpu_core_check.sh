#!/usr/bin/env bash
# One device call: correctness tests, the seed shape (cold compile, warm from disk, breakdown)
# and the DSv4 shapes. Run from the repo root on the GPU machine with build/ carried.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SMLA_TEST_REQUIRE_CUDA=1  # a CUDA test that skips here is a failure (tests/cuda_required.hpp)
export SMLA_CACHE_DIR=/tmp/smla-cache SMLA_LOG_LEVEL=info
B=build/bin
# Every command's exit status is printed (a failed --check, a crash or a timeout showed nothing).
rc() { echo "   rc=$1"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
rm -rf "$SMLA_CACHE_DIR"
echo "== seed shape, cold cache, --check"; $B/smla-bench --check --json 2>"$OUT/cold.log" | tee "$OUT/seed_cold.json"; rc "${PIPESTATUS[0]}"
grep -E "compiled smla" "$OUT/cold.log" | sed 's/.*smla: //' | tee "$OUT/compile_times.txt"
echo "== seed shape, fresh process, warm disk cache, breakdown"; $B/smla-bench --breakdown 2>"$OUT/seed_breakdown.err" | tee "$OUT/seed_breakdown.txt"; rc "${PIPESTATUS[0]}"; cat "$OUT/seed_breakdown.err"
for s in 4096,128,5120,1024 8192,128,9216,512 4096,64,5120,512 4096,128,5120,1152 4096,64,5120,640 4096,128,4128,160; do
  $B/smla-bench --shape "$s" --json 2>>"$OUT/shapes.err" | tee -a "$OUT/shapes.json"; rc "${PIPESTATUS[0]}"
done
echo "== tests"
for t in test_api test_e2e; do
  timeout 300 $B/$t > "$OUT/$t.log" 2>&1; r=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|FAILED|error" "$OUT/$t.log" | head -40; echo "   $t rc=$r"
done
