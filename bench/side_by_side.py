#!/usr/bin/env python3
"""side_by_side.py: the contract's backward written with torch ops under torch.compile, against
smla (build/bin/smla-bench --json in a subprocess), on the DSv4 shapes; prints ms and the ratio.

Both use the benchmark top-k of CONTRACT.md (window of 128 + distinct visible pool rows) and a
sink. Agreement of the two is not checked here (smla-bench --check does that against float64).
Run on the H200, repo root: python3 bench/side_by_side.py [--shapes T,H,NUM_KV,TOPK ...]
"""
import argparse, json, math, subprocess, sys
import torch

D, SWA = 512, 128


def bench_topk(T, num_kv, topk, gen):
    """slots 0..SWA-1: t, t-1, ... (-1 when negative); the rest: distinct visible pool rows."""
    t = torch.arange(T)
    win = t[:, None] - torch.arange(SWA)[None, :]
    win = torch.where(win >= 0, win, torch.full_like(win, -1))
    n_pool, n_sel = num_kv - T, topk - SWA
    out = torch.full((T, topk), -1, dtype=torch.int64)
    out[:, :SWA] = win
    if n_sel > 0 and n_pool > 0:
        visible = torch.clamp((t + 1) // 4, max=n_pool)  # pool row j visible once 4(j+1) <= t+1
        # random order of the visible rows: sort random keys, invisible rows pushed to the end
        keys = torch.rand(T, n_pool, generator=gen)
        keys[torch.arange(n_pool)[None, :] >= visible[:, None]] = 2.0
        pick = torch.argsort(keys, dim=1)[:, :n_sel] + T
        ok = torch.arange(n_sel)[None, :] < visible[:, None]
        out[:, SWA:SWA + n_sel] = torch.where(ok, pick, torch.full_like(pick, -1))
    return out.to(torch.int32)


def backward(q, kv, o, do, lse, topk, sink, scale):
    """The contract's math: dq, dkv, d_sink (fp32 accumulation, bf16 outputs)."""
    num_kv = kv.shape[0]
    valid = (topk >= 0) & (topk < num_kv)
    idx = torch.where(valid, topk, 0).long()
    kvg = kv[idx]                                                       # [T, K, D]
    s = torch.einsum("thd,tkd->thk", q, kvg).float() * scale
    p = torch.where(valid[:, None, :], torch.exp(s - lse[:, :, None]), 0.0)
    dp = torch.einsum("thd,tkd->thk", do, kvg).float()
    delta = (o.float() * do.float()).sum(-1)
    ds = p * (dp - delta[:, :, None])
    dq = (torch.einsum("thk,tkd->thd", ds.to(q.dtype), kvg).float() * scale).to(q.dtype)
    dkvg = (torch.einsum("thk,thd->tkd", (ds * scale).to(q.dtype), q).float()
            + torch.einsum("thk,thd->tkd", p.to(q.dtype), do).float())
    dkvg = torch.where(valid[:, :, None], dkvg, 0.0)
    dkv = torch.zeros(num_kv, kv.shape[1], dtype=torch.float32, device=kv.device)
    dkv.index_add_(0, idx.flatten(), dkvg.flatten(0, 1))
    d_sink = -(torch.exp(sink[None, :] - lse) * delta).sum(0)
    return dq, dkv.to(kv.dtype), d_sink


def inputs(T, H, num_kv, topk_n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dev = "cuda"
    r = lambda *s: (torch.randn(*s, generator=gen) * 0.5).to(dev, torch.bfloat16)
    q, kv, do = r(T, H, D), r(num_kv, D), r(T, H, D)
    sink = (torch.randn(H, generator=gen) * 0.5).to(dev)
    topk = bench_topk(T, num_kv, topk_n, gen).to(dev)
    scale = 1.0 / math.sqrt(D)
    with torch.no_grad():  # forward, to get a consistent o and lse (not timed)
        valid = (topk >= 0) & (topk < num_kv)
        kvg = kv[torch.where(valid, topk, 0).long()]
        s = torch.einsum("thd,tkd->thk", q, kvg).float() * scale
        s = torch.where(valid[:, None, :], s, float("-inf"))
        lse = torch.logaddexp(torch.logsumexp(s, -1), sink[None, :])
        o = torch.einsum("thk,tkd->thd", torch.exp(s - lse[:, :, None]).to(q.dtype), kvg)
        del kvg, s
    return q, kv, o, do, lse, topk, sink, scale


def time_ms(fn, warmup=3, repeat=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def ours_ms(shape, exe):
    r = subprocess.run([exe, "--shape", shape, "--json"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"smla-bench failed on {shape}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=["4096,128,5120,512", "4096,128,5120,1152", "4096,64,5120,640",
                                                   "4096,128,4128,160", "8192,128,9216,512", "4096,128,5120,1024"])
    ap.add_argument("--exe", default="build/bin/smla-bench")
    a = ap.parse_args()
    fn = torch.compile(backward)
    print(f"{'T,H,NUM_KV,TOPK':22s} {'torch.compile ms':>17s} {'smla ms':>9s} {'ratio':>7s}", flush=True)
    for shape in a.shapes:
        T, H, nkv, K = map(int, shape.split(","))
        args = inputs(T, H, nkv, K)
        t_torch = time_ms(lambda: fn(*args))
        del args
        torch.cuda.empty_cache()
        t_ours = ours_ms(shape, a.exe)
        print(f"{shape:22s} {t_torch:17.3f} {t_ours:9.3f} {t_torch / t_ours:7.2f}x", flush=True)


if __name__ == "__main__":
    sys.exit(main())
