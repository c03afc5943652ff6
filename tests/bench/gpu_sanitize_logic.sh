#!/usr/bin/env bash
# bench/gpu_sanitize.sh's verdicts without a GPU: a stand-in sanitizer (drops its options, runs the program, prints
# SAN_SUMMARY, exits SAN_RC when set, else the program's status) over a stand-in smla-bench (prints a plan line; exits
# FAIL_RC when its --shape is FAIL_SHAPE, but only under the sanitizer, so that the warm-up alone passes).
set -u
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
cat > "$d/san" <<'S'
#!/usr/bin/env bash
[ "${1:-}" = --version ] && { echo "stand-in sanitizer"; exit 0; }
while [ "${1:0:2}" = -- ]; do shift 2; done
UNDER_SAN=1 "$@"; rc=$?
echo "========= ${SAN_SUMMARY:-ERROR SUMMARY: 0 errors}"; exit "${SAN_RC:-$rc}"
S
cat > "$d/bench" <<'B'
#!/usr/bin/env bash
shape=; while [ $# -gt 0 ]; do [ "$1" = --shape ] && shape=$2; shift; done
[ -n "${NO_PLAN:-}" ] || echo "smla cuda (stand-in) $shape"
[ -n "${UNDER_SAN:-}" ] && [ "$shape" = "${FAIL_SHAPE:-}" ] && exit "${FAIL_RC:-1}"; exit 0
B
chmod +x "$d/san" "$d/bench"
export BENCH=$d/bench SANITIZER=$d/san OUT=$d/out SMLA_CACHE_DIR=$d/cache TOOLS="memcheck racecheck"
v() { bash bench/gpu_sanitize.sh "$@" > "$d/log"; local rc=$?; grep -v '^stand-in' "$d/log" | tr '\n' '|'; echo " exit $rc"; }
echo "all clean:"; v h16 h64
echo "the check fails under the sanitizer:"; FAIL_SHAPE=50,16,120,64 v h16
echo "the sanitizer says 9:"; SAN_RC=9 v h16
echo "a racecheck warning, exit 0:"; SAN_SUMMARY="RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warnings)" TOOLS=racecheck v h16
echo "no plan ran:"; NO_PLAN=1 TOOLS=memcheck v h16
echo "past its limit:"; FAIL_SHAPE=50,16,120,64 FAIL_RC=124 TOOLS=memcheck v h16
echo "seed:"; TOOLS="memcheck racecheck" v seed
