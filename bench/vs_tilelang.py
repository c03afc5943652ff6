"""vs_tilelang.py: smla beside TileLang's public sparse-MLA backward example, one GPU, one process.

The alternative is `examples/deepseek_v32/sparse_mla_bwd.py` of github.com/tile-ai/tilelang (the Hopper
backward the issue's figures cite: DeepSeek-V3.2's sparse MLA, q and kv 576 wide of which V is the first 512,
fp32 atomics for dKV, no sink, base-2 lse). It is not part of smla and does not travel with it: pass the
directory that holds it and its utils.py as --example-dir, with the tilelang package importable.

    SMLA_CACHE_DIR=/tmp/c python3 bench/vs_tilelang.py --lib build/lib/libsmla.so --example-dir DIR \\
        [--shapes 4096,128,5120,512 ...] [--dqk 576] [--check-shape 600,128,600,512] [--json out.json]

Both run the same T, H, num_kv, TOPK and the same top-k. That kernel masks every index above its token
(index <= t, its causal rule) and reads rows of the others, so the top-k here is causal and always valid:
slots 0..127 the window t, t-1, ... (a random row of [0, t] where that is negative), the rest random rows of
[0, t]; smla's tile skipping never applies. smla runs its op (512 wide, base-2 lse, no sink), TileLang its own
(--dqk wide, 576 by default; 512 if that kernel accepts an empty rope part). Each is given a consistent forward
(o and lse from the same inputs, fp32 here) and timed alternately in rounds (median of the calls, device
events); TFLOP/s each by its own five products (smla 10 T H K 512; TileLang 2 T H K (2 dv + 3 dqk)).
Correctness: at --check-shape both are compared with a float64 reference of their own op (relative L2 error
and cosine; the contract's bar is 1e-2 and 0.9999). At the timed shapes smla's outputs start as NaN and must come out
finite, and every timed run's bitwise its first's (smla_outputs_ok); nothing there is compared with float64.

Exit status: 0 everything ran and every check passed; 1 a check failed, smla failed, or its timed outputs were not
finite or not its first run's; 2 a shape was skipped or
TileLang failed on one (its error is in the row).
"""
import argparse, importlib, json, math, os, statistics, sys, time

import torch

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from side_by_side import Timer, compare, parse_shape  # noqa: E402
from smla_ctypes import Smla  # noqa: E402

DV, SWA, LN2 = 512, 128, math.log(2.0)


def causal_topk(T, K, gen):
    """[T, K] int32, every index in [0, t]: the window first (t - r where >= 0), random rows of [0, t] else."""
    t = torch.arange(T)[:, None]
    rnd = (torch.rand(T, K, generator=gen) * (t + 1).float()).long().clamp(max=T - 1)
    rnd = torch.minimum(rnd, t)
    win = t - torch.arange(K)[None, :]
    use_win = (torch.arange(K)[None, :] < SWA) & (win >= 0)
    return torch.where(use_win, win, rnd).to(torch.int32)


