#!/usr/bin/env python3
"""ncu_sass.py: where a kernel's warps wait, from Nsight Compute's source page (SASS with warp-state samples).

    python3 bench/ncu_sass.py FILE.csv [--top 30] [--split-at REGEX ...]

FILE.csv is `ncu --import REPORT --page source --csv --print-source sass` of a report taken with the source counters
(`--set full`; bench/profile.sh writes them). Prints:
  - the share of all samples by stall reason;
  - the samples by how often their instruction ran (per warp: a block's prologue runs blocks x warps times, a tile
    loop's body tiles x warps times), which tells per-tile from per-block cost;
  - regions: the SASS cut at each instruction matching a --split-at regex (e.g. 'USETMAXREG.DEALLOC' starts dq's
    producer warpgroup), each region's share of the samples with its largest execution counts;
  - per region, the samples by opcode (the SASS mnemonic without predicate or modifiers: HGMMA, IMAD, USHF, ...),
    each with its two main stall reasons: how much of the warps' time goes to address arithmetic, waits or MMA issue;
  - the --top instructions by samples, each with its three main stall reasons.
Why: knock-out timings change the data the tensor cores see, and with it the power drawn and the clocks (perf notes
v16: zeros run faster); the samples say where time goes in the kernel as it is. Samples are per warp: a region's share
is of warp-time, so a warpgroup that waits (a producer) counts as much as one that computes.
"""
import argparse
import csv
import re
import sys
from collections import Counter


def num(s):
    s = s.strip().replace(",", "")
    try:
        return float(s)
    except ValueError:
        return 0.0


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The page starts with a "Kernel Name" line, then the header.
    start = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if start is None:
        sys.exit(f"ncu_sass: {path}: no header with Address and Source (not a source page in CSV?)")
    hdr = rows[start]
    need = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    missing = [h for h in need if h not in hdr]
    if missing:
        sys.exit(f"ncu_sass: {path}: columns missing: {', '.join(missing)} (take the report with --set full)")
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[start + 1:]:
        if len(r) < len(hdr):
            continue
        out.append({
            "addr": r[ix["Address"]].strip(),
            "sass": r[ix["Source"]].strip(),
            "samples": num(r[ix["Warp Stall Sampling (All Samples)"]]),
            "executed": num(r[ix["Instructions Executed"]]),
            "stalls": {h[len("stall_"):]: num(r[ix[h]]) for h in stalls},
        })
    if not out:
        sys.exit(f"ncu_sass: {path}: no instructions")
    return out


def opcode(sass):
    """The mnemonic of a SASS line: '@!P1  BRA 0x60' -> 'BRA', 'HGMMA.64x32x16.F32.BF16 R152, ...' -> 'HGMMA'."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--split-at", action="append", default=[], help="regex: a new region starts at each match")
    a = ap.parse_args()
    ins = load(a.csv)
    total = sum(i["samples"] for i in ins)
    if total <= 0:
        sys.exit("ncu_sass: no warp-state samples in the report (source counters not collected?)")
    print(f"{len(ins)} instructions, {total:.0f} samples")

    reasons = Counter()
    for i in ins:
        reasons.update(i["stalls"])
    print("\nstall reasons (share of all samples):")
    for r, v in reasons.most_common(12):
        if v > 0:
            print(f"  {r:24s} {100 * v / total:6.2f}%")

    splits = [re.compile(s) for s in a.split_at]
    regions = [["start", Counter(), []]]
    by_count = Counter()
    for i in ins:
        if any(s.search(i["sass"]) for s in splits):
            regions.append([f"{i['addr']} {i['sass'][:48]}", Counter(), []])
        regions[-1][1][i["executed"]] += i["samples"]
        regions[-1][2].append(i)
        by_count[i["executed"]] += i["samples"]
    print("\nsamples by how often an instruction ran (per warp; a loop body's count is its trips x warps):")
    for n, v in by_count.most_common(8):
        print(f"  {n:>12.0f}x  {100 * v / total:6.2f}%")
    print("\nregions, each with its three largest execution counts:")
    for name, c, _ in regions:
        parts = "  ".join(f"{n:.0f}x {100 * v / total:.2f}%" for n, v in c.most_common(3) if v > 0)
        print(f"  {100 * sum(c.values()) / total:6.2f}%  from {name}: {parts}")

    print("\nsamples by opcode, per region (share of all samples; two main stall reasons):")
    for name, c, members in regions:
        ops, why = Counter(), {}
        for i in members:
            op = opcode(i["sass"])
            ops[op] += i["samples"]
            why.setdefault(op, Counter()).update(i["stalls"])
        print(f"  from {name}:")
        for op, v in ops.most_common(12):
            if v <= 0:
                break
            main2 = " ".join(f"{r}:{100 * w / v:.0f}%" for r, w in why[op].most_common(2) if w > 0)
            print(f"    {op:12s} {100 * v / total:6.2f}%  {main2}")

    print(f"\ntop {a.top} instructions by samples:")
    for i in sorted(ins, key=lambda i: -i["samples"])[:a.top]:
        if i["samples"] <= 0:
            break
        top = sorted(((v, r) for r, v in i["stalls"].items() if v > 0), reverse=True)[:3]
        why = " ".join(f"{r}:{100 * v / i['samples']:.0f}%" for v, r in top)
        print(f"  {100 * i['samples'] / total:5.2f}%  {i['executed']:>11.0f}x  {i['sass'][:64]:64s} {why}")


if __name__ == "__main__":
    main()
