"""Probe (not a benchmark): could pycudnn skip cuDNN's host-side launch path by recording what a
plan launches once and relaunching those kernels itself with new pointers?

For each case the cuDNN call is captured three times (stream capture, relaxed mode) with
different device addresses; the captured graph's nodes (kernels, memsets), their arguments
(`cuFuncGetParamInfo`) and launch attributes are read; every argument byte that differs between
the captures must be explained as "one of the call's pointers plus a constant" or the case is
refused. The recorded kernels are then relaunched (`cuLaunchKernel(Ex)` through ctypes) with the
real pointers, the output compared with cuDNN's own execution, and the host time per call of
both measured with the GPU held busy (`torch.cuda._sleep`), so only host time counts.

Result (H200, cuDNN 9.19; `benchmarks/results/2026-12-01/probe_kernel_replay.txt`): the
relaunch costs 4.4-5.0 us of host time against cudnnBackendExecute's 5.1-7.0 us (tiny problems);
Hopper kernels launched in clusters are refused by the driver when relaunched this way
(CUDA_ERROR_INVALID_CLUSTER_SIZE, with the recorded attributes) and without the cluster
attribute fault (an illegal instruction: that variant is not run here); several kernels take
arguments derived from the addresses in other ways (refused). Not adopted: 0.5-2 us a call is
not worth bypassing cuDNN's own checks. Run:

    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=. python3 benchmarks/probes/kernel_replay.py
"""
import ctypes as C
import time
import traceback

import torch
import pycudnn
from pycudnn.runtime import handle as H
from pycudnn.runtime.tensor import as_tensor

cu = C.CDLL("libcuda.so.1")
def ck(st, what):
    if st: raise RuntimeError(f"{what}: CUresult {st}")

class KNP2(C.Structure):
    _fields_ = [("func", C.c_void_p), ("gx", C.c_uint), ("gy", C.c_uint), ("gz", C.c_uint),
                ("bx", C.c_uint), ("by", C.c_uint), ("bz", C.c_uint), ("shmem", C.c_uint),
                ("params", C.POINTER(C.c_void_p)), ("extra", C.POINTER(C.c_void_p)),
                ("kern", C.c_void_p), ("ctx", C.c_void_p)]

cu.cuGraphKernelNodeGetParams_v2.argtypes = [C.c_void_p, C.POINTER(KNP2)]
cu.cuFuncGetParamInfo.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(C.c_size_t), C.POINTER(C.c_size_t)]
try:
    cu.cuKernelGetParamInfo.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(C.c_size_t), C.POINTER(C.c_size_t)]
except AttributeError:
    pass
cu.cuStreamBeginCapture_v2.argtypes = [C.c_void_p, C.c_int]
cu.cuStreamEndCapture.argtypes = [C.c_void_p, C.POINTER(C.c_void_p)]
cu.cuGraphGetNodes.argtypes = [C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t)]
cu.cuGraphNodeGetType.argtypes = [C.c_void_p, C.POINTER(C.c_int)]
cu.cuGraphKernelNodeGetAttribute.argtypes = [C.c_void_p, C.c_int, C.c_void_p]
cu.cuGraphDestroy.argtypes = [C.c_void_p]
cu.cuLaunchKernel.argtypes = [C.c_void_p] + [C.c_uint] * 7 + [C.c_void_p, C.c_void_p, C.c_void_p]
cu.cuKernelGetFunction.argtypes = [C.POINTER(C.c_void_p), C.c_void_p]
cu.cuFuncGetAttribute.argtypes = [C.POINTER(C.c_int), C.c_int, C.c_void_p]
cu.cuFuncGetName.argtypes = [C.POINTER(C.c_char_p), C.c_void_p]

class MemsetParams(C.Structure):
    _fields_ = [("dst", C.c_uint64), ("pitch", C.c_size_t), ("value", C.c_uint), ("elementSize", C.c_uint),
                ("width", C.c_size_t), ("height", C.c_size_t)]
