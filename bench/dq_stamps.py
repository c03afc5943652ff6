"""dq_stamps.py: where a dq (or dkv_interm) block's time goes, from the clock stamps of the stamp-dq (stamp-dkv) probe
of bench/probes.

    SMLA_KERNEL_SRC_DIR=$PWD/TREE python3 -u bench/dq_stamps.py [--dkv] [--lib build/lib/libsmla.so] T,H,NUM_KV,TOPK ...

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

--dkv: stamp-dkv's (dkv_impl 2, H 128), over dq[t, 1 + d0 / 256, 0:64]: [0] [1] [2] as above, then SM cycles: [3]
entry to tile 0 and B's first quarter landed, [4] tile 0's MMA (B's other quarters waited for under it), [5]-[8] sums
over the loop's steps of the wait for the next tile, the MMA issue, the previous tile's finish (staging, interm
stores, refill) and the MMA wait, [9] the last finish, [10] the block.
"""
import argparse, json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from side_by_side import inputs  # noqa: E402
from smla_ctypes import Smla  # noqa: E402

NAMES = ["qdo_wait", "delta", "tile0_kv_wait", "tiles_full_wait", "tiles_sdp_issue", "tiles_sdp_wait",
         "tiles_elem_to_C", "tiles_dq_issue_pds", "tiles_dq_wait", "loop", "epilogue", "block", "tile0"]
PER_TILE = NAMES[3:9]
DKV_NAMES = ["tile0_and_b0_wait", "tile0_mma", "steps_wait_tile", "steps_mma_issue", "steps_finish_prev",
             "steps_mma_wait", "last_finish", "block"]
DKV_PER_TILE = DKV_NAMES[2:6]


def read_stamps(dq, H, dkv=False):
    """The blocks' 16 stamps each, as lists of ints (dq: the bf16 output tensor the probe wrote them over)."""
    rows = [1, 2] if dkv else range(0, H, 64)
    st = torch.stack([dq[:, h, 0:64].contiguous().view(torch.int64) for h in rows], 1)
    return st.reshape(-1, 16).tolist()


def summarize(st, names=NAMES, per_tile=PER_TILE):
    """Per-block means and medians (us), cycles a tile, gaps between blocks on an SM, block time by tile count."""
    smid = [r[0] & 0xFFFF for r in st]
    tiles = [(r[0] >> 16) & 0xFFFF for r in st]
    if max(smid) > 1024 or max(tiles) > 4096:
        raise SystemExit("dq_stamps: no stamps in dq (run with SMLA_KERNEL_SRC_DIR at a tree with the probe applied)")
    g0, g1 = [r[1] for r in st], [r[2] for r in st]
    col = lambda n: [r[3 + names.index(n)] for r in st]
    block = col("block")  # SM cycles of each block
    ghz = sum(block) / sum(b - a for a, b in zip(g0, g1))  # SM cycles per ns: the clock during the blocks
    us = lambda cycles: cycles / ghz / 1e3
    out = {"ghz": ghz, "blocks": len(st), "mean_tiles": statistics.fmean(tiles)}
    for n in names:
        v = col(n)
        out[n] = {"mean_us": us(statistics.fmean(v)), "median_us": us(statistics.median(v))}
        if n in per_tile:
            out[n]["cycles_a_tile"] = sum(v) / max(sum(tiles), 1)
    by_sm = {}
    for sm, a, b in zip(smid, g0, g1):
        by_sm.setdefault(sm, []).append((a, b))
    gaps = []
    for spans in by_sm.values():
        spans.sort()
        gaps += [spans[k + 1][0] - spans[k][1] for k in range(len(spans) - 1)]
    out["gap_us_median"] = statistics.median(gaps) / 1e3 if gaps else 0.0
    out["gap_us_mean"] = statistics.fmean(gaps) / 1e3 if gaps else 0.0
    out["phase_span_ms"] = (max(g1) - min(g0)) / 1e6
    out["blocks_an_sm"] = len(st) / len(by_sm)
    out["block_us_by_tiles"] = {k: [tiles.count(k), round(us(statistics.fmean([c for c, n in zip(block, tiles) if n == k])), 2)]
                                for k in sorted(set(tiles))}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="+", help="T,H,NUM_KV,TOPK (H a multiple of 64)")
    ap.add_argument("--lib", default="build/lib/libsmla.so")
    ap.add_argument("--dkv", action="store_true", help="read stamp-dkv's stamps (dkv_interm) instead of stamp-dq's")
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
            row.update(summarize(read_stamps(dq, H, a.dkv), *((DKV_NAMES, DKV_PER_TILE) if a.dkv else (NAMES, PER_TILE))))
        res[s] = row
        print(json.dumps(row, indent=1), flush=True)
        del q, kv, o, do, lse, topk, dq, dkv, ws, plan, call
        torch.cuda.empty_cache()
    out = os.environ.get("OUT", "/tmp")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "dkv_stamps.json" if a.dkv else "dq_stamps.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
