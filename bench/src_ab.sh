#!/usr/bin/env bash
# src_ab.sh: A/B of kernel-source variants (trees like kernel_src/ with the same shared-memory carve, run by one
# build) or of whole builds, in one device call. Two steps:
#
#   here (no GPU):  bench/src_ab.sh prepare DIR [-s T,H,NUM_KV,TOPK]... NAME=TREE [NAME=TREE ...]
#       copies build/bin/smla-bench into DIR/bin and each TREE into DIR/src/NAME (TREE "-": the sources embedded
#       in the build; TREE "@BUILDDIR": another build, e.g. of a branch whose host code differs, whose
#       smla-bench runs this variant with its embedded sources), and warms DIR/cache-NAME for sm_90a and the
#       shapes with smla-warmup (which compiles the tree: a variant that does not compile fails here, not on
#       the device). Default shape: the seed.
#   device:         bench/src_ab.sh run DIR        (from the repository root, DIR carried)
#       ROUNDS rounds (default 2), in each of which every variant runs once per shape, each its own smla-bench process
#       (--json --breakdown --gemm-n 1024 --repeat REPEAT), then a table: per variant the median end to end and
#       per-phase ms over the rounds and the ratio to the first variant, and whether its outputs are bitwise the
#       first variant's and the same in every round (smla-bench's out_xxh64). CHECK=1 then runs `--check` once per
#       variant and shape (~40 s each at the seed shape); CHECK_ONLY="v1 v2" and CHECK_SHAPES="T,H,N,K ..."
#       narrow that to the variants and shapes named; CHECK_FIRST=1 runs them before the timing. Logs in $OUT
#       (default /tmp/out); BUDGET seconds (default 400) bound the whole run: what would pass it is skipped and says
#       so; a process past STEP seconds is stopped (a timing process at 4096,128,5120,1152 takes ~45 s: STEP=90 there),
#       and the table says why a variant has no numbers (timed out, its exit status, or skipped for the budget).
#       ARGS: more smla-bench options for every run and check (e.g. ARGS="--dq-impl 3,4": each process then
#       times both bodies on the same tensors, and the table has a row per variant and body; a body the planner
#       would not choose is not in the warmed cache and compiles on the device at plan time, outside the timed runs).
#
# Why: every variant in its own process with its own warmed cache and SMLA_KERNEL_SRC_DIR, alternating, so drift
# falls on all; nothing compiles on the device. Env for `run`: ROUNDS, REPEAT (20), CHECK, CHECK_FIRST, BUDGET, STEP
# (seconds per process, 40), BACKEND (passed to smla-bench as --backend; default: its own choice), ARGS, INPUTS (the
# directory of inputs kept between processes, default /tmp/smla-bench-inputs; empty: none). Env for
# `prepare`: BUILD, the build directory (default build).
set -uo pipefail
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }  # the header comment
[ $# -ge 2 ] || usage
cmd=$1 dir=${2%/}; shift 2

if [ "$cmd" = prepare ]; then
  shapes=()
  while [ $# -gt 0 ]; do
    case $1 in
      -s) shapes+=("$2"); shift 2 ;;
      *=*) break ;;
      *) usage ;;
    esac
  done
  [ $# -ge 1 ] || usage
  [ ${#shapes[@]} -gt 0 ] || shapes=(4096,128,5120,512)
  B=${BUILD:-build}/bin
  [ -x $B/smla-bench ] && [ -x $B/smla-warmup ] || { echo "src_ab: build $B/smla-bench and smla-warmup first" >&2; exit 1; }
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/src" || exit 1
  cp $B/smla-bench "$dir/bin/"
  printf "%s\n" "${shapes[@]}" > "$dir/shapes.txt"
  : > "$dir/variants.txt"
  warm_args=()
  for s in "${shapes[@]}"; do warm_args+=(--shape "$s"); done
  for v in "$@"; do
    name=${v%%=*} tree=${v#*=}
    [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "src_ab: bad variant name '$name'" >&2; exit 1; }
    wb=$B src_env=(-u SMLA_KERNEL_SRC_DIR)  # the warm-up's build, and the sources it compiles (embedded, or a tree)
    if [ "${tree:0:1}" = @ ]; then
      wb=${tree:1}/bin
      [ -x "$wb/smla-bench" ] && [ -x "$wb/smla-warmup" ] || { echo "src_ab: no smla-bench and smla-warmup in $wb" >&2; exit 1; }
      cp "$wb/smla-bench" "$dir/bin/smla-bench-$name"
    elif [ "$tree" != - ]; then
      [ -d "$tree" ] || { echo "src_ab: no directory $tree" >&2; exit 1; }
      cp -r "$tree" "$dir/src/$name"
      src_env=(SMLA_KERNEL_SRC_DIR=$dir/src/$name)
    fi
    env "${src_env[@]}" SMLA_LOG_LEVEL=warn "$wb/smla-warmup" --arch sm_90a "${warm_args[@]}" --sink both \
      --out "$dir/cache-$name" -j 2 > "$dir/warm-$name.log" 2>&1 || { cat "$dir/warm-$name.log" >&2; exit 1; }
    echo "$name" >> "$dir/variants.txt"
    echo "prepared $name: $(tail -1 "$dir/warm-$name.log")"
  done
  echo "carry $dir ($(du -sh "$dir" | cut -f1)); on the device: bash bench/src_ab.sh run $dir"
  exit 0
fi

[ "$cmd" = run ] || usage
[ -f "$dir/variants.txt" ] || { echo "src_ab: $dir is not prepared (no variants.txt)" >&2; exit 1; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SMLA_LOG_LEVEL=${SMLA_LOG_LEVEL:-warn}
ROUNDS=${ROUNDS:-2} REPEAT=${REPEAT:-20} BUDGET=${BUDGET:-400} STEP=${STEP:-40}
mapfile -t variants < "$dir/variants.txt"
mapfile -t shapes < "$dir/shapes.txt"
extra=(); [ -n "${BACKEND:-}" ] && extra=(--backend "$BACKEND")
# The first process of a shape writes its random inputs (and their float64 forward, ~20 s at the DSv4 shapes) here;
# every later one reads them back (tools/inputs_file.hpp). INPUTS= (empty) makes them in every process.
INPUTS=${INPUTS-/tmp/smla-bench-inputs}
[ -n "$INPUTS" ] && extra+=(--inputs-dir "$INPUTS")
read -ra more_args <<< "${ARGS:-}"
extra+=("${more_args[@]}")
start=$SECONDS
failed=0   # a bench process that failed (a check off the bar, a crash, a timeout): the run's exit status is then 1
skipped=0  # one the budget left out: the run's exit status is then 2 (unless 1), as a check that never ran is no pass
tmp=$(mktemp -d /tmp/src_ab.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT  # this run's writable copies of the caches
# One smla-bench process of variant $1 (its own cache copy, its own source tree); output in $OUT/$2.log.
bench() {
  local v=$1 log=$2; shift 2
  rm -f "$OUT/$log.log" "$OUT/$log.rc"  # an earlier run's into the same OUT would be read as this one's
  if (( SECONDS - start + STEP > BUDGET )); then echo "== skip $log (budget)"; echo skipped > "$OUT/$log.rc"; skipped=1; return 9; fi
  [ -d "$tmp/cache-$v" ] || cp -r "$dir/cache-$v" "$tmp/cache-$v"
  local envs=(SMLA_CACHE_DIR=$tmp/cache-$v)
  [ -d "$dir/src/$v" ] && envs+=(SMLA_KERNEL_SRC_DIR=$dir/src/$v)
  local exe=$dir/bin/smla-bench
  [ -x "$dir/bin/smla-bench-$v" ] && exe=$dir/bin/smla-bench-$v  # a variant from another build
  timeout "$STEP" env -u SMLA_KERNEL_SRC_DIR "${envs[@]}" "$exe" "${extra[@]}" "$@" > "$OUT/$log.log" 2>&1
  local rc=$?
  echo $rc > "$OUT/$log.rc"  # for the summary: why a variant has no numbers
  [ $rc -eq 0 ] || { echo "== $log: rc $rc (see $OUT/$log.log)"; failed=1; }
  return $rc
}
# The --check runs (CHECK=1): after the timing rounds, or before them with CHECK_FIRST=1 (so that a run short of
# budget drops timing rounds rather than the checks that decide whether a variant may land at all).
checks() {
  for s in "${shapes[@]}"; do
    [ -n "${CHECK_SHAPES:-}" ] && [[ " $CHECK_SHAPES " != *" $s "* ]] && continue
    for v in "${variants[@]}"; do
      [ -n "${CHECK_ONLY:-}" ] && [[ " $CHECK_ONLY " != *" $v "* ]] && continue
      STEP=$(( STEP > 120 ? STEP : 120 )) bench "$v" "check_${v}_${s//,/_}" --check --repeat 2 --shape "$s" || true
      echo "check $v $s: $(grep -E '^check' "$OUT/check_${v}_${s//,/_}.log" 2>/dev/null | awk '{print $2, $4, $NF}' | tr '\n' ' ')"
    done
  done
}
[ "${CHECK:-0}" = 1 ] && [ "${CHECK_FIRST:-0}" = 1 ] && checks
# Round-major: every shape's round r before any shape's round r + 1, so that a budget too short for all the rounds
# drops the last rounds of every shape rather than every round of the last shapes. The variants' order is reversed on
# even rounds (A B, B A, ...), so that a drift within a round (the clock settling at the power cap) does not always
# fall on the same variant.
for ((r = 1; r <= ROUNDS; ++r)); do
  order=("${variants[@]}")
  if ((r % 2 == 0)); then order=(); for ((i = ${#variants[@]} - 1; i >= 0; --i)); do order+=("${variants[i]}"); done; fi
  for s in "${shapes[@]}"; do
    for v in "${order[@]}"; do bench "$v" "${v}_${s//,/_}_r$r" --json --breakdown --gemm-n 1024 --repeat "$REPEAT" --shape "$s"; done
  done
done
for s in "${shapes[@]}"; do
  tag=${s//,/_}
  python3 - "$OUT" "$tag" "$ROUNDS" "${variants[@]}" <<'EOF'
import json, statistics, sys
out, tag, rounds, variants = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
rows, first, first_out = [], None, None
for v in variants:
    # One JSON line a planned body (several with --dq-impl/--dkv-impl lists in ARGS): a row each, in their order.
    bodies = {}
    for r in range(1, rounds + 1):
        try:
            lines = [json.loads(l) for l in open("%s/%s_%s_r%d.log" % (out, v, tag, r)) if l.startswith("{")]
        except OSError:
            continue
        seen = {}  # a body listed twice (an A/A, --dq-impl 3,3): a row for each, "#2" for the second
        for j in lines:
            label = v if len(lines) == 1 else "%s dq%d/dkv%d" % (v, j["dq_impl"], j["dkv_impl"])
            seen[label] = seen.get(label, 0) + 1
            if seen[label] > 1:
                label += " #%d" % seen[label]
            bodies.setdefault(label, []).append(j)
    if not bodies:
        why = []  # the rounds' exit statuses: 124 the STEP timeout, no status at all a budget skip
        for r in range(1, rounds + 1):
            try:
                rc = int(open("%s/%s_%s_r%d.rc" % (out, v, tag, r)).read())
                why.append("timed out (STEP)" if rc == 124 else "rc %d" % rc if rc else "no JSON")
            except (OSError, ValueError):
                why.append("skipped (budget)")
        rows.append((v, None, {", ".join(sorted(set(why))): 0}, 0, "")); continue
    for label, runs in bodies.items():
        ms = statistics.median(j["ms"] for j in runs)
        phases = {k: statistics.median(j["phases"][k] for j in runs if k in j.get("phases", {}))
                  for k in runs[0].get("phases", {})}
        if first is None:
            first, first_label = ms, label
        # The outputs' digests (smla-bench's out_xxh64, the first run of each process): the same in every round
        # (deterministic across processes), and the same as the first row's (bitwise equal to the baseline)?
        digests = [j.get("out_xxh64") for j in runs if j.get("out_xxh64")]
        note = ""
        if digests:
            varies = sorted(k for k in digests[0] if any(d.get(k) != digests[0][k] for d in digests))
            if first_out is None:
                first_out = (label, digests[0])
            differs = sorted(k for k in digests[0] if digests[0][k] != first_out[1].get(k))
            note = ("out: varies across rounds (%s)" % ", ".join(varies) if varies else
                   "out: differs from %s (%s)" % (first_out[0], ", ".join(differs)) if differs else
                   "out: same in every round" if first_out[0] == label else "out: bitwise %s's" % first_out[0])
        rows.append((label, ms, phases, len(runs), note))
print("shape %s, median over rounds (ms)%s:" % (tag.replace("_", ","), "" if first is None or rows[0][1] is not None
      else "; the first variant has no numbers, so the ratios are to " + first_label))
for v, ms, phases, n, note in rows:
    if ms is None:
        print("  %-20s no numbers: %s" % (v, next(iter(phases)))); continue
    print("  %-20s %8.3f  x%.3f  (%d runs)  %s%s" % (v, ms, ms / first, n,
          "  ".join("%s %.3f" % kv for kv in sorted(phases.items())), "  " + note if note else ""))
EOF
done
[ "${CHECK:-0}" = 1 ] && [ "${CHECK_FIRST:-0}" != 1 ] && checks
echo "src_ab: $((SECONDS - start)) s$([ $failed = 1 ] && echo ", some runs failed (rc above): exit 1" || { [ $skipped = 1 ] && echo ", some runs skipped for the budget: exit 2"; })"
[ $failed = 1 ] && exit 1
[ $skipped = 1 ] && exit 2
exit 0
