#!/usr/bin/env python3
"""union_sim.py: how many interm rows a block of B consecutive tokens would write if the kv rows its tokens share were
summed into one row before the store (perf notes v46), under the contract's benchmark top-k.

For each block of B tokens: the union of their valid kv rows, each row with the mask of the tokens that pick it. The
rows sorted by mask (most tokens first) and cut into 64-row tiles; a tile's product runs over the tokens of the OR of
its rows' masks (a token no row of the tile picks is skipped). Prints, per shape and B: interm rows against today's
(one row a valid slot), the dkv multiply-adds against today's per-token 64-row tiles, and the per-block averages a
schedule needs (tiles, units = (tile, token) products). Pure Python, no GPU; the top-k is drawn as
bench/side_by_side.py draws it (its own random numbers, not torch's).

  python3 bench/union_sim.py [--shape T,H,NUM_KV,TOPK ...] [--block B ...] [--seed N]
"""
import argparse
import random

SWA = 128


def bench_topk(T, num_kv, topk, rng):
    rows = []
    n_pool, n_sel = num_kv - T, topk - SWA
    for t in range(T):
        row = [t - r for r in range(min(SWA, topk)) if t - r >= 0]
        vis = min((t + 1) // 4, n_pool) if n_pool > 0 else 0
        if n_sel > 0 and vis > 0:
            row += [T + j for j in rng.sample(range(vis), min(n_sel, vis))]
        rows.append(row)
    return rows


def simulate(T, num_kv, topk, B, rng, tile=64):
    tk = bench_topk(T, num_kv, topk, rng)
    slots = sum(len(r) for r in tk)
    base_tiles = sum((len(r) + tile - 1) // tile for r in tk)
    union = units = tiles = 0
    for b0 in range(0, T, B):
        masks = {}
        for bi, row in enumerate(tk[b0:b0 + B]):
            for j in row:
                masks[j] = masks.get(j, 0) | (1 << bi)
        order = sorted(masks.values(), key=lambda m: (-bin(m).count("1"), m))
        union += len(order)
        for s in range(0, len(order), tile):
            orm = 0
            for m in order[s:s + tile]:
                orm |= m
            units += bin(orm).count("1")
            tiles += 1
    blocks = (T + B - 1) // B
    return dict(slots=slots, rows=union / slots, macs=units / base_tiles, tiles=tiles / blocks, units=units / blocks,
                tok_tiles=base_tiles / T)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", help="T,H,NUM_KV,TOPK (default: the seed and TOPK 160)")
    ap.add_argument("--block", type=int, action="append", help="tokens a block (default 2 and 4)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    shapes = a.shape or ["4096,128,5120,512", "4096,128,4128,160"]
    for shape in shapes:
        T, H, num_kv, topk = (int(x) for x in shape.split(","))
        for B in a.block or [2, 4]:
            r = simulate(T, num_kv, topk, B, random.Random(a.seed))
            print(f"{shape} B {B}: interm rows {r['rows']:.3f} of today's {r['slots']}; dkv multiply-adds "
                  f"{r['macs']:.3f} of today's; a block: {r['tiles']:.2f} tiles, {r['units']:.2f} units "
                  f"(today {r['tok_tiles']:.2f} tiles a token)")


if __name__ == "__main__":
    main()
