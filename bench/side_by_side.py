#!/usr/bin/env python3
"""side_by_side.py: smla against the contract's backward written with torch ops under torch.compile,
in ONE process on the SAME torch tensors: both timed with device events (warm-up, then alternating
runs, median), smla's dq, dkv, d_sink checked against torch's, and the ratio printed per shape.

smla is called through its C API (build/lib/libsmla.so, bench/smla_ctypes.py) on torch's current
stream with a torch-allocated workspace. Its outputs are filled with NaN before its first run, so an
element it never writes shows up as non-finite. Inputs: normal(0, 0.5), a sink, and the benchmark
top-k of CONTRACT.md (window of 128 + distinct visible pool rows); o and lse come from a torch forward.

Also printed: a dense bf16 GEMM rate measured here (torch.mm, N^3), smla's TFLOP/s (10 T H TOPK 512
FLOPs, as the contract counts them) and its fraction of that rate; for the cheapest shape, if memory
allows, both implementations against a float64 run of the same math (--f64).

The torch side is the math as one writes it with bf16 tensors, not the contract's rounding to the letter: its
einsums return S and dP rounded to bf16, dq's product is rounded to bf16 before the scale and again after, and each
slot's dkv contribution (its sum over heads, two terms rounded apart) is bf16 before the fp32 index_add_. That
costs it accuracy (~3.3e-3 relative from float64 for dq at a small shape, against ~1.7e-3 with fp32 intermediates;
smla's is ~2.1e-3) and saves it time, so the ratio printed is, if anything, in torch's favour; --f64 shows both
sides' errors from float64.

Exit status: 0 every shape run and agreed; 1 some shape disagreed or smla failed; 2 none disagreed
but some were not checked (torch out of memory or failed) or were skipped by --time-budget.

GPU (repo root, build/lib carried):  python3 bench/side_by_side.py [--json out.json]
CPU smoke test:  python3 bench/side_by_side.py --device cpu --backend cpu --no-compile --shapes 64,16,80,64
"""
import argparse, gc, json, math, os, statistics, sys, time

import torch

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smla_ctypes import Smla, SmlaError  # noqa: E402

D, SWA = 512, 128
DEFAULT_SHAPES = ["4096,128,5120,512", "4096,128,5120,1152", "4096,64,5120,640", "4096,128,4128,160",
                  "8192,128,9216,512", "4096,128,5120,1024"]
REL_MAX, COS_MIN = 1e-2, 0.9999