cu.cuGraphMemsetNodeGetParams.argtypes = [C.c_void_p, C.POINTER(MemsetParams)]
class LaunchConfig(C.Structure):
    _fields_ = [("gx", C.c_uint), ("gy", C.c_uint), ("gz", C.c_uint), ("bx", C.c_uint), ("by", C.c_uint),
                ("bz", C.c_uint), ("shmem", C.c_uint), ("stream", C.c_void_p), ("attrs", C.c_void_p),
                ("nattrs", C.c_uint)]
class LaunchAttr(C.Structure):
    _fields_ = [("id", C.c_int), ("pad", C.c_char * 4), ("value", C.c_char * 64)]
cu.cuLaunchKernelEx.argtypes = [C.POINTER(LaunchConfig), C.c_void_p, C.c_void_p, C.c_void_p]

ATTR_NAMES = {1: "access_policy", 2: "cooperative", 3: "sync_policy", 4: "cluster_dim", 5: "cluster_sched",
              6: "prog_stream_ser", 7: "prog_event", 8: "priority", 9: "memsync_map", 10: "memsync_domain",
              11: "preferred_cluster_dim?", 12: "launch_completion_event", 13: "device_updatable", 14: "smem_carveout"}

def capture(issue, stream):
    ck(cu.cuStreamBeginCapture_v2(stream, 2), "begin capture")
    try:
        issue()
    finally:
        g = C.c_void_p()
        st = cu.cuStreamEndCapture(stream, C.byref(g))
    ck(st, "end capture")
    n = C.c_size_t(0)
    ck(cu.cuGraphGetNodes(g, None, C.byref(n)), "nodes")
    nodes = (C.c_void_p * n.value)()
    ck(cu.cuGraphGetNodes(g, nodes, C.byref(n)), "nodes")
    out = []
    for nd in nodes:
        t = C.c_int()
        ck(cu.cuGraphNodeGetType(nd, C.byref(t)), "type")
        if t.value == 2:
            mp = MemsetParams(); ck(cu.cuGraphMemsetNodeGetParams(nd, C.byref(mp)), "memset params")
            out.append(("memset", mp.dst, mp.pitch, mp.value, mp.elementSize, mp.width, mp.height)); continue
        if t.value != 0:
            out.append(("node", t.value)); continue
        p = KNP2()
        ck(cu.cuGraphKernelNodeGetParams_v2(nd, C.byref(p)), "kparams")
        func = p.func
        if not func and p.kern:
            f = C.c_void_p(); ck(cu.cuKernelGetFunction(C.byref(f), p.kern), "kgetfunc"); func = f.value
        sizes = []
        i = 0
        while True:
            off, sz = C.c_size_t(), C.c_size_t()
            st = cu.cuFuncGetParamInfo(func, i, C.byref(off), C.byref(sz))
            if st: break
            sizes.append((off.value, sz.value)); i += 1
        blobs = []
        extra_blob = None
        if p.params:
            for k, (off, sz) in enumerate(sizes):
                blobs.append(C.string_at(p.params[k], sz))
        elif p.extra:
            i = 0; buf = None; size = None
            while p.extra[i]:
                key = p.extra[i]
                if key == 1: buf = p.extra[i + 1]
                elif key == 2: size = C.cast(p.extra[i + 1], C.POINTER(C.c_size_t))[0]
                i += 2
            whole = C.string_at(buf, size)
            extra_blob = (len(whole), sizes)
            blobs = [whole[o:o + z] for o, z in sizes]
        fattrs = {}
        for fa in (8, 10, 11, 12, 13, 14, 15):
            v = C.c_int()
            cu.cuFuncGetAttribute(C.byref(v), fa, func)
            fattrs[fa] = v.value
        attrs = {}
        for a in range(1, 15):
            v = (C.c_char * 64)()
            st = cu.cuGraphKernelNodeGetAttribute(nd, a, v)
            if st == 0 and any(v.raw):
                attrs[a] = v.raw
        name = C.c_char_p()
        cu.cuFuncGetName(C.byref(name), func)
        out.append(dict(fattrs=fattrs, extra_blob=extra_blob, func=func, kern=p.kern, grid=(p.gx, p.gy, p.gz), block=(p.bx, p.by, p.bz), shmem=p.shmem,
                        sizes=sizes, blobs=blobs, attrs=attrs, extra=bool(p.extra), name=(name.value or b"?").decode()[:90]))
    cu.cuGraphDestroy(g)
    return out

