#!/usr/bin/env python3
"""hbm_mix.py: what the GPU's memory sustains for the traffic mixes of smla's memory-bound phases, measured with
torch on the same device, so that a phase's bytes can be set against a floor that was measured, not the data sheet.

    python3 bench/hbm_mix.py [--gib 2] [--repeat 20] [--json FILE]

Mixes (each over --gib GiB per operand, bf16, CUDA events, median of --repeat after two warm-up runs):
  read      x.sum()                                  read only (gather reads interm: ~all of its traffic)
  write     y.fill_(1)                               write only
  copy      y.copy_(x)                               1 : 1 read : write (dkv_interm: ~2.2 GB read, 2.1 GB written)
  read2w1   torch.add(x, z, out=y[:n/2]) on halves   2 : 1 read : write
Why: dkv_interm at the seed moves ~4.3 GB in ~1.55 ms (~2.8 TB/s), against ~4.8 TB/s on the data sheet; whether
that is near what a 1 : 1 mix sustains decides whether a faster dkv_interm must move fewer bytes (docs/perf-notes.md,
v11). Exit status 0 when every mix ran.
"""
import argparse
import json
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("hbm_mix: no CUDA device", file=sys.stderr)
        return 1
    n = int(a.gib * 2**30) // 2 // 1024 * 1024
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    z = torch.randn(n // 2, device="cuda", dtype=torch.bfloat16)
    b = 2 * n  # bytes of one operand
    mixes = {
        "read": (lambda: x.sum(), b, 0),
        "write": (lambda: y.fill_(1.0), 0, b),
        "copy": (lambda: y.copy_(x), b, b),
        "read2w1": (lambda: torch.add(x[: n // 2], z, out=y[: n // 2]), b, b // 2),
    }
    out = {"device": torch.cuda.get_device_name(), "gib": a.gib, "mixes": {}}
    for name, (fn, rd, wr) in mixes.items():
        for _ in range(2):
            fn()
        ts = []
        for _ in range(a.repeat):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        ms = statistics.median(ts)
        tbs = (rd + wr) / (ms * 1e-3) / 1e12
        out["mixes"][name] = {"ms": ms, "read_bytes": rd, "write_bytes": wr, "tb_per_s": tbs}
        print(f"{name:8s} read {rd / 1e9:6.2f} GB write {wr / 1e9:6.2f} GB  {ms:8.3f} ms  {tbs:5.2f} TB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