def bench_topk(T, num_kv, topk, gen):
    """slots 0..SWA-1: t, t-1, ... (-1 when negative); the rest: distinct visible pool rows."""
    t = torch.arange(T)
    win = t[:, None] - torch.arange(min(SWA, topk))[None, :]
    win = torch.where(win >= 0, win, torch.full_like(win, -1))
    n_pool, n_sel = num_kv - T, topk - SWA
    out = torch.full((T, topk), -1, dtype=torch.int64)
    out[:, :win.shape[1]] = win
    if n_sel > 0 and n_pool > 0:
        visible = torch.clamp((t + 1) // 4, max=n_pool)  # pool row j visible once 4(j+1) <= t+1
        # random order of the visible rows: sort random keys, invisible rows pushed to the end
        keys = torch.rand(T, n_pool, generator=gen)
        keys[torch.arange(n_pool)[None, :] >= visible[:, None]] = 2.0
        pick = torch.argsort(keys, dim=1)[:, :n_sel] + T
        ok = torch.arange(min(n_sel, n_pool))[None, :] < visible[:, None]
        out[:, SWA:SWA + pick.shape[1]] = torch.where(ok, pick, torch.full_like(pick, -1))
    return out.to(torch.int32)


def backward(q, kv, o, do, lse, topk, sink, scale):
    """The contract's math: dq, dkv, d_sink. bf16 inputs: fp32 accumulation, bf16 GEMM operands and
    outputs; float64 inputs: everything in float64 (the reference of --f64)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    num_kv = kv.shape[0]
    valid = (topk >= 0) & (topk < num_kv)
    idx = torch.where(valid, topk, 0).long()
    kvg = kv[idx]                                                       # [T, K, D]
    s = torch.einsum("thd,tkd->thk", q, kvg).to(acc) * scale
    p = torch.where(valid[:, None, :], torch.exp(s - lse[:, :, None]), 0.0)
    dp = torch.einsum("thd,tkd->thk", do, kvg).to(acc)
    delta = (o.to(acc) * do.to(acc)).sum(-1)
    ds = p * (dp - delta[:, :, None])
    dq = (torch.einsum("thk,tkd->thd", ds.to(q.dtype), kvg).to(acc) * scale).to(q.dtype)
    dkvg = (torch.einsum("thk,thd->tkd", (ds * scale).to(q.dtype), q).to(acc)
            + torch.einsum("thk,thd->tkd", p.to(q.dtype), do).to(acc))
    dkvg = torch.where(valid[:, :, None], dkvg, 0.0)
    dkv = torch.zeros(num_kv, kv.shape[1], dtype=acc, device=kv.device)
    dkv.index_add_(0, idx.flatten(), dkvg.flatten(0, 1))
    d_sink = -(torch.exp(sink[None, :] - lse) * delta).sum(0)
    return dq, dkv.to(kv.dtype), d_sink


def inputs(T, H, num_kv, topk_n, dev, seed=0):
    gen = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=gen, device=dev) * 0.5).to(torch.bfloat16)
    q, kv, do = r(T, H, D), r(num_kv, D), r(T, H, D)
    sink = torch.randn(H, generator=gen, device=dev) * 0.5
    topk = bench_topk(T, num_kv, topk_n, torch.Generator().manual_seed(seed + 1)).to(dev)
    scale = 1.0 / math.sqrt(D)
    with torch.no_grad():  # forward, to get a consistent o and lse (not timed)
        valid = (topk >= 0) & (topk < num_kv)
        kvg = kv[torch.where(valid, topk, 0).long()]
        s = torch.einsum("thd,tkd->thk", q, kvg).float() * scale
        s = torch.where(valid[:, None, :], s, float("-inf"))
        lse = torch.logaddexp(torch.logsumexp(s, -1), sink[None, :])
        o = torch.einsum("thk,tkd->thd", torch.exp(s - lse[:, :, None]).to(q.dtype), kvg)
        del kvg, s
    return q, kv, o, do, lse.contiguous(), topk.contiguous(), sink, scale


class Timer:
    """Milliseconds a call: device events on CUDA, the host clock on the CPU. Each sample is `batch` calls queued back
    to back, divided by `batch`: with one call from an idle GPU, the host's time before its first kernel (dynamo's
    guards and Inductor's Python wrapper; one ctypes call for smla) was timed too, in smla's favour, where a training
    loop's host runs ahead of the GPU and hides it."""

    def __init__(self, dev, batch=1):
        self.cuda = dev.type == "cuda"
        self.batch = batch

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(self.batch):
                fn()
            b.record(); b.synchronize()
            return a.elapsed_time(b) / self.batch
        t0 = time.perf_counter()
        for _ in range(self.batch):
            fn()
        return (time.perf_counter() - t0) * 1e3 / self.batch


def gemm_tflops(n, dev, timer, warmup, repeat):
    a = torch.randn(n, n, device=dev).to(torch.bfloat16)
    b = torch.randn(n, n, device=dev).to(torch.bfloat16)
    for _ in range(warmup):
        torch.mm(a, b)
    timer.sync()
    ms = statistics.median(timer(lambda: torch.mm(a, b)) for _ in range(repeat))
    del a, b
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12, ms


def compare(x, ref, chunk=1 << 26):
    """relative L2 error ||x - ref|| / ||ref|| and cosine, accumulated in float64 chunk by chunk;
    finite: x and ref have no NaN/Inf."""
    xf, rf = x.reshape(-1), ref.reshape(-1)
    num = den = dot = nx = 0.0
    finite = True
    for i in range(0, xf.numel(), chunk):
        a, b = xf[i:i + chunk].double(), rf[i:i + chunk].double()
        finite = finite and bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())
        num += float(((a - b) ** 2).sum()); den += float((b * b).sum())
        dot += float((a * b).sum()); nx += float((a * a).sum())
    rel = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)
    cos = dot / math.sqrt(nx * den) if nx > 0 and den > 0 else (1.0 if nx == den == 0 else 0.0)
    ok = finite and rel <= REL_MAX and cos >= COS_MIN
    return {"rel": rel, "cos": cos, "finite": finite, "ok": ok}


