#!/usr/bin/env bash
# Final device call of a session: GPU correctness of everything on main, then cache timings.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=build/bin
export SMLA_CACHE_DIR=/tmp/smla-final-cache
run() { local t=$1; shift; timeout "$t" "$@" > "$OUT/$(basename $1).log" 2>&1; echo "$(basename $1): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$(basename $1).log" | tr '\n' ' ')"; grep -E "Failure|FAILED  \]" "$OUT/$(basename $1).log" | head -5; }
rm -rf "$SMLA_CACHE_DIR"
echo "== cold plan"; SMLA_LOG_LEVEL=info $B/smla-bench --repeat 5 --warmup 2 2> "$OUT/cold.log"; grep compiled "$OUT/cold.log"
# cuBLAS for the dense GEMM rate of smla-bench --breakdown: the image has no system copy, torch's
# pip package nvidia-cublas ships one (an SMLA_CUBLAS_LIBRARY already set is kept).
if [ -z "${SMLA_CUBLAS_LIBRARY:-}" ]; then
  SMLA_CUBLAS_LIBRARY=$(python3 -c 'import glob, os, nvidia
for v in ("13", "12"):
    hits = sorted(f for p in nvidia.__path__ for f in glob.glob(os.path.join(p, "**", "libcublas.so." + v), recursive=True))
    if hits: print(hits[0]); break' 2>/dev/null)
  [ -n "$SMLA_CUBLAS_LIBRARY" ] || SMLA_CUBLAS_LIBRARY=$(timeout 60 find / -name libcublas.so.13 -not -path '/proc/*' 2>/dev/null | head -1)
  [ -n "$SMLA_CUBLAS_LIBRARY" ] && export SMLA_CUBLAS_LIBRARY
fi
echo "cuBLAS for the GEMM rate: ${SMLA_CUBLAS_LIBRARY:-none found (smla-bench falls back to libcublas.so.13/.12 on the loader path)}"
echo "== warm plan, fresh process + breakdown"; $B/smla-bench --breakdown
run 120 $B/test_phases_gpu
run 60 $B/test_api
[ -x $B/test_cublas_api ] && run 60 $B/test_cublas_api
run 60 $B/test_multidevice
run 60 $B/test_seqpar
run 150 $B/test_e2e
