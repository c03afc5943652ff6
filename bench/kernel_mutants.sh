#!/usr/bin/env bash
# kernel_mutants.sh: runs the GPU tests against the kernel mutants of bench/kernel_mutants.py (perf notes v44).
#
#   here:    python3 bench/kernel_mutants.py DIR/m [NAME ...]; mkdir DIR/bin; cp build/bin/{test_phases_gpu,test_e2e,test_api} DIR/bin
#   device:  bash bench/kernel_mutants.sh DIR LANES NAME[:new] ...     (from the repository root, DIR carried)
#
# Each NAME (a mutant of DIR/m, or "main": kernel_src as it is, the control) runs test_phases_gpu, then test_e2e's CUDA
# cases (and test_api's index checks for the top-k check's mutants), each with --gtest_break_on_failure so that a
# killed mutant stops at its first failure. NAME:new runs DIR/bin/test_e2e_new's CudaBackendMatchesReference and
# TheA100TilesOnThisGpu instead (a newer test_e2e: does it kill what the old one let through?). LANES mutants at a
# time (the GPU is shared; a survivor takes ~190 s on an H200 with 10 lanes). PER_TEST_S (default 450) bounds each
# test binary: a mutant that hangs a kernel ends there, and counts as killed (its exit status says 124; 137 when
# it had to be killed 10 s later).
# $OUT gets summary.txt (a line a mutant) and digest.txt (its first failure lines) only: the device returns a few
# files, so the logs stay in /tmp/kernel_mutants.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/kernel_mutants
D=$1 LANES=$2; shift 2
B=$D/bin
export SMLA_LOG_LEVEL=error SMLA_TEST_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/summary.txt"
digest() {  # the first failure lines of a log
  { echo "== $1"; grep -E "Failure|test_e2e.cpp:[0-9]+: T=|phases_gpu.cpp:[0-9]+: |Expected|Which is|^\[  FAILED|OK \]" "$2" | head -12; } >> "$OUT/digest.txt"
}
one() {
  local n=$1 mode=${2:-old}
  local src=$D/m/$n s=$SECONDS log=/tmp/kernel_mutants/$n.$mode.log verdict=survived
  [ "$n" = main ] && src=kernel_src
  export SMLA_CACHE_DIR=/tmp/kernel_mutants/cache-$n
  local tests=("test_phases_gpu" "test_e2e --gtest_filter=-*Cpu*:*OnTheCpu*")
  case $n in
    main) tests+=("test_api");;  # the control runs every API test on the GPU (the index checks' strided cases among them)
    topk-check-*|topk-*-stride) tests+=("test_api --gtest_filter=Api.Index*:CApi.Index*");;
  esac
  [ "$mode" = new ] && tests=("test_e2e_new --gtest_filter=E2E.CudaBackendMatchesReference:E2E.TheA100TilesOnThisGpu")
  for t in "${tests[@]}"; do
    echo "=== $t" >> "$log"
    SMLA_KERNEL_SRC_DIR=$src timeout -k 10 "${PER_TEST_S:-450}" $B/$t --gtest_break_on_failure >> "$log" 2>&1; local rc=$?
    if [ $rc -ne 0 ]; then verdict="killed by ${t%% *} (rc $rc)"; break; fi
  done
  echo "$n [$mode]: $verdict ($((SECONDS - s)) s)" | tee -a "$OUT/summary.txt"
  digest "$n [$mode]" "$log"
}
for spec in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$LANES" ]; do wait -n; done
  one ${spec/:/ } &
done
wait