def explain(vals, sets, where):
    blob = vals[0]
    diff = [i for i in range(len(blob)) if any(v[i] != blob[i] for v in vals)]
    patches, covered = [], set()
    o = 0
    while o + 8 <= len(blob):
        v = [int.from_bytes(x[o:o+8], "little") for x in vals]
        hit = None
        for t in range(len(sets[0])):
            c0 = v[0] - sets[0][t]
            if c0 == v[1] - sets[1][t] == v[2] - sets[2][t] and abs(c0) < (1 << 40):
                hit = (t, c0); break
        if hit and any(i in diff for i in range(o, o + 8)):
            patches.append((o, hit[0], hit[1])); covered.update(range(o, o + 8)); o += 8
        else:
            o += 4
    left = [i for i in diff if i not in covered]
    if left:
        raise ValueError(f"{where} (size {len(blob)}): unexplained bytes {left[:8]}: "
                         + " | ".join(v[max(0, left[0]-9):left[0]+8].hex() for v in vals)
                         + f" ptr low bits {[hex(p & 0xffff) for p in sets[0]]}")
    return patches

def analyse(caps, sets):
    k0 = caps[0]
    for c in caps[1:]:
        if len(c) != len(k0): raise ValueError("node count differs")
        for a, b in zip(k0, c):
            if isinstance(a, tuple) or isinstance(b, tuple):
                if not (isinstance(a, tuple) and isinstance(b, tuple)) or a[0] != b[0] or a[2:] != b[2:]:
                    raise ValueError(f"non-kernel nodes differ {a} {b}")
                continue
            for f in ("func", "grid", "block", "shmem", "sizes", "attrs"):
                if a[f] != b[f]: raise ValueError(f"{f} differs")
    plan = []
    for ni, node in enumerate(k0):
        if isinstance(node, tuple):
            if node[0] != "memset": raise ValueError(f"node type {node[1]}")
            vals = [caps[j][ni][1].to_bytes(8, "little") for j in range(3)]
            pt = explain(vals, sets, f"memset {ni}")
            if len(pt) != 1: raise ValueError(f"memset {ni}: dst not a pointer {pt}")
            plan.append(("memset", pt[0][1], pt[0][2]) + node[2:])
            continue
        pts = []
        for ai in range(len(node["blobs"])):
            vals = [caps[j][ni]["blobs"][ai] for j in range(3)]
            pts.append([(ai, o, t, c) for o, t, c in explain(vals, sets, f"kernel {ni} arg {ai}")])
        plan.append(("kernel", [x for p in pts for x in p]))
    return plan

cu.cuMemsetD8Async.argtypes = [C.c_uint64, C.c_ubyte, C.c_size_t, C.c_void_p]
cu.cuMemsetD16Async.argtypes = [C.c_uint64, C.c_ushort, C.c_size_t, C.c_void_p]
cu.cuMemsetD32Async.argtypes = [C.c_uint64, C.c_uint, C.c_size_t, C.c_void_p]

