#!/usr/bin/env bash
# kernel_mutants_emulated.sh: the HIP kernels' mutation audit, here on the CPU (perf notes v45): each mutant of
# bench/kernel_mutants.py (a copy of kernel_src with one edit) under test_amd_emulated, through SMLA_KERNEL_SRC_DIR.
#
#   bench/kernel_mutants_emulated.sh BUILD_DIR DIR NAME...     (from the repository root; DIR from kernel_mutants.py)
#
# One mutant at a time (each run spawns a block's work-items as threads), the K 16 test (every phase) unless FILTER
# says otherwise; a line a mutant: killed (with its first failure), or survived. A mutant of the CUDA-only sources
# survives here by construction.
set -uo pipefail
BUILD=$1 D=$2; shift 2
FILTER=${FILTER:-AmdEmulated.EveryHipKernel*}
export SMLA_CACHE_DIR=${SMLA_CACHE_DIR:-/tmp/smla-kernel-mutants-emulated}
for n in "$@"; do
  s=$SECONDS
  out=$(SMLA_KERNEL_SRC_DIR=$D/$n timeout "${PER_TEST_S:-900}" "$BUILD/bin/test_amd_emulated" \
        --gtest_filter="$FILTER" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then echo "$n: survived ($((SECONDS - s)) s)"
  else
    first=$(grep -m1 -A5 'Failure' <<<"$out" | grep -m1 -E 'differs|rel_err|Which is|exception|of token|of row|of head')
    echo "$n: killed, rc $rc ($((SECONDS - s)) s): ${first:-?}"
  fi
done
