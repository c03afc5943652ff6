#!/usr/bin/env python3
"""tile_fit.py: split a phase's time into a cost per block and a cost per tile, from smla-bench runs at several
top-k (same T, H, num_kv), by least squares on

    phase_ms = pairs * (c_block * blocks_per_pair + c_tile * tiles_per_pair) / sms

For dq a pair is (token, block of 64 heads) and a tile 32 kv rows; for dkv_interm a pair is (token, 256 columns) and a
tile 64 rows of the chunk. blocks_per_pair is the chunks (n_chunks), tiles_per_pair the tiles over all chunks.
c_block is what a block costs besides its tiles (dq: its Q, dO and O prologue, the fused delta, the epilogue;
dkv_interm: its B operand and first A tiles, the last tile's stores), c_tile what a tile costs; both in microseconds
of one SM, and in cycles at --clock-ghz. Every phase named in --phases is fitted from the same runs.

    python3 bench/tile_fit.py [--bench build/bin/smla-bench] [--base 4096,128,5120] [--topk 32,64,...] [--head-block 64]
                              [--phases dq,dkv_interm] [--backend cuda] [--repeat 10] [--sms 132] [--clock-ghz 1.98]
                              [--json FILE]

Why: at TOPK 160 dq takes ~21.7 us of an SM per block against ~12 us for its 5 tiles at the seed's ~4700 cycles a
tile; if the block cost is that large, overlapping the next block's prologue with this block's tiles (a persistent
kernel) is the lever for the weakest ratio (docs/perf-notes.md v8). Timings come from `smla-bench --breakdown`
(each phase timed alone); this script only fits them. Exit status 0 when every run succeeded and the fit is defined.
"""
import argparse
import json
import math
import subprocess
import sys

# Per phase: the rows of a tile, and a phase's blocks per token (dq: H / --head-block; dkv_interm: its 256-column
# blocks, the wgmma bodies' tile on sm_90a).
PHASES = {"dq": (32, None), "dkv_interm": (64, 512 // 256)}


def run(bench, backend, shape, repeat):
    cmd = [bench, "--json", "--breakdown", "--repeat", str(repeat), "--shape", shape]
    if backend:
        cmd += ["--backend", backend]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("%s failed (rc %d):\n%s" % (" ".join(cmd), out.returncode, out.stdout[-2000:]))


def fit(points):
    """Least squares of y = a x1 + b x2 through the origin; points: (x1, x2, y)."""
    s11 = sum(p[0] * p[0] for p in points)
    s12 = sum(p[0] * p[1] for p in points)
    s22 = sum(p[1] * p[1] for p in points)
    s1y = sum(p[0] * p[2] for p in points)
    s2y = sum(p[1] * p[2] for p in points)
    det = s11 * s22 - s12 * s12
    if len(points) < 2 or abs(det) <= 1e-12 * max(s11 * s22, 1e-300):
        return None
    a = (s1y * s22 - s2y * s12) / det
    b = (s2y * s11 - s1y * s12) / det
    return a, b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="build/bin/smla-bench")
    ap.add_argument("--base", default="4096,128,5120", help="T,H,NUM_KV")
    ap.add_argument("--topk", default="32,64,96,128,160,256,512", help="top-k values, multiples of 16")
    ap.add_argument("--phases", default="dq", help="comma-separated: " + ", ".join(PHASES))
    ap.add_argument("--backend", default="")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--clock-ghz", type=float, default=1.98)
    ap.add_argument("--head-block", type=int, default=64, help="heads a dq block (64: the wgmma body)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    T, H, _ = (int(v) for v in a.base.split(","))
    phases = a.phases.split(",")
    for ph in phases:
        if ph not in PHASES:
            ap.error("unknown phase %r (known: %s)" % (ph, ", ".join(PHASES)))
    if "dq" in phases and H % a.head_block:
        ap.error("H = %d is not a multiple of --head-block %d" % (H, a.head_block))
    points = {ph: [] for ph in phases}
    rows = []
    for k in (int(v) for v in a.topk.split(",")):
        j = run(a.bench, a.backend, "%s,%d" % (a.base, k), a.repeat)
        r_chunk, n_chunks = int(j["r_chunk"]), int(j["n_chunks"])
        row = {"topk": k, "r_chunk": r_chunk, "n_chunks": n_chunks, "end_to_end_ms": float(j["ms"])}
        line = "topk %5d  r_chunk %5d  chunks %d" % (k, r_chunk, n_chunks)
        for ph in phases:
            tile_rows, per_token = PHASES[ph]
            pairs = T * (per_token or H // a.head_block)
            tiles = sum(math.ceil(min(r_chunk, k - c * r_chunk) / tile_rows) for c in range(n_chunks))
            ms = float(j["phases"][ph])
            # per pair and SM: ms * sms / pairs, in microseconds
            points[ph].append((n_chunks, tiles, ms * 1e3 * a.sms / pairs))
            row[ph + "_ms"], row[ph + "_tiles_per_pair"] = ms, tiles
            line += "  %s %8.3f ms (%d tiles/pair)" % (ph, ms, tiles)
        rows.append(row)
        print(line + "  end to end %8.3f ms" % float(j["ms"]), flush=True)
    result = {"base": a.base, "backend": j.get("backend"), "sms": a.sms, "clock_ghz": a.clock_ghz, "runs": rows,
              "fits": {}}
    status = 0
    for ph in phases:
        f = fit(points[ph])
        if f is None:
            print("%s: fit undefined: need two top-k with different tiles per block" % ph)
            status = 1
            continue
        c_block, c_tile = f
        result["fits"][ph] = {"c_block_us": c_block, "c_tile_us": c_tile}
        print("%s per SM: a block %.2f us (%.0f cycles) besides its tiles, a tile %.3f us (%.0f cycles)" %
              (ph, c_block, c_block * a.clock_ghz * 1e3, c_tile, c_tile * a.clock_ghz * 1e3))
        for (x1, x2, y), r in zip(points[ph], rows):
            share = c_block * x1 / (c_block * x1 + c_tile * x2) if c_block * x1 + c_tile * x2 > 0 else float("nan")
            print("  topk %5d: fit %.2f us a pair vs measured %.2f; block cost %.0f%% of %s" %
                  (r["topk"], c_block * x1 + c_tile * x2, y, 100 * share, ph))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print("tile_fit.py: %s" % e, file=sys.stderr)
        sys.exit(1)
