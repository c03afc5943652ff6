"""smla_ctypes.py: the C API of smla (include/smla/smla.h) through ctypes, for torch tensors.

    lib = Smla("build/lib/libsmla.so")
    rt = lib.runtime()
    plan = rt.plan(T=4096, H=128, num_kv=5120, topk=512, has_sink=True, backend="cuda")
    ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    call = plan.bind(q, kv, o, do, lse, topk, sink, dq, dkv, d_sink, ws)   # validated once
    call(torch.cuda.current_stream().cuda_stream)                           # launches on that stream

Every status is checked: a failed call raises SmlaError with smla_last_error()'s text. The structs
below mirror smla.h field by field (same order, same C types); strides are in elements.
"""
import ctypes
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int64, c_size_t, c_void_p, sizeof

# smla_status_t, smla_backend_t, smla_dtype_t: C enums, int-sized.
SMLA_OK = 0
WORKSPACE_ALIGN = 256  # the alignment Plan::run requires of the workspace (WorkspaceLayout::kAlign)
BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2, "hip": 3}
DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_I32, DTYPE_I64, DTYPE_F64 = 1, 2, 3, 4, 5, 6


class SmlaProblem(ctypes.Structure):
    _fields_ = [
        ("T", c_int64), ("H", c_int64), ("num_kv", c_int64), ("topk", c_int64), ("head_dim", c_int64),
        ("has_sink", c_int),
        ("scale", c_float),
        ("r_chunk", c_int64),
        ("lse_base2", c_int),
        ("lse_excludes_sink", c_int),
        ("check_indices", c_int),
        ("dkv_fp32", c_int),
        ("backend", c_int),  # smla_backend_t
        ("device", c_int),
    ]


class SmlaPlanOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("t_chunk", c_int64)]


class SmlaPlanInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("r_chunk", c_int64), ("n_chunks", c_int64), ("t_chunk", c_int64),
                ("t_chunks", c_int64), ("workspace_bytes", c_size_t), ("backend", c_int64),
                ("compiled", c_int64), ("loaded_from_disk", c_int64), ("reused_in_process", c_int64),
                ("config_source", c_int64)]


class SmlaTensors(ctypes.Structure):
    _fields_ = (
        [(n, c_void_p) for n in ("q", "kv", "o", "dout")]
        + [("lse", c_void_p), ("topk", c_void_p), ("attn_sink", c_void_p)]
        + [("dq", c_void_p), ("dkv", c_void_p), ("d_sink", c_void_p)]
        + [(n, c_int64) for n in ("q_stride_t", "q_stride_h", "o_stride_t", "o_stride_h", "do_stride_t",
                                  "do_stride_h", "dq_stride_t", "dq_stride_h")]
        + [(n, c_int64) for n in ("kv_stride", "dkv_stride", "lse_stride_t", "lse_stride_h", "topk_stride")]
        + [(n, c_int) for n in ("q_dtype", "kv_dtype", "o_dtype", "dout_dtype", "lse_dtype", "topk_dtype",
                                "attn_sink_dtype", "dq_dtype", "dkv_dtype", "d_sink_dtype")]  # smla_dtype_t
    )


class SmlaError(RuntimeError):
    pass


def _dtype_tag(t):
    import torch
    tags = {torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_F16, torch.float32: DTYPE_F32,
            torch.int32: DTYPE_I32, torch.int64: DTYPE_I64, torch.float64: DTYPE_F64}
    if t.dtype not in tags:
        raise SmlaError(f"smla_ctypes: no smla dtype tag for {t.dtype}")
    return tags[t.dtype]


