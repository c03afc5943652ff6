#!/usr/bin/env python3
"""bench/smla_ctypes.py on the CPU backend (tests/CMakeLists.txt; exit 77, a skip, without torch): the callable of
Plan.bind keeps its plan alive (`rt.plan(...).bind(...)` freed the plan at once, and the first call crashed), and
runs it: dq, dkv and d_sink all written (no NaN left of the fill) and equal to a second plan's outputs."""
import gc, os, sys, weakref

try:
    import torch
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "bench"))
sys.dont_write_bytecode = True
from smla_ctypes import Smla  # noqa: E402
import side_by_side as sbs  # noqa: E402

lib = Smla(sys.argv[1])
T, H, nkv, K = 64, 16, 96, 160
q, kv, o, do, lse, topk, sink, scale = sbs.inputs(T, H, nkv, K, torch.device("cpu"))
rt = lib.runtime()


def outputs():
    return (torch.full_like(q, float("nan")), torch.full_like(kv, float("nan")), torch.full((H,), float("nan")))


plan = rt.plan(T=T, H=H, num_kv=nkv, topk=K, has_sink=True, scale=scale, backend="cpu")
alive = weakref.ref(plan)
a = outputs()
call = plan.bind(q, kv, o, do, lse, topk, sink, *a, plan.workspace("cpu"))
del plan
gc.collect()
if alive() is None:
    sys.exit("the plan was freed while its bound callable lives")
call(None)
# The same through a temporary plan, as a caller would chain it.
b = outputs()
p2 = rt.plan(T=T, H=H, num_kv=nkv, topk=K, has_sink=True, scale=scale, backend="cpu")
rt.plan(T=T, H=H, num_kv=nkv, topk=K, has_sink=True, scale=scale, backend="cpu").bind(
    q, kv, o, do, lse, topk, sink, *b, p2.workspace("cpu"))(None)
for name, x, y in zip(("dq", "dkv", "d_sink"), a, b):
    if not bool(torch.isfinite(x).all()) or not torch.equal(x, y):
        sys.exit("%s: not written, or the two plans differ" % name)
print("plan kept alive by its callable; outputs written and equal")