class Replay:
    def __init__(self, node_infos, plan, variant="all"):
        self.steps = []
        for node, step in zip(node_infos, plan):
            if step[0] == "memset":
                _, t, c, pitch, value, es, width, height = step
                if height != 1: raise ValueError("2-D memset")
                fn = {1: cu.cuMemsetD8Async, 2: cu.cuMemsetD16Async, 4: cu.cuMemsetD32Async}[es]
                self.steps.append(("memset", fn, t, c, value, width))
                continue
            bufs = [C.create_string_buffer(b, len(b)) for b in node["blobs"]]
            arr = (C.c_void_p * len(bufs))(*[C.addressof(b) for b in bufs])
            slots = [(C.c_uint64.from_buffer(bufs[ai], o), t, c) for ai, o, t, c in step[1]]
            attrs = dict(node["attrs"])
            if variant == "cluster":
                attrs = {k: v for k, v in attrs.items() if k == 4}
            elif variant == "plain":
                attrs = {}
            if attrs:
                la = (LaunchAttr * len(attrs))()
                for i, (k, v) in enumerate(attrs.items()):
                    la[i].id = k; la[i].value = v
                cfg = LaunchConfig(*node["grid"], *node["block"], node["shmem"], None, C.cast(la, C.c_void_p), len(attrs))
            else:
                la = cfg = None
            self.steps.append(("kernel", node["func"], node["grid"], node["block"], node["shmem"], bufs, arr, slots, la, cfg))
    def __call__(self, ptrs, stream):
        for st_ in self.steps:
            if st_[0] == "memset":
                _, fn, t, c, value, width = st_
                st = fn(ptrs[t] + c, value, width, stream)
                if st: raise RuntimeError(f"memset {st}")
                continue
            _, func, g, b, sh, bufs, arr, slots, la, cfg = st_
            for slot, t, c in slots:
                slot.value = ptrs[t] + c
            if cfg is None:
                st = cu.cuLaunchKernel(func, g[0], g[1], g[2], b[0], b[1], b[2], sh, stream, arr, None)
            else:
                cfg.stream = stream
                st = cu.cuLaunchKernelEx(C.byref(cfg), func, arr, None)
            if st: raise RuntimeError(f"launch {st}")

def synthetic(real, k):
    base = 0x7f0000000000 + (k << 36)
    return tuple(base + (i + 1) * (1 << 28) + 256 + k * 512 * (i + 3) for i in range(len(real)))

def per_call(fn, n=400):
    for _ in range(20): fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        torch.cuda._sleep(int(2e6 + n * 60000))
        t = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return best


def probe_plan(label, plan, real, make_out, ws_bytes):
    """real: pointers (x, w, y...) with y fresh; make_out(): a new zeroed output tensor."""
    cap = torch.cuda.Stream()
    s = cap.cuda_stream
    hd = H.get_handle(0, s)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda") if ws_bytes else None
    sets = []
    caps = []
    n = len(real) + (1 if ws_bytes else 0)
    for k in range(3):
        ps = synthetic(range(n), k)
        sets.append(ps)
        caps.append(capture(lambda: plan.execute(hd, ps[:len(real)], ps[-1] if ws_bytes else 0), s))
    plan.clear_packs()
    kinds = [("K:" + c["name"] + f" grid{c['grid']} blk{c['block']} sh{c['shmem']} args{[sz for _, sz in c['sizes']]}"
              + (f" attrs{ {ATTR_NAMES.get(a, a): v[:12].hex() for a, v in c['attrs'].items()} }" if c['attrs'] else "")
              + (" EXTRA" if c["extra"] else "")) if isinstance(c, dict) else f"node type {c[1]}" for c in caps[0]]
    print(f"\n== {label}: {len(caps[0])} nodes, ws {ws_bytes}")
    for k in kinds: print("   ", k)
    try:
        patches = analyse(caps, sets)
    except ValueError as e:
        print("   REFUSED:", e); return
    print("    plan:", patches)
    for c in caps[0]:
        if isinstance(c, dict) and 4 in c["attrs"]: print("    func attrs", c["fattrs"])
    hd0 = H.get_handle(0, 0)
    y0 = make_out()
    wsp = ws.data_ptr() if ws is not None else 0
    plan.execute(hd0, real[:-1] + (y0.data_ptr(),), wsp)
    rp = None
    clustered = any(isinstance(c, dict) and 4 in c["attrs"] for c in caps[0])
    for variant in (("all", "cluster") if clustered else ("all", "plain")):
        r = Replay(caps[0], patches, variant)
        yv = make_out()
        try:
            r(real[:-1] + (yv.data_ptr(),) + ((wsp,) if ws_bytes else ()), 0)
            torch.cuda.synchronize()
            print(f"    variant {variant}: ok, equal {torch.equal(y0, yv)}")
            if rp is None: rp = r
        except RuntimeError as e:
            print(f"    variant {variant}: {e}")
    if rp is None: return
    y1 = make_out(); y2 = make_out()
    ptr1 = real[:-1] + (y1.data_ptr(),)
    ptr2 = real[:-1] + (y2.data_ptr(),)
    plan.execute(hd0, ptr1, wsp)
    rp(ptr2 + ((wsp,) if ws_bytes else ()), 0)
    torch.cuda.synchronize()
    same = torch.equal(y1, y2)
    print(f"    bitwise equal to cuDNN's execution: {same}; max abs diff {(y1.float()-y2.float()).abs().max().item():.3g}")
    t_exec = per_call(lambda: plan.execute(hd0, ptr1, wsp))
    rp_args = ptr2 + ((wsp,) if ws_bytes else ())
    t_rep = per_call(lambda: rp(rp_args, 0))
    print(f"    host per call: cudnnBackendExecute {t_exec:.2f} us, replay {t_rep:.2f} us")