class Smla:
    """The loaded shared library."""

    def __init__(self, path):
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise SmlaError(f"smla_ctypes: cannot load {path}: {e} (build it with "
                            f"`cmake --build build --target smla_shared`, or pass --lib)") from None
        L = self.lib
        L.smla_problem_init.argtypes, L.smla_problem_init.restype = [POINTER(SmlaProblem)], None
        L.smla_tensors_init.argtypes, L.smla_tensors_init.restype = [POINTER(SmlaTensors)], None
        L.smla_runtime_create.argtypes, L.smla_runtime_create.restype = [POINTER(c_void_p)], c_int
        L.smla_runtime_destroy.argtypes, L.smla_runtime_destroy.restype = [c_void_p], None
        L.smla_plan_create.argtypes = [c_void_p, POINTER(SmlaProblem), POINTER(c_void_p)]
        L.smla_plan_create.restype = c_int
        L.smla_plan_options_init_sized.argtypes = [POINTER(SmlaPlanOptions), c_size_t]
        L.smla_plan_options_init_sized.restype = None
        L.smla_plan_create_ex.argtypes = [c_void_p, POINTER(SmlaProblem), POINTER(SmlaPlanOptions), POINTER(c_void_p)]
        L.smla_plan_create_ex.restype = c_int
        L.smla_plan_info_init_sized.argtypes, L.smla_plan_info_init_sized.restype = [POINTER(SmlaPlanInfo), c_size_t], None
        L.smla_plan_info.argtypes, L.smla_plan_info.restype = [c_void_p, POINTER(SmlaPlanInfo)], c_int
        L.smla_plan_destroy.argtypes, L.smla_plan_destroy.restype = [c_void_p], None
        L.smla_plan_workspace_bytes.argtypes = [c_void_p, POINTER(c_size_t)]
        L.smla_plan_workspace_bytes.restype = c_int
        L.smla_plan_run.argtypes = [c_void_p, POINTER(SmlaTensors), c_void_p, c_size_t, c_void_p]
        L.smla_plan_run.restype = c_int
        L.smla_last_error.argtypes, L.smla_last_error.restype = [], c_char_p
        L.smla_status_string.argtypes, L.smla_status_string.restype = [c_int], c_char_p

    def check(self, status, what):
        if status != SMLA_OK:
            name = self.lib.smla_status_string(status).decode(errors="replace")
            msg = self.lib.smla_last_error().decode(errors="replace")
            raise SmlaError(f"{what} failed with status {status} ({name}): {msg}")

    def runtime(self):
        return Runtime(self)


class Runtime:
    def __init__(self, smla):
        self.smla = smla
        self.h = c_void_p()
        smla.check(smla.lib.smla_runtime_create(byref(self.h)), "smla_runtime_create")

    def plan(self, T, H, num_kv, topk, has_sink=True, scale=0.0, r_chunk=0, backend="auto", device=0,
             lse_base2=False, lse_excludes_sink=False, t_chunk=0):
        if backend not in BACKENDS:
            raise SmlaError(f"smla_ctypes: backend {backend!r}: expected one of {', '.join(BACKENDS)}")
        p = SmlaProblem()
        self.smla.lib.smla_problem_init(byref(p))
        p.T, p.H, p.num_kv, p.topk = T, H, num_kv, topk
        p.has_sink = 1 if has_sink else 0
        p.scale = scale
        p.r_chunk = r_chunk
        p.lse_base2 = 1 if lse_base2 else 0  # TileLang's example forward's convention: log2 of the sum of exp2
        p.lse_excludes_sink = 1 if lse_excludes_sink else 0
        p.backend = BACKENDS[backend]
        p.device = device
        o = SmlaPlanOptions()
        self.smla.lib.smla_plan_options_init_sized(byref(o), sizeof(o))
        o.t_chunk = t_chunk
        return Plan(self, p, o)

    def close(self):
        if self.h:
            self.smla.lib.smla_runtime_destroy(self.h)
            self.h = c_void_p()

    def __del__(self):
        self.close()


