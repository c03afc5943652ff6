#!/usr/bin/env python3
"""Checks smla-bench --json lines read from stdin (tests/CMakeLists.txt).

  median: each line's ms is the median of its round_ms (for an even count, the mean of the two middle values)
  repeat: each line has out_xxh64_last, the digests of the outputs after the timed runs, with the same outputs
          (dq, dkv, and d_sink with a sink) as out_xxh64, equal to them, and repeat_bitwise true
"""
import json, statistics, sys

mode = sys.argv[1]
lines = [json.loads(l) for l in sys.stdin if l.startswith("{")]
if not lines:
    sys.exit("no JSON line")
for j in lines:
    label = "dq_impl %d dkv_impl %d" % (j["dq_impl"], j["dkv_impl"])
    if mode == "median":
        r = j["round_ms"]
        want = statistics.median(r)
        if abs(j["ms"] - want) > 1e-9 * max(want, 1e-12):
            sys.exit("%s: ms %r is not the median %r of round_ms %r" % (label, j["ms"], want, r))
    elif mode == "repeat":
        first, last = j["out_xxh64"], j.get("out_xxh64_last")
        want = {"dq", "dkv"} | ({"d_sink"} if j["sink"] else set())
        if set(first) != want or last is None or set(last) != want:
            sys.exit("%s: digests %r / %r, expected the outputs %s" % (label, first, last, sorted(want)))
        if last != first or j.get("repeat_bitwise") is not True:
            sys.exit("%s: after the timed runs %r, first run %r, repeat_bitwise %r" % (label, last, first,
                                                                                     j.get("repeat_bitwise")))
    else:
        sys.exit("unknown mode " + mode)
print("%s ok: %d lines" % (mode, len(lines)))
