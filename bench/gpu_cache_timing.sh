#!/usr/bin/env bash
# Cache timings at the seed shape (issue 3) and the per-phase breakdown, in one device call.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SMLA_CACHE_DIR=/tmp/smla-cache-timing
B=build/bin
rm -rf "$SMLA_CACHE_DIR"
echo "== cold (empty cache)";  SMLA_LOG_LEVEL=info $B/smla-bench --json --repeat 3 --warmup 1 2> "$OUT/cold.log"; grep -E "compiled" "$OUT/cold.log"
echo "== warm from disk, fresh process"; $B/smla-bench --json --repeat 3 --warmup 1
echo "== breakdown (fresh process, warm disk)"; $B/smla-bench --breakdown