def f64_bytes(T, H, K, num_kv):
    """rough peak of backward() in float64: inputs, [T,K,D] gathers and products, [T,H,K] scores."""
    return 8 * (5 * T * H * D + 4 * T * K * D + 6 * T * H * K + 2 * num_kv * D)


def is_oom(e):
    return isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()


def run_shape(a, shape, smla_rt, dev, timer, gemm, do_f64):
    T, H, nkv, K = shape
    row = {"shape": ",".join(map(str, shape)), "T": T, "H": H, "num_kv": nkv, "topk": K,
           "flops": 10.0 * T * H * K * D}
    args = inputs(T, H, nkv, K, dev)
    q, kv, o, do, lse, topk, sink, scale = args
    stream = torch.cuda.current_stream().cuda_stream if dev.type == "cuda" else None
    dev_index = (dev.index if dev.index is not None else torch.cuda.current_device()) if dev.type == "cuda" else 0

    # smla: plan (compiles or loads its kernels), workspace from torch, NaN-poisoned outputs, first run
    t0 = time.perf_counter()
    plan = smla_rt.plan(T=T, H=H, num_kv=nkv, topk=K, has_sink=True, scale=scale, r_chunk=a.r_chunk,
                        backend=a.backend, device=dev_index)
    row["smla_plan_s"] = time.perf_counter() - t0
    row["workspace_bytes"] = plan.workspace_bytes
    ws = plan.workspace(dev)
    dq = torch.full_like(q, float("nan"))
    dkv = torch.full_like(kv, float("nan"))
    d_sink = torch.full((H,), float("nan"), dtype=torch.float32, device=dev)
    ours = plan.bind(q, kv, o, do, lse, topk, sink, dq, dkv, d_sink, ws)
    ours(stream)
    timer.sync()
    first = (dq.clone(), dkv.clone(), d_sink.clone())

    # torch: compiled once per shape (static shapes), the first call compiles
    ref, fn = None, backward
    if a.compile:
        torch._dynamo.reset()
        fn = torch.compile(backward, dynamic=False, mode=a.compile_mode)
    try:
        t0 = time.perf_counter()
        # cloned: under CUDA graphs (--compile-mode reduce-overhead) the timed calls below overwrite the outputs
        ref = tuple(x.clone() for x in fn(*args))
        timer.sync()
        row["torch_first_call_s"] = time.perf_counter() - t0
        for _ in range(max(a.warmup - 1, 0)):
            fn(*args)
    except Exception as e:  # noqa: BLE001: reported on the row, the bench goes on
        ref = None
        row["torch_error"] = ("out of memory: " if is_oom(e) else "") + f"{type(e).__name__}: {str(e)[:300]}"
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    for _ in range(a.warmup):
        ours(stream)
    timer.sync()

    # alternating timed runs, median of each
    t_torch, t_ours = [], []
    for _ in range(a.repeat):
        if ref is not None:
            t_torch.append(timer(lambda: fn(*args)))
        t_ours.append(timer(lambda: ours(stream)))
    row["smla_ms"] = statistics.median(t_ours)
    row["smla_tflops"] = row["flops"] / (row["smla_ms"] * 1e-3) / 1e12
    if gemm:
        row["smla_frac_gemm"] = row["smla_tflops"] / gemm
    # the outputs of the last timed run are those of the first one, bit for bit
    row["smla_bitwise_repeat"] = all(torch.equal(x, y) for x, y in zip((dq, dkv, d_sink), first))
    if ref is not None:
        row["torch_ms"] = statistics.median(t_torch)
        row["ratio"] = row["torch_ms"] / row["smla_ms"]
        row["cmp"] = {n: compare(x, r) for n, x, r in zip(("dq", "dkv", "d_sink"), first, ref)}
        row["agree"] = all(c["ok"] for c in row["cmp"].values())
    else:
        row["agree"] = None
    if not row["smla_bitwise_repeat"]:
        row["agree"] = False  # smla is deterministic: a timed run that differs from the checked one is a failure

    if do_f64:
        try:
            a64 = [x.double() if torch.is_tensor(x) and x.is_floating_point() else x for x in args]
            r64 = backward(*a64)
            del a64
            row["f64"] = {"smla": {n: compare(x, r) for n, x, r in zip(("dq", "dkv", "d_sink"), first, r64)}}
            if ref is not None:
                row["f64"]["torch"] = {n: compare(x, r) for n, x, r in zip(("dq", "dkv", "d_sink"), ref, r64)}
            row["f64"]["smla_ok"] = all(c["ok"] for c in row["f64"]["smla"].values())
            del r64
        except Exception as e:  # noqa: BLE001
            row["f64"] = {"error": ("out of memory: " if is_oom(e) else "") + f"{type(e).__name__}: {str(e)[:300]}"}
    del args, q, kv, o, do, lse, topk, sink, dq, dkv, d_sink, ws, first, ref, ours, plan
    return row