class Plan:
    def __init__(self, rt, problem, options):
        self.rt, self.smla, self.problem = rt, rt.smla, problem
        self.h = c_void_p()
        self.smla.check(self.smla.lib.smla_plan_create_ex(rt.h, byref(problem), byref(options), byref(self.h)),
                        "smla_plan_create_ex")
        n = c_size_t()
        self.smla.check(self.smla.lib.smla_plan_workspace_bytes(self.h, byref(n)), "smla_plan_workspace_bytes")
        self.workspace_bytes = n.value
        i = SmlaPlanInfo()
        self.smla.lib.smla_plan_info_init_sized(byref(i), sizeof(i))
        self.smla.check(self.smla.lib.smla_plan_info(self.h, byref(i)), "smla_plan_info")
        # backend: 1 cpu, 2 cuda, 3 hip; config_source: 1 heuristic, 2 tuned, 3 explicit (0 from a library older than
        # the field)
        self.info = {k: getattr(i, k) for k in ("r_chunk", "n_chunks", "t_chunk", "t_chunks", "workspace_bytes",
                                                "backend", "compiled", "loaded_from_disk", "reused_in_process",
                                                "config_source")}

    def workspace(self, device):
        """A torch uint8 tensor of workspace_bytes on device, its base WORKSPACE_ALIGN-aligned (None if
        the plan needs none): a view into a slightly larger allocation."""
        import torch
        if not self.workspace_bytes:
            return None
        buf = torch.empty(self.workspace_bytes + WORKSPACE_ALIGN, dtype=torch.uint8, device=device)
        off = -buf.data_ptr() % WORKSPACE_ALIGN
        return buf[off:off + self.workspace_bytes]

    def bind(self, q, kv, o, do, lse, topk, sink, dq, dkv, d_sink, workspace):
        """Fills an smla_tensors_t from torch tensors (kept alive by the returned callable, and so is the
        plan); the callable runs the plan on the stream given (an int handle, 0 / None: the default stream)."""
        p = self.problem
        for name, x in (("q", q), ("o", o), ("do", do), ("dq", dq), ("kv", kv), ("dkv", dkv), ("lse", lse),
                        ("topk", topk)):
            if x.stride(-1) != 1:
                raise SmlaError(f"smla_ctypes: {name} needs a contiguous last dimension (strides {x.stride()})")
        for name, x in (("attn_sink", sink), ("d_sink", d_sink)):
            if x is not None and not x.is_contiguous():
                raise SmlaError(f"smla_ctypes: {name} must be contiguous")
        if (sink is None) != (not p.has_sink) or (d_sink is None) != (not p.has_sink):
            raise SmlaError("smla_ctypes: attn_sink and d_sink are given exactly when the plan has a sink")
        if workspace is not None and workspace.numel() * workspace.element_size() < self.workspace_bytes:
            raise SmlaError(f"smla_ctypes: workspace of {workspace.numel() * workspace.element_size()} bytes, "
                            f"the plan needs {self.workspace_bytes}")
        t = SmlaTensors()
        self.smla.lib.smla_tensors_init(byref(t))
        ptr = lambda x: None if x is None else x.data_ptr()
        t.q, t.kv, t.o, t.dout = ptr(q), ptr(kv), ptr(o), ptr(do)
        t.lse, t.topk, t.attn_sink = ptr(lse), ptr(topk), ptr(sink)
        t.dq, t.dkv, t.d_sink = ptr(dq), ptr(dkv), ptr(d_sink)
        t.q_stride_t, t.q_stride_h = q.stride(0), q.stride(1)
        t.o_stride_t, t.o_stride_h = o.stride(0), o.stride(1)
        t.do_stride_t, t.do_stride_h = do.stride(0), do.stride(1)
        t.dq_stride_t, t.dq_stride_h = dq.stride(0), dq.stride(1)
        t.kv_stride, t.dkv_stride = kv.stride(0), dkv.stride(0)
        t.lse_stride_t, t.lse_stride_h = lse.stride(0), lse.stride(1)
        t.topk_stride = topk.stride(0)
        t.q_dtype, t.kv_dtype, t.o_dtype, t.dout_dtype = _dtype_tag(q), _dtype_tag(kv), _dtype_tag(o), _dtype_tag(do)
        t.lse_dtype, t.topk_dtype = _dtype_tag(lse), _dtype_tag(topk)
        t.dq_dtype, t.dkv_dtype = _dtype_tag(dq), _dtype_tag(dkv)
        if sink is not None:
            t.attn_sink_dtype, t.d_sink_dtype = _dtype_tag(sink), _dtype_tag(d_sink)
        ws_ptr = None if workspace is None else workspace.data_ptr()
        ws_bytes = self.workspace_bytes
        # The plan too: `rt.plan(...).bind(...)` dropped it at once, and its destructor freed what the callable runs.
        keep = (self, q, kv, o, do, lse, topk, sink, dq, dkv, d_sink, workspace)
        run, check, h = self.smla.lib.smla_plan_run, self.smla.check, self.h

        def call(stream=None):
            _ = keep
            check(run(h, byref(t), ws_ptr, ws_bytes, stream or None), "smla_plan_run")

        return call

    def close(self):
        if self.h:
            self.smla.lib.smla_plan_destroy(self.h)
            self.h = c_void_p()

    def __del__(self):
        self.close()