# compiled pointwise plan (relu forward, bf16, 32x256x56x56) and tiny
from pycudnn.ops import runtime_kernels as RK
for shape in ((4, 64, 32, 32),):
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    xv = as_tensor(x)
    RK.configure(min_bytes=0)
    pr = RK.activation_promotion("relu", 0.0, xv, (xv.strides,), False, True)
    pr._make()
    plan = pr.plan
    def mk(o=x): return torch.zeros_like(o)
    probe_plan(f"compiled relu fwd {shape}", plan, (x.data_ptr(), 0), mk, 0)

# legacy API: a whole op call captured (activation legacy, pooling, softmax) with out=
RK.configure(enabled=False)
def probe_call(label, fn, ins, out_like):
    """fn(ins..., out, stream) with torch tensors; synthetic pointers can't be used: real buffers."""
    cap = torch.cuda.Stream(); s = cap.cuda_stream
    sets, caps = [], []
    for k in range(3):
        bufs = [torch.empty(t.numel() * t.element_size() + 1024, dtype=torch.uint8, device="cuda") for t in ins + [out_like]]
        views = []
        for j, (b, t) in enumerate(zip(bufs, ins + [out_like])):
            off = 256 * (2 * k + 1 + 2 * j) % 1024
            views.append(b[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape) if t.is_contiguous()
                         else b[off:off + t.numel() * t.element_size()].view(t.dtype).as_strided(t.shape, t.stride()))
        sets.append(tuple(v.data_ptr() for v in views))
        caps.append(capture(lambda: fn(*views, s), s))
    print(f"\n== {label}: {len(caps[0])} nodes")
    for c in caps[0]:
        print("   ", ("K:" + c["name"] + f" grid{c['grid']} blk{c['block']} args{[sz for _, sz in c['sizes']]}") if isinstance(c, dict) else c)
    try:
        patches = analyse(caps, sets)
    except ValueError as e:
        print("    REFUSED:", e); return
    print("    patches:", patches)
    rp = Replay(caps[0], patches)
    o1, o2 = torch.zeros_like(out_like), torch.zeros_like(out_like)
    fn(*ins, o1, 0)
    rp(tuple(t.data_ptr() for t in ins) + (o2.data_ptr(),), 0)
    torch.cuda.synchronize()
    print(f"    equal: {torch.equal(o1, o2)}")
    real = tuple(t.data_ptr() for t in ins) + (o2.data_ptr(),)
    print(f"    host per call: op {per_call(lambda: fn(*ins, o1, 0)):.2f} us, replay {per_call(lambda: rp(real, 0)):.2f} us")