def fmt_row(r, gemm):
    if "smla_error" in r:
        return f"{r['shape']:20s}  smla failed: {r['smla_error']}"
    tt = f"{r['torch_ms']:10.3f}" if "torch_ms" in r else f"{'-':>10s}"
    ratio = f"{r['ratio']:6.2f}x" if "ratio" in r else f"{'-':>7s}"
    frac = f"{100 * r['smla_frac_gemm']:5.1f}%" if gemm else f"{'-':>6s}"
    if "cmp" in r:
        c = r["cmp"]
        errs = " ".join(f"{c[n]['rel']:8.1e}" for n in ("dq", "dkv", "d_sink"))
        agree = "yes" if r["agree"] else "NO"
    else:
        errs = f"{'-':>8s} {'-':>8s} {'-':>8s}"
        agree = "unchecked (torch: " + r.get("torch_error", "?")[:120] + ")"
    return (f"{r['shape']:20s} {tt} {r['smla_ms']:9.3f} {ratio} {r['smla_tflops']:8.{1 if r['smla_tflops'] >= 1 else 4}f} {frac} {errs}  {agree}"
            + ("" if r["smla_bitwise_repeat"] else "  [smla repeat differs from its first run]"))


def parse_shape(s):
    try:
        v = tuple(int(x) for x in s.split(","))
    except ValueError:
        v = ()
    if len(v) != 4 or min(v) < 1:
        raise argparse.ArgumentTypeError(f"shape {s!r}: expected T,H,NUM_KV,TOPK (four positive integers)")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", type=parse_shape, default=[parse_shape(s) for s in DEFAULT_SHAPES],
                    metavar="T,H,NUM_KV,TOPK")
    ap.add_argument("--repeat", type=int, default=10, help="timed samples of each (median)")
    ap.add_argument("--batch", type=int, default=4,
                    help="calls queued back to back in each sample, the sample's time divided by it (1: one call from "
                         "an idle GPU, host overhead included)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs of each first (torch's first compiles)")
    ap.add_argument("--time-budget", type=float, default=480.0,
                    help="seconds; shapes not started by then are skipped (0: no limit)")
    ap.add_argument("--lib", default="build/lib/libsmla.so", help="smla's shared library")
    ap.add_argument("--backend", choices=["cuda", "cpu", "hip", "auto"], default=None,
                    help="smla backend (default: cuda on a cuda device, cpu on the cpu)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--r-chunk", type=int, default=0, help="smla's r_chunk (0: the planner's choice)")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="torch eager instead of torch.compile")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default: its default)")
    ap.add_argument("--gemm-n", type=int, default=None, help="N of the bf16 N^3 GEMM (default 8192; 512 on cpu; 0: skip)")
    ap.add_argument("--f64", choices=["auto", "all", "none"], default="auto",
                    help="float64 check of both: auto = the cheapest shape if it fits in half the free memory")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout, table to stderr)")
    a = ap.parse_args()
    if a.repeat < 1 or a.warmup < 0 or a.batch < 1:
        ap.error("--repeat and --batch must be >= 1 and --warmup >= 0")

    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type not in ("cuda", "cpu"):
        ap.error(f"--device {dev}: expected cuda[:N] or cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device (use --device cpu --backend cpu)")
    a.backend = a.backend or ("cuda" if dev.type == "cuda" else "cpu")
    if (a.backend == "cpu") != (dev.type == "cpu"):
        ap.error(f"--backend {a.backend} with --device {dev}: the cpu backend needs host tensors, the GPU "
                 "backends device tensors")
    if dev.type == "cuda":
        if dev.index is None:  # "cuda" alone: the current device, named by its index from here on
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    out = sys.stderr if a.json == "-" else sys.stdout
    say = lambda s="": print(s, file=out, flush=True)
    start = time.perf_counter()

    lib = Smla(a.lib)
    rt = lib.runtime()
    timer = Timer(dev, a.batch)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    say(f"device: {name}; torch {torch.__version__}; smla: {a.lib}, backend {a.backend}; "
        f"torch side: {'torch.compile' if a.compile else 'eager'}; warmup {a.warmup}, median of {a.repeat} samples of "
        f"{a.batch} calls queued back to back")

    gemm_n = a.gemm_n if a.gemm_n is not None else (8192 if dev.type == "cuda" else 512)
    gemm = None
    result = {"device": name, "torch": torch.__version__, "backend": a.backend, "compile": a.compile,
              "warmup": a.warmup, "repeat": a.repeat, "batch": a.batch, "rows": [], "skipped": []}
    if gemm_n > 0:
        gemm, gms = gemm_tflops(gemm_n, dev, timer, a.warmup, a.repeat)
        result["gemm"] = {"n": gemm_n, "ms": gms, "tflops": gemm}
        say(f"dense bf16 GEMM {gemm_n}^3 (torch.mm): {gms:.3f} ms, {gemm:.{1 if gemm >= 1 else 4}f} TFLOP/s")
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    f64_shape = None
    if a.f64 == "auto":
        f64_shape = min(a.shapes, key=lambda s: (10 * s[0] * s[1] * s[3], s))
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        need = f64_bytes(f64_shape[0], f64_shape[1], f64_shape[3], f64_shape[2])
        if need > free / 2:
            say(f"f64 check skipped: {','.join(map(str, f64_shape))} needs about {need / 2**30:.1f} GiB, "
                f"free {free / 2**30:.1f} GiB")
            f64_shape = None

    say()
    say(f"{'T,H,NUM_KV,TOPK':20s} {'torch ms':>10s} {'smla ms':>9s} {'ratio':>7s} {'TFLOP/s':>8s} "
        f"{'%GEMM':>6s} {'dq err':>8s} {'dkv err':>8s} {'dsink err':>8s}  agree")
    for i, shape in enumerate(a.shapes):
        if a.time_budget > 0 and time.perf_counter() - start > a.time_budget:
            rest = [",".join(map(str, s)) for s in a.shapes[i:]]
            result["skipped"] = rest
            say(f"time budget of {a.time_budget:g} s spent: skipped {' '.join(rest)}")
            break
        do_f64 = a.f64 == "all" or shape == f64_shape
        try:
            row = run_shape(a, shape, rt, dev, timer, gemm, do_f64)
        except SmlaError as e:
            row = {"shape": ",".join(map(str, shape)), "smla_error": str(e), "agree": False}
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        say(fmt_row(row, gemm))
        if "f64" in row:
            f = row["f64"]
            if "error" in f:
                say(f"    f64 check failed to run: {f['error']}")
            else:
                for who in ("smla", "torch"):
                    if who in f:
                        say(f"    vs float64, {who:5s}: " + ", ".join(
                            f"{n} rel {c['rel']:.2e} cos {c['cos']:.6f}{'' if c['finite'] else ' NON-FINITE'}"
                            for n, c in f[who].items()))
                if not f["smla_ok"]:
                    row["agree"] = False
                    say("    smla misses the contract's bar against float64")

    rows = result["rows"]
    n_bad = sum(r["agree"] is False for r in rows)
    n_unchecked = sum(r["agree"] is None for r in rows)
    n_ok = sum(r["agree"] is True for r in rows)
    result["summary"] = {"agreed": n_ok, "disagreed": n_bad, "unchecked": n_unchecked,
                         "skipped": len(result["skipped"]), "seconds": time.perf_counter() - start}
    say(f"\n{n_ok} agreed, {n_bad} disagreed (rel err > {REL_MAX:g}, cos < {COS_MIN}, non-finite or smla "
        f"failed), {n_unchecked} unchecked, {len(result['skipped'])} skipped; "
        f"{result['summary']['seconds']:.0f} s")
    if a.json:
        text = json.dumps(result, indent=1)
        if a.json == "-":
            print(text, flush=True)
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    return 1 if n_bad else (2 if n_unchecked or result["skipped"] else 0)


if __name__ == "__main__":
    sys.exit(main())
