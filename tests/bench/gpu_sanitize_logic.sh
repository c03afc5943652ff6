#!/usr/bin/env bash
# bench/gpu_sanitize.sh's verdicts without a GPU: a stand-in sanitizer (drops its options, runs the program, prints a
# summary) over a stand-in smla-bench (prints a plan line; exits FAIL_RC when its --shape is FAIL_SHAPE).
set -u
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
cat > "$d/san" <<'S'
#!/usr/bin/env bash
[ "${1:-}" = --version ] && { echo "stand-in sanitizer"; exit 0; }
while [ "${1:0:2}" = -- ]; do shift 2; done
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors"; exit $rc
S
cat > "$d/bench" <<'B'
#!/usr/bin/env bash
shape=; while [ $# -gt 0 ]; do [ "$1" = --shape ] && shape=$2; shift; done
echo "smla cuda (stand-in) $shape"
[ "$shape" = "${FAIL_SHAPE:-}" ] && exit "${FAIL_RC:-1}"; exit 0
B
chmod +x "$d/san" "$d/bench"
export BENCH=$d/bench SANITIZER=$d/san OUT=$d/out SMLA_CACHE_DIR=$d/cache TOOLS="memcheck racecheck"
bash bench/gpu_sanitize.sh h16 h64 | tail -2; echo "all clean: exit ${PIPESTATUS[0]}"
FAIL_SHAPE=50,16,120,64 bash bench/gpu_sanitize.sh h16 h64 | tail -1; echo "one failing: exit ${PIPESTATUS[0]}"
