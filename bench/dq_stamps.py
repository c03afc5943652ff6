"""dq_stamps.py: where a dq block's time goes, from the clock stamps of the stamp-dq probe (bench/probes/stamp-dq.patch).

    SMLA_KERNEL_SRC_DIR=$PWD/TREE python3 -u bench/dq_stamps.py [--lib build/lib/libsmla.so] T,H,NUM_KV,TOPK ...

TREE is kernel_src/ with the probe applied: its dq_impl 3 writes 16 int64 a block over dq[t, h0, 0:64] (consumer thread
0, after the epilogue): [0] SM id | tiles << 16 | chunk << 32, [1] [2] global timer (ns) at entry and exit, then SM
cycles: [3] Q/dO wait, [4] fused delta, [5] tile 0's kv wait, [6]-[11] sums over the tiles of the full wait, S/dP
issue, S/dP wait, element stage to barrier C, dQ issue with the P/dS stores, dQ wait, [12] the loop, [13] the
epilogue, [14] the block, [15] tile 0. For each shape (benchmark top-k and inputs as bench/side_by_side.py) it runs the
plan 5 times, times 20 more (the probe's end to end; dq's numbers are wrong by design), and prints per-block means and
medians in us (cycles over the clock the stamps imply), cycles a tile, the gap between consecutive blocks on an SM, and
the block time by tile count; a JSON of it all goes to $OUT/dq_stamps.json. NOSTAMP=1: only the timing (for the
unpatched sources, to compare). Without the probe's sources the stamps are dQ values: the script refuses them (SM ids
out of range).
"""
import argparse, json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from side_by_side import inputs  # noqa: E402
from smla_ctypes import Smla  # noqa: E402

NAMES = ["qdo_wait", "delta", "tile0_kv_wait", "tiles_full_wait", "tiles_sdp_issue", "tiles_sdp_wait",
         "tiles_elem_to_C", "tiles_dq_issue_pds", "tiles_dq_wait", "loop", "epilogue", "block", "tile0"]
PER_TILE = NAMES[3:9]


def read_stamps(dq, H):
    st = torch.stack([dq[:, h0, 0:64].contiguous().view(torch.int64) for h0 in range(0, H, 64)], 1)
    return st.reshape(-1, 16).cpu()


def summarize(st):
    smid, tiles = st[:, 0] & 0xFFFF, (st[:, 0] >> 16) & 0xFFFF
    if int(smid.max()) > 1024 or int(tiles.max()) > 4096:
        raise SystemExit("dq_stamps: no stamps in dq (run with SMLA_KERNEL_SRC_DIR at a tree with the stamp-dq probe)")
    g0, g1 = st[:, 1].double(), st[:, 2].double()
    ghz = (st[:, 14].double().sum() / (g1 - g0).sum()).item()  # SM cycles per ns: the clock during the blocks
    out = {"ghz": ghz, "blocks": int(st.shape[0]), "mean_tiles": tiles.double().mean().item()}
    for i, n in enumerate(NAMES):
        v = st[:, 3 + i].double()
        out[n] = {"mean_us": (v.mean() / ghz / 1e3).item(), "median_us": (v.median() / ghz / 1e3).item()}
        if n in PER_TILE:
            out[n]["cycles_a_tile"] = (v.sum() / tiles.double().sum().clamp(min=1)).item()
    gaps, sms = [], smid.unique().tolist()
    for sm in sms:
        m = smid == sm
        order = torch.argsort(g0[m])
        a, b = g0[m][order], g1[m][order]
        gaps += (a[1:] - b[:-1]).tolist()
    out["gap_us_median"] = statistics.median(gaps) / 1e3 if gaps else 0.0
    out["gap_us_mean"] = sum(gaps) / len(gaps) / 1e3 if gaps else 0.0
    out["dq_span_ms"] = (g1.max() - g0.min()).item() / 1e6
    out["blocks_an_sm"] = st.shape[0] / len(sms)
    out["block_us_by_tiles"] = {int(k): [int((tiles == k).sum()), round((st[tiles == k, 14].double().mean() / ghz / 1e3).item(), 2)]
                                for k in tiles.unique().tolist()}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="+", help="T,H,NUM_KV,TOPK (H a multiple of 64)")
    ap.add_argument("--lib", default="build/lib/libsmla.so")
    a = ap.parse_args()
    dev = torch.device("cuda")
    rt = Smla(a.lib).runtime()
    stream = torch.cuda.current_stream().cuda_stream
    res = {}
    for s in a.shapes:
        T, H, N, K = map(int, s.split(","))
        q, kv, o, do, lse, topk, sink, scale = inputs(T, H, N, K, dev)
        plan = rt.plan(T=T, H=H, num_kv=N, topk=K, has_sink=True, scale=scale, backend="cuda")
        ws = plan.workspace(dev)
        dq, dkv = torch.zeros_like(q), torch.zeros_like(kv)
        d_sink = torch.zeros(H, dtype=torch.float32, device=dev)
        call = plan.bind(q, kv, o, do, lse, topk, sink, dq, dkv, d_sink, ws)
        for _ in range(5):
            call(stream)
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(20):
            call(stream)
        ev[1].record()
        torch.cuda.synchronize()
        row = {"shape": s, "e2e_ms": ev[0].elapsed_time(ev[1]) / 20}
        if not os.environ.get("NOSTAMP"):
            row.update(summarize(read_stamps(dq, H)))
        res[s] = row
        print(json.dumps(row, indent=1), flush=True)
        del q, kv, o, do, lse, topk, dq, dkv, ws, plan, call
        torch.cuda.empty_cache()
    out = os.environ.get("OUT", "/tmp")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "dq_stamps.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
