#!/usr/bin/env bash
# gpu_sanitize.sh (GPU machine): compute-sanitizer over every GPU kernel body, each run checked against float64.
#
#   bash bench/gpu_sanitize.sh [CASE ...]      (default: h128 h64 h16; also chunks, radix, seed)
#
# Cases (smla-bench --check, one run each, outputs and workspace poisoned by smla-bench):
#   h128    65,128,300,160: every dq body (1-4) with every dkv_interm body (1-3), twelve plans
#   h64     70,64,300,192 in top-k chunks of 96: dq_impl 3 with dkv_impl 3 and 4 (the fused interm)
#   h16     50,16,120,64, uniform top-k: the mma.sync bodies of small H
#   chunks  300,128,1300,512 in token chunks of 100 and top-k chunks of 128: the dq carry, dq_impl 3 and 4
#   radix   257,64,9000,256, uniform: csr's 14-bit keys (two radix passes), token chunks of 129
#   seed    4096,128,5120,512 (memcheck only: the other tools are skipped there, and say so)
# Each case's kernels are compiled first outside the sanitizer (SMLA_CACHE_DIR, default a temporary directory).
# Env: BENCH (default build/bin/smla-bench), TOOLS (default "memcheck synccheck initcheck racecheck"), LIM (seconds a
# run; default 40, racecheck 240, seed 300), SANITIZER (default compute-sanitizer on PATH or /usr/local/cuda/bin).
# Logs in $OUT. The sanitizer needs the Firecracker runtime (the H100 machines): on gVisor (the H200 machines) it
# refuses the device (device notes).
# A run is clean when the program exited 0 (its float64 check passed), it printed at least one plan, and the
# sanitizer's summary says 0 errors (racecheck: 0 hazards, 0 warnings). A run past its limit is said as such.
# Exit status: 0 when every run was clean, 1 when one was not, 2 when it could not start.
set -uo pipefail
bench=${BENCH:-build/bin/smla-bench}
san=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
tools=${TOOLS:-memcheck synccheck initcheck racecheck}
out=${OUT:-/tmp/out}
[ -x "$bench" ] || { echo "gpu_sanitize: no $bench (build it and carry it)" >&2; exit 2; }
[ -x "$san" ] || { echo "gpu_sanitize: no compute-sanitizer at $san (set SANITIZER)" >&2; exit 2; }
mkdir -p "$out"
if [ -z "${SMLA_CACHE_DIR:-}" ]; then
  SMLA_CACHE_DIR=$(mktemp -d) || exit 2
  export SMLA_CACHE_DIR
  trap 'rm -rf "$SMLA_CACHE_DIR"' EXIT
fi
export SMLA_LOG_LEVEL=${SMLA_LOG_LEVEL:-warn}
declare -A args=(
  [h128]="--shape 65,128,300,160 --dq-impl 1,2,3,4 --dkv-impl 1,2,3"
  [h64]="--shape 70,64,300,192 --dq-impl 3 --dkv-impl 3,4 --r-chunk 96"
  [h16]="--shape 50,16,120,64 --uniform"
  [chunks]="--shape 300,128,1300,512 --r-chunk 128 --t-chunk 100 --dq-impl 3,4"
  [radix]="--shape 257,64,9000,256 --uniform --t-chunk 129"
  [seed]="--shape 4096,128,5120,512")
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(h128 h64 h16)
for c in "${cases[@]}"; do
  [ -n "${args[$c]:-}" ] || { echo "gpu_sanitize: no case '$c' (h128 h64 h16 chunks radix seed)" >&2; exit 2; }
done
"$san" --version | tail -1
run=("$bench" --backend cuda --repeat 1 --warmup 0 --rounds 1 --check)
bad=0
for c in "${cases[@]}"; do
  # shellcheck disable=SC2206
  a=(${args[$c]})
  "${run[@]}" "${a[@]}" > "$out/warm-$c.log" 2>&1 || { echo "$c: failed without the sanitizer (see warm-$c.log)"; bad=1; }
done
for t in $tools; do
  for c in "${cases[@]}"; do
    if [ "$c" = seed ] && [ "$t" != memcheck ]; then
      echo "$t $c: skipped (memcheck only at full size)"
      continue
    fi
    # shellcheck disable=SC2206
    a=(${args[$c]})
    lim=${LIM:-$([ "$c" = seed ] && echo 300 || { [ "$t" = racecheck ] && echo 240 || echo 40; })}
    start=$SECONDS
    timeout "$lim" "$san" --tool "$t" --print-limit 20 --error-exitcode 9 "${run[@]}" "${a[@]}" > "$out/$t-$c.log" 2>&1
    rc=$?
    plans=$(grep -c '^smla cuda' "$out/$t-$c.log")
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$t-$c.log" | tail -1 | sed 's/^=* *//')
    verdict=clean
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict="timed out after $lim s (LIM)"
    elif [ "$rc" -ne 0 ]; then verdict="not clean (rc $rc)"
    elif [ "$plans" -eq 0 ]; then verdict="not clean (no plan ran)"
    elif ! printf '%s' "$summary" | grep -Eq '^ERROR SUMMARY: 0 errors|^RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)'; then
      verdict="not clean (summary)"
    fi
    echo "$t $c: $verdict, rc $rc, $plans plans checked, ${summary:-no summary} ($((SECONDS - start)) s)"
    [ "$verdict" = clean ] || bad=1
  done
done
[ $bad -eq 0 ] && echo "gpu_sanitize: clean" || echo "gpu_sanitize: NOT clean (logs in $out)"
exit $bad
