#!/usr/bin/env bash
# ab.sh: end-to-end A/B of two smla-bench binaries (two builds, e.g. main and an experiment branch) in one
# device call, alternating A and B for ROUNDS rounds per shape so that clock and thermal drift fall on both.
# Each run is its own process (median of REPEAT); the table prints the median over rounds of each and B/A.
#   bench/ab.sh A_BENCH B_BENCH [T,H,NUM_KV,TOPK ...]     (default shape: the seed)
# Env: ROUNDS (3), REPEAT (20), A_ENV / B_ENV (extra VAR=VALUE words for that side, e.g. SMLA_SIDE_STREAM=0).
# Kernel sources are compiled into each binary's library, and the host sizes shared memory from the same
# headers: compare builds. An SMLA_KERNEL_SRC_DIR tree with the build's carve can share one build (A_ENV /
# B_ENV); one whose carve differs fails to compile with a message saying so.
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,9p "$0"; exit 2; }
A=$1 B=$2; shift 2
SHAPES=("$@"); [ ${#SHAPES[@]} -gt 0 ] || SHAPES=(4096,128,5120,512)
ROUNDS=${ROUNDS:-3} REPEAT=${REPEAT:-20}
export SMLA_LOG_LEVEL=${SMLA_LOG_LEVEL:-warn}
median() { sort -g | awk '{v[NR]=$1} END {if (NR) print (NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2); else print "nan"}'; }
one() {  # one run: prints its end-to-end ms, or nothing when it failed (its output goes to stderr)
  local bench=$1 extra=$2 shape=$3 out
  out=$(env $extra "$bench" --json --repeat "$REPEAT" --shape "$shape" 2>&1) || { echo "$out" >&2; return; }
  echo "$out" | python3 -c 'import json,sys
for l in sys.stdin:
    l = l.strip()
    if l.startswith("{"): print(json.loads(l)["ms"])'
}
printf "%-22s %10s %10s %8s\n" "T,H,NUM_KV,TOPK" "A ms" "B ms" "B/A"
for s in "${SHAPES[@]}"; do
  ta=() tb=()
  for ((r = 0; r < ROUNDS; ++r)); do
    ta+=("$(one "$A" "${A_ENV:-}" "$s")")
    tb+=("$(one "$B" "${B_ENV:-}" "$s")")
  done
  ma=$(printf "%s\n" "${ta[@]}" | grep -v '^$' | median)
  mb=$(printf "%s\n" "${tb[@]}" | grep -v '^$' | median)
  printf "%-22s %10s %10s %8s   (A: %s; B: %s)\n" "$s" "$ma" "$mb" \
    "$(awk -v a="$ma" -v b="$mb" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.3f", b / a; else print "-"}')" \
    "${ta[*]}" "${tb[*]}"
done
