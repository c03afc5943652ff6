#!/usr/bin/env bash
# smla-bench --check on the CPU backend: clean, it passes (exit 0); with one output made wrong (SMLA_BENCH_TEST_FAULT:
# its first element NaN) or the timed runs' outputs made to differ, it fails (exit 1), naming what failed and only that,
# and its JSON record says "pass": false. A check whose verdict or exit code did not follow one output would pass
# here for every output but one. Usage: bench_check_faults.sh SMLA_BENCH
set -u
bench=$1
args=(--backend cpu --shape 64,16,80,32 --repeat 1 --check)
bad=0
fail() { echo "FAILED: $*"; bad=1; }
out=$("$bench" "${args[@]}" 2>&1); rc=$?
[ "$rc" -eq 0 ] || fail "the clean run exited $rc: $out"
[ "$(grep -c ' ok$' <<<"$out")" -eq 3 ] || fail "the clean run did not check dq, dkv and d_sink: $out"
for f in dq dkv d_sink; do
  out=$(SMLA_BENCH_TEST_FAULT=$f "$bench" "${args[@]}" 2>&1); rc=$?
  [ "$rc" -eq 1 ] || fail "$f wrong: exit $rc, expected 1"
  grep -Eq "^check $f +rel_err .*finite NO .* FAIL$" <<<"$out" || fail "$f wrong: not reported as failing: $out"
  [ "$(grep -c ' FAIL$' <<<"$out")" -eq 1 ] || fail "$f wrong: other outputs reported failing too: $out"
  json=$(SMLA_BENCH_TEST_FAULT=$f "$bench" "${args[@]}" --json 2>/dev/null); rc=$?
  [ "$rc" -eq 1 ] || fail "$f wrong, --json: exit $rc, expected 1"
  grep -Eq '"pass": ?false' <<<"$json" || fail "$f wrong, --json: no \"pass\": false in $json"
done
out=$(SMLA_BENCH_TEST_FAULT=repeat "$bench" "${args[@]}" 2>&1); rc=$?
[ "$rc" -eq 1 ] || fail "timed runs' outputs differing: exit $rc, expected 1"
grep -q "differ from the first (checked) run's" <<<"$out" || fail "timed runs' outputs differing: not said: $out"
[ "$(grep -c ' ok$' <<<"$out")" -eq 3 ] || fail "timed runs' outputs differing: the outputs' own checks changed: $out"
out=$(SMLA_BENCH_TEST_FAULT=dqq "$bench" "${args[@]}" 2>&1); rc=$?
[ "$rc" -eq 2 ] || fail "an unknown fault: exit $rc, expected 2 (a usage error): $out"
grep -q "expected dq, dkv, d_sink or repeat" <<<"$out" || fail "an unknown fault: not named: $out"
[ "$bad" -eq 0 ] && echo "every fault failed the check, and only its own"
exit "$bad"