x = torch.randn(2, 16, 8, 8, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
probe_call("legacy relu fwd", lambda a, o, s: pycudnn.activation_forward(a, "relu", out=o, stream=s), [x], x)
probe_call("max pool 3x3/2", lambda a, o, s: pycudnn.pooling_forward(a, (3, 3), stride=2, padding=1, mode="max", out=o, stream=s), [x],
           torch.empty(2, 16, 4, 4, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last))
z = torch.randn(32, 1000, device="cuda")
probe_call("softmax", lambda a, o, s: pycudnn.softmax_forward(a, out=o, stream=s), [z], z)
probe_call("legacy relu bwd", lambda y, dy, a, o, s: pycudnn.activation_backward(y, dy, a, "relu", out=o, stream=s), [x, x.clone(), x.clone()], x)

def conv_cases():
    torch.backends.cudnn.allow_tf32 = True
    shapes = [  # (N, C, H, W, K, R, stride, pad)
        (1, 8, 8, 8, 8, 3, 1, 1), (32, 64, 56, 56, 64, 3, 1, 1), (32, 256, 56, 56, 64, 1, 1, 0),
        (32, 512, 7, 7, 2048, 1, 1, 0), (32, 3, 224, 224, 64, 7, 2, 3),
    ]
    for dtype, cl in ((torch.bfloat16, True), (torch.float32, False)):
        for (n, c, h, w_, k, r, st, pad) in shapes:
            x = torch.randn(n, c, h, w_, device="cuda", dtype=dtype)
            wt = torch.randn(k, c, r, r, device="cuda", dtype=dtype)
            if cl:
                x = x.to(memory_format=torch.channels_last); wt = wt.to(memory_format=torch.channels_last)
            for direction in ("fwd", "dgrad", "wgrad"):
                try:
                    y = pycudnn.convolution(x, wt, stride=st, padding=pad)
                    gy = torch.randn(tuple(y.shape), device="cuda", dtype=dtype)
                    if cl: gy = gy.to(memory_format=torch.channels_last)
                    if direction == "fwd":
                        p = pycudnn.prepare_convolution(x, wt, stride=st, padding=pad)
                        a, b, out_like = x, wt, gy
                    elif direction == "dgrad":
                        p = pycudnn.prepare_convolution(gy, wt, direction="backward_data", input_shape=tuple(x.shape), stride=st, padding=pad)
                        a, b, out_like = gy, wt, x
                    else:
                        p = pycudnn.prepare_convolution(x, gy, direction="backward_filter", weight_shape=tuple(wt.shape), stride=st, padding=pad)
                        a, b, out_like = x, gy, wt
                    rec = p.record
                    plan = getattr(rec, "plan", None)
                    if plan is None:
                        print(f"\n== {direction} {n,c,h,w_,k,r} {dtype}: not a graph plan ({rec.describe()})"); continue
                    i, j, kk = p._positions
                    def make_out(o=out_like): return torch.zeros_like(o)
                        # graph order (x, w, y): place the written tensor last in our pointer tuple order
                    names = ["x", "w", "y"]
                    roles = {"fwd": ("x", "w", "y"), "dgrad": ("y", "w", "x"), "wgrad": ("x", "y", "w")}[direction]
                    # real pointers in graph order, with the written one marked
                    byrole = dict(zip(roles, [a.data_ptr(), b.data_ptr(), None]))
                    written = roles[2]
                    order = [nm for nm in names if nm != written] + [written]
                    # probe with the written tensor last: build a view plan order mapping
                    perm = [names.index(nm) for nm in order]
                    class PermPlan:
                        def __init__(s2, pl): s2.pl = pl
                        def execute(s2, hd, ptrs, ws):
                            g = [0, 0, 0]
                            for src, dst in enumerate(perm): g[dst] = ptrs[src]
                            s2.pl.execute(hd, tuple(g), ws)
                        def clear_packs(s2): s2.pl.clear_packs()
                    real = tuple(byrole[nm] for nm in order[:2]) + (0,)
                    probe_plan(f"{direction} {n,c,h,w_,k,r,st} {str(dtype)[6:]} {rec.describe()[:60]}", PermPlan(plan), real, make_out,
                               plan.workspace_size or 0)
                except Exception:
                    traceback.print_exc()


import torch.nn.functional as F
print("\ntorch host per call (same tiny tensors): relu %.2f us, max_pool2d %.2f us, softmax %.2f us" % (
    per_call(lambda: torch.relu(x)), per_call(lambda: F.max_pool2d(x, 3, 2, 1)), per_call(lambda: torch.softmax(z, 1))))
conv_cases()