def make_inputs(T, H, num_kv, topk, dqk, scale, dev, seed):
    """q, kv (dqk wide), o, dout (DV wide), base-2 lse: a forward of the op in fp32 from bf16 operands."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=gen, device=dev) * 0.5).to(torch.bfloat16)
    q, kv, do = r(T, H, dqk), r(num_kv, dqk), r(T, H, DV)
    o = torch.empty(T, H, DV, dtype=torch.bfloat16, device=dev)
    lse2 = torch.empty(T, H, dtype=torch.float32, device=dev)
    idx = topk.long()
    with torch.no_grad():
        for a in range(0, T, 256):
            b = min(T, a + 256)
            kvg = kv[idx[a:b]]                                        # [c, K, dqk]
            s = torch.einsum("thd,tkd->thk", q[a:b], kvg).float() * scale
            lse = torch.logsumexp(s, -1)
            o[a:b] = torch.einsum("thk,tkd->thd", torch.exp(s - lse[:, :, None]).to(q.dtype), kvg[..., :DV])
            lse2[a:b] = lse / LN2
            del kvg, s
    return q, kv, o, do, lse2


def reference(q, kv, o, do, topk, lse2, scale):
    """float64 dq, dkv of the op with K = kv (dqk wide) and V = kv[:, :DV]; dS carries the scale."""
    q, kv, o, do, lse2 = (x.double() for x in (q, kv, o, do, lse2))
    idx = topk.long()
    kvg = kv[idx]
    s = torch.einsum("thd,tkd->thk", q, kvg) * scale
    p = torch.exp(s - lse2[:, :, None] * LN2)
    dp = torch.einsum("thd,tkd->thk", do, kvg[..., :DV])
    delta = (o * do).sum(-1)
    ds = p * (dp - delta[:, :, None]) * scale
    dq = torch.einsum("thk,tkd->thd", ds, kvg)
    dkvg = torch.einsum("thk,thd->tkd", ds, q)
    dkvg[..., :DV] += torch.einsum("thk,thd->tkd", p, do)
    dkv = torch.zeros_like(kv).index_add_(0, idx.flatten(), dkvg.flatten(0, 1))
    return dq, dkv


class SmlaCase:
    def __init__(self, rt, T, H, num_kv, K, topk, dev, seed):
        self.scale = 1.0 / math.sqrt(DV)
        self.q, self.kv, self.o, self.do, self.lse = make_inputs(T, H, num_kv, topk, DV, self.scale, dev, seed)
        self.topk = topk.to(dev).contiguous()
        self.plan = rt.plan(T, H, num_kv, K, has_sink=False, lse_base2=True, backend="cuda")
        self.ws = self.plan.workspace(dev)
        # NaN before the first run: an element smla never writes stays non-finite (the timed shapes are not checked
        # against float64; this and the bitwise repeat below are what is checked there)
        self.dq = torch.full_like(self.q, float("nan"))
        self.dkv = torch.full_like(self.kv, float("nan"))
        self.call = self.plan.bind(self.q, self.kv, self.o, self.do, self.lse, self.topk, None, self.dq, self.dkv,
                                   None, self.ws)
        self.stream = torch.cuda.current_stream().cuda_stream

    def __call__(self):
        self.call(self.stream)

    def outputs(self):
        return self.dq, self.dkv

    def ref_inputs(self):
        return self.q, self.kv, self.o, self.do, self.topk, self.lse, self.scale


class TileLangCase:
    def __init__(self, mod, T, H, num_kv, K, topk, dqk, dev, seed):
        self.mod = mod
        self.scale = 1.0 / math.sqrt(dqk)  # the example's default sm_scale
        self.q, self.kv, self.o, self.do, self.lse = make_inputs(T, H, num_kv, topk, dqk, self.scale, dev, seed)
        self.topk = topk.to(dev).contiguous()
        # The example's layout: [B, S, H, D], kv [B, S_kv, kv_group, D], indices [B, S, kv_group, topk].
        self.args = (self.q[None], self.kv[None, :, None], self.o[None], self.do[None], self.topk[None, :, None],
                     self.lse[None].contiguous())
        self.out = None

    def __call__(self):
        self.out = self.mod.sparse_mla_bwd(*self.args)

    def outputs(self):
        dq, dkv = self.out
        return dq[0], dkv[0, :, 0]

    def ref_inputs(self):
        return self.q, self.kv, self.o, self.do, self.topk, self.lse, self.scale


def timed(cases, timer, rounds, repeat):
    """Median ms of each case's calls, the cases alternating order round by round."""
    ms = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn = cases[name]
            timer.sync()
            ms[name] += [timer(fn) for _ in range(repeat)]
    return {name: statistics.median(v) for name, v in ms.items()}


def check(case, label):
    case()
    torch.cuda.synchronize()
    dq, dkv = case.outputs()
    rdq, rdkv = reference(*case.ref_inputs())
    res = {"dq": compare(dq, rdq), "dkv": compare(dkv, rdkv)}
    print(f"  {label}: dq rel {res['dq']['rel']:.3e} cos {res['dq']['cos']:.6f}, "
          f"dkv rel {res['dkv']['rel']:.3e} cos {res['dkv']['cos']:.6f} -> "
          f"{'pass' if res['dq']['ok'] and res['dkv']['ok'] else 'FAIL'}", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/lib/libsmla.so")
    ap.add_argument("--example-dir", required=True, help="holds TileLang's sparse_mla_bwd.py and utils.py")
    ap.add_argument("--shapes", nargs="+", type=parse_shape, default=[parse_shape("4096,128,5120,512")])
    ap.add_argument("--check-shape", type=lambda s: None if s == "none" else parse_shape(s),
                    default=parse_shape("600,128,600,512"),
                    help="also check both against float64 here (default 600,128,600,512, as in perf notes v21; "
                         "'none' skips the check, and the exit status is then 2: nothing was checked)")
    ap.add_argument("--dqk", type=int, default=576, help="TileLang's q/kv width (512 + its rope part)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--time-budget", type=float, default=420.0, help="seconds; later shapes are skipped past it")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()

    t0 = time.time()
    dev = torch.device("cuda")
    sys.path.insert(0, os.path.abspath(a.example_dir))
    import tilelang
    tl_mod = importlib.import_module("sparse_mla_bwd")
    print(f"tilelang {tilelang.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rt = Smla(a.lib).runtime()
    timer = Timer(dev)
    rows = []

    def save():
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"tilelang": tilelang.__version__, "dqk": a.dqk, "rows": rows}, f, indent=1)

    shapes = ([("check", a.check_shape)] if a.check_shape else []) + [("time", s) for s in a.shapes]
    for i, (kind, (T, H, num_kv, K)) in enumerate(shapes):
        if time.time() - t0 > a.time_budget:
            print(f"time budget spent: {T},{H},{num_kv},{K} skipped", flush=True)
            continue
        print(f"{T},{H},{num_kv},{K} ({kind}, TileLang dqk {a.dqk}; {time.time() - t0:.0f} s in)", flush=True)
        topk = causal_topk(T, K, torch.Generator().manual_seed(100 + i))
        row = {"shape": [T, H, num_kv, K], "kind": kind}
        cases = {}
        for name, make in (("smla", lambda: SmlaCase(rt, T, H, num_kv, K, topk, dev, 1)),
                           ("tilelang", lambda: TileLangCase(tl_mod, T, H, num_kv, K, topk, a.dqk, dev, 2))):
            try:
                c0 = time.time()
                cases[name] = make()
                cases[name]()  # the first call compiles (TileLang's JIT; smla compiled at plan)
                torch.cuda.synchronize()
                row[name + "_first_s"] = round(time.time() - c0, 1)
            except Exception as e:  # noqa: BLE001 - report and go on with the other
                row[name + "_error"] = f"{type(e).__name__}: {str(e)[:400]}"
                print(f"  {name}: {row[name + '_error']}", flush=True)
                cases.pop(name, None)
        if kind == "check":
            for name, c in cases.items():
                row[name + "_check"] = check(c, name)
        else:
            # smla's outputs of its first run (made above): finite, and those of every timed run bit for bit
            first = [x.clone() for x in cases["smla"].outputs()] if "smla" in cases else None
            for c in cases.values():
                c()
            ms = timed(cases, timer, a.rounds, a.repeat)
            if first is not None:
                row["smla_outputs_ok"] = all(bool(torch.isfinite(x).all()) for x in first) and all(
                    torch.equal(x, y) for x, y in zip(first, cases["smla"].outputs()))
                if not row["smla_outputs_ok"]:
                    print("  smla: an output not finite, or a timed run's outputs not its first run's", flush=True)
            work = {"smla": 10.0 * T * H * K * DV, "tilelang": 2.0 * T * H * K * (2 * DV + 3 * a.dqk)}
            for name, m in ms.items():
                row[name + "_ms"] = m
                row[name + "_tflops"] = work[name] / (m * 1e-3) / 1e12
            line = ", ".join(f"{n} {ms[n]:.3f} ms ({row[n + '_tflops']:.0f} TFLOP/s)" for n in ms)
            if len(ms) == 2:
                row["ratio_ms"] = ms["tilelang"] / ms["smla"]
                line += f"; TileLang / smla time {row['ratio_ms']:.2f}x"
            print("  " + line, flush=True)
        rows.append(row)
        save()
        del cases
        torch.cuda.empty_cache()
    save()
    failed = [r for r in rows if "smla_error" in r or r.get("smla_outputs_ok") is False or any(
        not (r[k]["dq"]["ok"] and r[k]["dkv"]["ok"]) for k in ("smla_check", "tilelang_check") if k in r)]
    incomplete = (len(rows) < len(shapes) or any("tilelang_error" in r for r in rows)
                  or not any("smla_check" in r for r in rows))  # 0 says every check passed: not if none ran
    return 1 if failed else 2 if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
