"""The graph engine on a GPU: forward / backward-data / backward-filter and fused epilogues
against a float64 NumPy reference, plan and variant-pack behaviour, lifetime, host cost.

Device memory comes from cuda.bindings' runtime (cudaMalloc / cudaMemcpy) so that nothing but
cuda-python is needed; bfloat16 is converted by bit manipulation (no ml_dtypes needed).
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import json
import os
import threading
import time
import zlib
from typing import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from pycudnn.ffi import library as _lib
from pycudnn.ffi import backend as B
from pycudnn.cudnn import graph as G
from pycudnn.errors import CudnnError, NoAlgorithmError

pytestmark = pytest.mark.gpu

FLOAT, DOUBLE, HALF, BF16 = 0, 1, 2, 9


def fused_plan(handle: int, x: G.TensorSpec, w: G.TensorSpec, y: G.TensorSpec,
               padding: int | Sequence[int], stride: int | Sequence[int],
               dilation: int | Sequence[int], epilogue: G.Epilogue,
               compute_dtype: int | npt.DTypeLike | None = None, *, allow_tf32: bool = True,
               deterministic: bool = False, modes: Sequence[str] = ("A", "FALLBACK"),
               max_attempts: int | None = None) -> G.ExecutionPlan:
    """Forward conv + epilogue as one plan; if alpha != 1 on the z-add's ALPHA2 gets no working
    plan, rebuild the graph with alpha as a multiply by a by-value scalar (MEASURED.md 2b).

    Only these tests build a fused plan this way (the graph engine searches its own candidates),
    so the helper lives here."""
    attempts = [epilogue]
    if epilogue.z is not None and float(epilogue.alpha) != 1.0 and epilogue.alpha_mode == "alpha2":
        attempts.append(G.Epilogue(epilogue.z, epilogue.alpha, epilogue.bias, epilogue.relu, "mul"))
    all_failures: list[tuple[str, str]] = []
    for ep in attempts:
        g = G.build_convolution_graph(handle, "forward", x, w, y, padding, stride, dilation,
                                      compute_dtype, ep)
        cands = G.engine_configs(handle, g, modes)
        kept, dropped = G.filter_candidates(cands, x.dtype, allow_tf32, deterministic)
        for c, _ in dropped:
            c.close()
        try:
            plan, _ = G.first_plan(handle, kept, max_attempts)
        except NoAlgorithmError as exc:
            all_failures += [(f"{ep.alpha_mode}:{t}", r) for t, r in exc.failures]
            all_failures += [(f"{ep.alpha_mode}", p) for p in cands.problems]
            for c in kept:
                c.close()
            g.close()
            continue
        for c in kept:
            if c is not plan.config:
                c.close()
        return plan
    raise NoAlgorithmError(f"no fused plan for {epilogue}", all_failures)


# ---- device memory and dtypes --------------------------------------------------------------

def _rt():
    from cuda.bindings import runtime as rt

    return rt


def _ok(res):
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err}")
    return res[1] if isinstance(res, tuple) and len(res) > 1 else None


class DevBuf:
    """cudaMalloc'd bytes, freed on close / garbage collection."""

    def __init__(self, nbytes: int, fill: int | None = 0x7B):
        rt = _rt()
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(_ok(rt.cudaMalloc(self.nbytes)))
        if fill is not None:
            _ok(rt.cudaMemset(self.ptr, fill, self.nbytes))
        self._fin = __import__("weakref").finalize(self, rt.cudaFree, self.ptr)

    def upload(self, arr: np.ndarray) -> "DevBuf":
        a = np.ascontiguousarray(arr)
        assert a.nbytes <= self.nbytes
        rt = _rt()
        _ok(rt.cudaMemcpy(self.ptr, a.ctypes.data, a.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
        return self

    def download(self, dtype, count: int) -> np.ndarray:
        out = np.empty(count, dtype=dtype)
        rt = _rt()
        _ok(rt.cudaMemcpy(out.ctypes.data, self.ptr, out.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        return out

    def close(self):
        self._fin()


def sync():
    _ok(_rt().cudaDeviceSynchronize())


def quantize(a64: np.ndarray, dt: int) -> tuple[np.ndarray, np.ndarray]:
    """(storage array as the GPU sees it, the float64 values it holds)."""
    if dt == FLOAT:
        s = a64.astype(np.float32)
        return s, s.astype(np.float64)
    if dt == DOUBLE:
        return a64.copy(), a64.copy()
    if dt == HALF:
        s = a64.astype(np.float16)
        return s, s.astype(np.float64)
    if dt == BF16:
        f = a64.astype(np.float32)
        bits = f.view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return bits, decode(bits, BF16)
    raise ValueError(dt)


def decode(storage: np.ndarray, dt: int) -> np.ndarray:
    if dt == BF16:
        return (storage.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return storage.astype(np.float64)


_STORAGE = {FLOAT: np.float32, DOUBLE: np.float64, HALF: np.float16, BF16: np.uint16}


def to_physical(a: np.ndarray, layout: str) -> np.ndarray:
    if layout == "NCHW":
        return np.ascontiguousarray(a)
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def from_physical(flat: np.ndarray, shape, layout: str) -> np.ndarray:
    if layout == "NCHW":
        return flat.reshape(shape)
    phys = (shape[0],) + tuple(shape[2:]) + (shape[1],)
    return np.moveaxis(flat.reshape(phys), -1, 1)


def strides_for(shape, layout):
    return G.nchw_strides(shape) if layout == "NCHW" else G.nhwc_strides(shape)


# ---- float64 reference convolutions (direct, via einsum over kernel offsets) ---------------

def out_shape(xs, ws, pad, stride, dil):
    return tuple((xs[i] + 2 * pad[i] - dil[i] * (ws[i] - 1) - 1) // stride[i] + 1
                 for i in range(len(xs)))


def _slices(r, O, stride, dil):
    return tuple(slice(r[i] * dil[i], r[i] * dil[i] + (O[i] - 1) * stride[i] + 1, stride[i])
                 for i in range(len(r)))


def ref_forward(x, w, pad, stride, dil):
    N, C = x.shape[:2]
    K, Cg = w.shape[:2]
    g = C // Cg
    R = w.shape[2:]
    O = out_shape(x.shape[2:], R, pad, stride, dil)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    y = np.zeros((N, g, K // g) + O)
    wg = w.reshape((g, K // g, Cg) + R)
    for r in itertools.product(*[range(k) for k in R]):
        xs = xp[(slice(None), slice(None)) + _slices(r, O, stride, dil)].reshape((N, g, Cg) + O)
        y += np.einsum("ngc...,gkc->ngk...", xs, wg[(Ellipsis,) + r])
    return y.reshape((N, K) + O)


def ref_backward_data(dy, w, xshape, pad, stride, dil):
    N, C = xshape[:2]
    K, Cg = w.shape[:2]
    g = C // Cg
    R = w.shape[2:]
    O = dy.shape[2:]
    padded = tuple(xshape[2 + i] + 2 * pad[i] for i in range(len(pad)))
    dxp = np.zeros((N, g, Cg) + padded)
    wg = w.reshape((g, K // g, Cg) + R)
    dyg = dy.reshape((N, g, K // g) + O)
    for r in itertools.product(*[range(k) for k in R]):
        sl = (slice(None), slice(None), slice(None)) + _slices(r, O, stride, dil)
        dxp[sl] += np.einsum("ngk...,gkc->ngc...", dyg, wg[(Ellipsis,) + r])
    crop = tuple(slice(p, p + xshape[2 + i]) for i, p in enumerate(pad))
    return dxp[(slice(None),) * 3 + crop].reshape(xshape)


def ref_backward_filter(x, dy, wshape, pad, stride, dil):
    N, C = x.shape[:2]
    K, Cg = wshape[:2]
    g = C // Cg
    R = wshape[2:]
    O = dy.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    dyg = dy.reshape((N, g, K // g) + O)
    dw = np.zeros((g, K // g, Cg) + R)
    for r in itertools.product(*[range(k) for k in R]):
        xs = xp[(slice(None), slice(None)) + _slices(r, O, stride, dil)].reshape((N, g, Cg) + O)
        dw[(Ellipsis,) + r] = np.einsum("ngcp,ngkp->gkc", xs.reshape(N, g, Cg, -1),
                                        dyg.reshape(N, g, K // g, -1))
    return dw.reshape(wshape)


def test_reference_is_consistent():
    """<conv(x, w), dy> == <x, dgrad(dy, w)> == <w, wgrad(x, dy)> (adjoint identities)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((6, 2, 3, 2))
    pad, stride, dil = (1, 0), (2, 1), (2, 1)
    y = ref_forward(x, w, pad, stride, dil)
    dy = rng.standard_normal(y.shape)
    a = np.sum(y * dy)
    b = np.sum(x * ref_backward_data(dy, w, x.shape, pad, stride, dil))
    c = np.sum(w * ref_backward_filter(x, dy, w.shape, pad, stride, dil))
    assert np.allclose(a, b) and np.allclose(a, c)
    # and one point by hand
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 0)])
    manual = sum(xp[1, c, 2 * 1 + 2 * r, 3 + s] * w[4, c - 2, r, s]
                 for c in range(2, 4) for r in range(3) for s in range(2))
    assert np.isclose(y[1, 4, 1, 3], manual)


# ---- fixtures ------------------------------------------------------------------------------

def _create_handle() -> int:
    h = ctypes.c_void_p()
    st = _lib.lib().cudnnCreate(ctypes.byref(h))
    if st:
        _lib.raise_status(st, "cudnnCreate")
    return int(h.value)


@pytest.fixture(scope="module")
def handle():
    _ok(_rt().cudaSetDevice(0))
    h = _create_handle()
    yield h
    _lib.lib().cudnnDestroy(h)


_REPORT: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _write_report():
    yield
    out = os.environ.get("OUT")
    if out and _REPORT:
        path = os.path.join(out, "graph_report.json")
        merged = {}
        if os.path.exists(path):
            with open(path) as f:
                merged = json.load(f)
        merged.update(_REPORT)
        with open(path, "w") as f:
            json.dump(merged, f, indent=1, default=str)


def ordered(cands):
    """Precompiled engines first (cheap to build), runtime-compiled ones after."""
    return [c for c in cands if not c.runtime_compiled] + [c for c in cands if c.runtime_compiled]


def run_graph(handle, graph, dtype, inputs: dict, out_name: str, out_nbytes: int, *,
              allow_tf32=False, modes=("A", "FALLBACK"), cands=None):
    """configs -> filter -> first plan that finalizes -> execute. Returns (bytes of out, plan)."""
    if cands is None:
        cands = G.engine_configs(handle, graph, modes)
    kept, dropped = G.filter_candidates(cands, dtype, allow_tf32, deterministic=False)
    assert kept, f"no candidate kept: {len(cands)} found, dropped {[(c.tag, r) for c, r in dropped]}, problems {cands.problems}"
    plan, failures = G.first_plan(handle, ordered(kept), max_attempts=12)
    plan._failures = failures
    out = DevBuf(out_nbytes)
    ws = DevBuf(plan.workspace_size, fill=None) if plan.workspace_size else None
    ptrs = {}
    for name in graph.specs:
        ptrs[name] = out.ptr if name == out_name else inputs[name].ptr
    plan.execute(handle, ptrs, ws.ptr if ws else 0)
    sync()
    return out, plan, ws


TOL = {FLOAT: (2e-4, 2e-4), HALF: (1e-2, 1e-2), BF16: (3e-2, 3e-2), DOUBLE: (1e-10, 1e-10)}


def assert_close(got, ref, dt, what):
    rtol, atol = TOL[dt]
    scale = max(1.0, float(np.max(np.abs(ref))))
    err = np.abs(got - ref)
    bad = err > atol * scale + rtol * np.abs(ref)
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} elements off; max err "
                           f"{err.max():.3e} (scale {scale:.3g})")


# ---- the three directions ------------------------------------------------------------------

GEOMS = {"s1p1d1": (1, 1, 1), "s2p1d2": (2, 1, 2)}
DTYPES = [("f32", FLOAT, "NCHW"), ("f16-nhwc", HALF, "NHWC"), ("f16-nchw", HALF, "NCHW"),
          ("bf16-nhwc", BF16, "NHWC"), ("bf16-nchw", BF16, "NCHW")]


@pytest.mark.parametrize("direction", G.DIRECTIONS)
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("dtname,dt,layout", DTYPES, ids=[d[0] for d in DTYPES])
def test_convolution(handle, direction, nd, groups, geom, dtname, dt, layout):
    stride, pad, dil = GEOMS[geom]
    rng = np.random.default_rng(zlib.crc32(repr((direction, nd, groups, geom, dtname)).encode()))
    N, C, K, R = 2, 4, 6, 3
    S = (9, 9) if nd == 2 else (6, 6, 6)
    xshape = (N, C) + S
    wshape = (K, C // groups) + (R,) * nd
    padv, strv, dilv = (pad,) * nd, (stride,) * nd, (dil,) * nd
    yshape = (N, K) + out_shape(S, (R,) * nd, padv, strv, dilv)

    xs, x64 = quantize(rng.uniform(-1, 1, xshape), dt)
    ws_, w64 = quantize(rng.uniform(-1, 1, wshape), dt)
    ys, y64 = quantize(rng.uniform(-1, 1, yshape), dt)
    specs = {n: G.TensorSpec(u, s, strides_for(s, layout), dt)
             for n, u, s in (("x", 1, xshape), ("w", 2, wshape), ("y", 3, yshape))}
    g = G.build_convolution_graph(handle, direction, specs["x"], specs["w"], specs["y"],
                                  pad, stride, dil, FLOAT)
    bufs = {"x": DevBuf(xs.nbytes).upload(to_physical(xs, layout)),
            "w": DevBuf(ws_.nbytes).upload(to_physical(ws_, layout)),
            "y": DevBuf(ys.nbytes).upload(to_physical(ys, layout))}
    if direction == "forward":
        out_name, oshape, ref = "y", yshape, ref_forward(x64, w64, padv, strv, dilv)
    elif direction == "backward_data":
        out_name, oshape = "x", xshape
        ref = ref_backward_data(y64, w64, xshape, padv, strv, dilv)
    else:
        out_name, oshape = "w", wshape
        ref = ref_backward_filter(x64, y64, wshape, padv, strv, dilv)
    out, plan, _ = run_graph(handle, g, dt, bufs, out_name, int(np.prod(oshape)) * xs.itemsize)
    got = decode(from_physical(out.download(_STORAGE[dt], int(np.prod(oshape))), oshape, layout), dt)
    assert_close(got, ref, dt, f"{direction} {nd}d g{groups} {geom} {dtname} via {plan.tag}")
    if dt == FLOAT:
        assert not plan.config.tensor_core  # strict float32: TF32 engines were filtered out
    _REPORT.setdefault("plans", {})[f"{direction}-{nd}d-g{groups}-{geom}-{dtname}"] = (
        plan.tag, plan.workspace_size, round(plan.finalize_time * 1e3, 3), plan.runtime_compiled,
        len(plan._failures))


def test_float64_forward(handle):
    rng = np.random.default_rng(5)
    xshape, wshape = (2, 4, 7, 7), (4, 4, 3, 3)
    yshape = (2, 4, 7, 7)
    x, w = rng.uniform(-1, 1, xshape), rng.uniform(-1, 1, wshape)
    specs = [G.TensorSpec(u, s, G.nchw_strides(s), DOUBLE)
             for u, s in ((1, xshape), (2, wshape), (3, yshape))]
    g = G.build_convolution_graph(handle, "forward", *specs, 1, 1, 1)
    bufs = {"x": DevBuf(x.nbytes).upload(x), "w": DevBuf(w.nbytes).upload(w)}
    try:
        out, plan, _ = run_graph(handle, g, DOUBLE, bufs, "y", 8 * int(np.prod(yshape)))
    except (NoAlgorithmError, AssertionError) as exc:
        pytest.skip(f"no double-precision graph engine: {exc}")
    got = out.download(np.float64, int(np.prod(yshape))).reshape(yshape)
    assert_close(got, ref_forward(x, w, (1, 1), (1, 1), (1, 1)), DOUBLE, "float64 forward")


# ---- fused epilogues -----------------------------------------------------------------------

FUSED = [
    ("z+bias+relu", True, 1.0, True, True),
    ("0.5z+bias+relu", True, 0.5, True, True),
    ("bias", False, 1.0, True, False),
    ("bias+relu", False, 1.0, True, True),
]


@pytest.mark.parametrize("dtname,dt", [("bf16", BF16), ("f16", HALF)])
@pytest.mark.parametrize("kernel", [3, 1])
@pytest.mark.parametrize("name,use_z,alpha,use_b,relu", FUSED, ids=[f[0] for f in FUSED])
def test_fused_epilogue(handle, dtname, dt, kernel, name, use_z, alpha, use_b, relu):
    rng = np.random.default_rng(zlib.crc32(repr((dtname, kernel, name)).encode()))
    N, C, H, K = 2, 16, 8, 32
    pad = kernel // 2
    xshape, wshape, yshape = (N, C, H, H), (K, C, kernel, kernel), (N, K, H, H)
    xs, x64 = quantize(rng.uniform(-1, 1, xshape), dt)
    ws_, w64 = quantize(rng.uniform(-1, 1, wshape) / np.sqrt(C * kernel * kernel), dt)
    zs, z64 = quantize(rng.uniform(-1, 1, yshape), dt)
    bs, b64 = quantize(rng.uniform(-1, 1, (1, K, 1, 1)), dt)
    sp = lambda u, s: G.TensorSpec(u, s, G.nhwc_strides(s), dt)  # noqa: E731
    ep = G.Epilogue(z=sp(4, yshape) if use_z else None, alpha=alpha,
                    bias=G.bias_spec(5, K, 4, dt) if use_b else None, relu=relu)
    t0 = time.perf_counter()
    plan = fused_plan(handle, sp(1, xshape), sp(2, wshape), sp(3, yshape), pad, 1, 1, ep,
                        FLOAT, modes=("A", "FALLBACK"))
    build_s = time.perf_counter() - t0
    bufs = {"x": DevBuf(xs.nbytes).upload(to_physical(xs, "NHWC")),
            "w": DevBuf(ws_.nbytes).upload(to_physical(ws_, "NHWC")),
            "z": DevBuf(zs.nbytes).upload(to_physical(zs, "NHWC")),
            "b": DevBuf(bs.nbytes).upload(bs)}
    out = DevBuf(zs.nbytes)
    ws = DevBuf(plan.workspace_size, fill=None) if plan.workspace_size else None
    ptrs = {n: (out.ptr if n == "y" else bufs[n].ptr) for n in plan.graph.specs}
    plan.execute(handle, ptrs, ws.ptr if ws else 0)
    sync()
    ref = ref_forward(x64, w64, (pad, pad), (1, 1), (1, 1))
    if use_z:
        ref = ref + alpha * z64
    if use_b:
        ref = ref + b64
    if relu:
        ref = np.maximum(ref, 0)
    got = decode(from_physical(out.download(np.uint16 if dt == BF16 else np.float16,
                                            int(np.prod(yshape))), yshape, "NHWC"), dt)
    assert_close(got, ref, dt, f"fused {name} {dtname} k{kernel} via {plan.tag}")
    _REPORT.setdefault("fused", {})[f"{name}-{dtname}-k{kernel}"] = (
        plan.tag, plan.graph.description, round(build_s * 1e3, 1), plan.runtime_compiled)


def test_fused_alpha_as_by_value_multiply(handle):
    """alpha applied as MUL(z, by-value scalar): exercises by-value tensors in variant packs."""
    dt = BF16
    rng = np.random.default_rng(11)
    N, C, H, K = 2, 16, 8, 32
    xshape, wshape, yshape = (N, C, H, H), (K, C, 1, 1), (N, K, H, H)
    xs, x64 = quantize(rng.uniform(-1, 1, xshape), dt)
    ws_, w64 = quantize(rng.uniform(-1, 1, wshape) / 4, dt)
    zs, z64 = quantize(rng.uniform(-1, 1, yshape), dt)
    bs, b64 = quantize(rng.uniform(-1, 1, (1, K, 1, 1)), dt)
    sp = lambda u, s: G.TensorSpec(u, s, G.nhwc_strides(s), dt)  # noqa: E731
    ep = G.Epilogue(z=sp(4, yshape), alpha=-0.75, bias=G.bias_spec(5, K, 4, dt), relu=True,
                    alpha_mode="mul")
    g = G.build_convolution_graph(handle, "forward", sp(1, xshape), sp(2, wshape), sp(3, yshape),
                                  0, 1, 1, FLOAT, ep)
    assert len(g.by_value_uids) == 1
    bufs = {"x": DevBuf(xs.nbytes).upload(to_physical(xs, "NHWC")),
            "w": DevBuf(ws_.nbytes).upload(to_physical(ws_, "NHWC")),
            "z": DevBuf(zs.nbytes).upload(to_physical(zs, "NHWC")),
            "b": DevBuf(bs.nbytes).upload(bs)}
    try:
        out, plan, _ = run_graph(handle, g, dt, bufs, "y", zs.nbytes, allow_tf32=True)
    except NoAlgorithmError as exc:
        pytest.skip(f"no engine takes the MUL-by-scalar graph here: {exc.failures[:3]}")
    ref = np.maximum(ref_forward(x64, w64, (0, 0), (1, 1), (1, 1)) - 0.75 * z64 + b64, 0)
    got = decode(from_physical(out.download(np.uint16, int(np.prod(yshape))), yshape, "NHWC"), dt)
    assert_close(got, ref, dt, f"fused mul-alpha via {plan.tag}")
    _REPORT["fused_mul"] = (plan.tag, round(plan.finalize_time * 1e3, 1), plan.runtime_compiled)


# ---- plans, packs, lifetime ----------------------------------------------------------------

def _small_forward(handle, dt=FLOAT, layout="NCHW", shape=(1, 8, 8, 8), K=8):
    N, C, H, W = shape
    xshape, wshape, yshape = shape, (K, C, 3, 3), (N, K, H, W)
    specs = [G.TensorSpec(u, s, strides_for(s, layout), dt)
             for u, s in ((1, xshape), (2, wshape), (3, yshape))]
    g = G.build_convolution_graph(handle, "forward", *specs, 1, 1, 1)
    return g, xshape, wshape, yshape


def test_candidates_are_deduplicated_and_described(handle):
    g, *_ = _small_forward(handle, BF16, "NHWC", (4, 16, 8, 8), 16)
    t0 = time.perf_counter()
    cands = G.engine_configs(handle, g)  # A, B, FALLBACK
    t_all = time.perf_counter() - t0
    assert cands, cands.problems
    keys = [c.key for c in cands]
    assert len(keys) == len(set(keys))
    modes = [c.mode for c in cands]
    assert modes == sorted(modes, key=["A", "B", "FALLBACK"].index)
    for c in cands:
        assert c.engine_id >= 0 and c.engine_id < g.engine_count
        assert all(isinstance(v, int) for _, v in c.knobs)
    assert any(c.knobs for c in cands)  # knob choices were read (pre-created receivers)
    per_mode = {}
    for m in ("A", "B", "FALLBACK"):
        t0 = time.perf_counter()
        cm = G.engine_configs(handle, g, (m,))
        per_mode[m] = (len(cm), round((time.perf_counter() - t0) * 1e3, 2), cm.problems)
        for c in cm:
            c.close()
    _REPORT["candidates_bf16_nhwc"] = {
        "heuristics_ms": round(t_all * 1e3, 2), "engine_count": g.engine_count,
        "per_mode_count_ms": per_mode,
        "problems": cands.problems,
        "list": [(c.mode, c.tag, [getattr(n, "name", n) for n in c.numerical_notes],
                  [getattr(n, "name", n) for n in c.behavior_notes]) for c in cands]}


def _keys_with_fresh_receivers(handle, g, modes):
    """The configs' keys described on a new thread (so with knob receivers never used before)."""
    out = []
    t = threading.Thread(target=lambda: out.extend(c.key for c in G.engine_configs(handle, g, modes)))
    t.start()
    t.join()
    return out


def test_lazy_candidates_describe_only_what_is_reached_in_the_eager_order(handle):
    from pycudnn.cudnn.graph import plan as P

    g, *_ = _small_forward(handle, BF16, "NHWC", (4, 16, 8, 8), 16)
    eager = [c.key for c in G.engine_configs(handle, g)]
    lazy = G.iter_engine_configs(handle, g)
    first = next(lazy)
    assert first.key == eager[0]
    assert lazy._modes == [("B", P.HeurMode.B), ("FALLBACK", P.HeurMode.FALLBACK)]  # not queried
    pending = list(lazy._pending)
    lazy.close()
    assert all(d.closed for d in pending) and list(lazy) == []
    assert [c.key for c in G.iter_engine_configs(handle, g)] == eager


def test_knob_receivers_reused_across_shapes_read_the_same_choices_as_fresh_ones(handle):
    """Each thread keeps its knob receivers for every later shape: the choices read through
    them for a new shape must be those read through receivers never used before."""
    shapes = [((4, 16, 8, 8), 16), ((2, 32, 14, 14), 64), ((8, 8, 5, 5), 24)]
    with_knobs = 0
    for dtype, layout in ((BF16, "NHWC"), (FLOAT, "NCHW")):
        for xshape, k in shapes:
            g, *_ = _small_forward(handle, dtype, layout, xshape, k)
            reused = [c.key for c in G.engine_configs(handle, g)]
            assert reused == _keys_with_fresh_receivers(handle, g, ("A", "B", "FALLBACK"))
            with_knobs += sum(1 for _, knobs in reused if knobs)
    assert with_knobs  # knob choices were read at all


def test_plan_from_key_and_json_roundtrip(handle):
    g, xshape, wshape, yshape = _small_forward(handle)
    rng = np.random.default_rng(3)
    x, w = rng.uniform(-1, 1, xshape).astype(np.float32), rng.uniform(-1, 1, wshape).astype(np.float32)
    bx, bw = DevBuf(x.nbytes).upload(x), DevBuf(w.nbytes).upload(w)
    ref = ref_forward(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1))
    cands = G.engine_configs(handle, g, ("A",))
    kept, _ = G.filter_candidates(cands, FLOAT, False, False)
    plan, _ = G.first_plan(handle, ordered(kept))
    c2 = G.EngineConfig.from_key(g, plan.engine_id, plan.knobs)
    assert c2.key == plan.key
    assert set(c2.numerical_notes) == set(plan.notes)
    plan2 = G.ExecutionPlan(c2).finalize(handle)
    assert plan2.workspace_size == plan.workspace_size
    results = {}
    for name, p in (("heur", plan), ("key", plan2)):
        out = DevBuf(4 * int(np.prod(yshape)))
        ws = DevBuf(p.workspace_size, fill=None) if p.workspace_size else None
        p.execute(handle, (bx.ptr, bw.ptr, out.ptr), ws.ptr if ws else 0)
        sync()
        results[name] = out.download(np.float32, int(np.prod(yshape))).reshape(yshape)
        assert_close(results[name].astype(np.float64), ref, FLOAT, name)
    text = plan.json()
    assert text.startswith("{") and len(text) > 20
    info = {"json_len": len(text)}
    try:
        p3 = G.ExecutionPlan.from_json(handle, g, text)
        out = DevBuf(4 * int(np.prod(yshape)))
        ws = DevBuf(p3.workspace_size, fill=None) if p3.workspace_size else None
        p3.execute(handle, (bx.ptr, bw.ptr, out.ptr), ws.ptr if ws else 0)
        sync()
        got = out.download(np.float32, int(np.prod(yshape))).reshape(yshape)
        assert np.array_equal(got, results["heur"])
        info.update(from_json="ok", engine_id=p3.engine_id, finalize_ms=p3.finalize_time * 1e3)
    except CudnnError as exc:
        info["from_json"] = f"failed: {exc}"
    _REPORT["json"] = info


def test_variant_pack_lru_and_pointer_forms(handle):
    g, xshape, wshape, yshape = _small_forward(handle)
    cands = G.engine_configs(handle, g, ("A",))
    kept, _ = G.filter_candidates(cands, FLOAT, False, False)
    plan, _ = G.first_plan(handle, ordered(kept))
    plan.max_packs = 3
    bx, bw = DevBuf(4 * int(np.prod(xshape)), 0), DevBuf(4 * int(np.prod(wshape)), 0)
    outs = [DevBuf(4 * int(np.prod(yshape))) for _ in range(5)]
    ws = DevBuf(plan.workspace_size, fill=None) if plan.workspace_size else None
    wsp = ws.ptr if ws else 0
    plan.execute(handle, (bx.ptr, bw.ptr, outs[0].ptr), wsp)
    assert plan.cached_packs == 1
    plan.execute(handle, (bx.ptr, bw.ptr, outs[0].ptr), wsp)
    plan.execute(handle, {"x": bx.ptr, "w": bw.ptr, "y": outs[0].ptr}, wsp)
    plan.execute(handle, {1: bx.ptr, 2: bw.ptr, 3: outs[0].ptr}, wsp)
    plan.execute(handle, [bx.ptr, bw.ptr, outs[0].ptr], wsp)
    plan.execute(handle, tuple(np.uint64(p) for p in (bx.ptr, bw.ptr, outs[0].ptr)), wsp)
    assert plan.cached_packs == 1
    before = B.live_count()
    for o in outs[1:]:
        plan.execute(handle, (bx.ptr, bw.ptr, o.ptr), wsp)
    assert plan.cached_packs == 3
    assert B.live_count() == before + 2  # evicted packs were freed
    sync()
    for o in outs:
        assert np.all(o.download(np.float32, int(np.prod(yshape))) == 0)
    with pytest.raises(ValueError, match="aligned"):
        plan.execute(handle, (bx.ptr + 4, bw.ptr, outs[0].ptr), wsp)
    with pytest.raises(ValueError, match="3 tensors"):
        plan.execute(handle, (bx.ptr, bw.ptr), wsp)
    with pytest.raises(TypeError):
        plan.execute(handle, (bx.ptr, bw.ptr, None), wsp)
    with pytest.raises(KeyError):
        plan.execute(handle, {"x": bx.ptr}, wsp)
    if plan.workspace_size:
        with pytest.raises(ValueError, match="workspace"):
            plan.execute(handle, (bx.ptr, bw.ptr, outs[4].ptr), 0)
    plan.close()
    with pytest.raises(B.ClosedDescriptorError):
        plan.execute(handle, (bx.ptr, bw.ptr, outs[0].ptr), wsp)
    plan.close()


def test_no_leaks(handle):
    gc.collect()
    base = B.live_count()
    g, xshape, wshape, yshape = _small_forward(handle, HALF, "NHWC")
    cands = G.engine_configs(handle, g)
    kept, dropped = G.filter_candidates(cands, HALF, True, False)
    plan, _ = G.first_plan(handle, ordered(kept))
    bufs = [DevBuf(2 * int(np.prod(s)), 0) for s in (xshape, wshape, yshape)]
    ws = DevBuf(plan.workspace_size, fill=None) if plan.workspace_size else None
    plan.execute(handle, tuple(b.ptr for b in bufs), ws.ptr if ws else 0)
    sync()
    assert B.live_count() > base
    plan.close()
    for c in cands:
        c.close()
    g.close()
    assert B.live_count() == base, B.live_counts_by_type()
    # and through garbage collection alone
    g, *_ = _small_forward(handle, HALF, "NHWC")
    cands = G.engine_configs(handle, g, ("A",))
    plan, _ = G.first_plan(handle, ordered(cands))
    del g, cands, plan
    gc.collect()
    assert B.live_count() == base, B.live_counts_by_type()


def test_threads_share_a_plan(handle):
    g, xshape, wshape, yshape = _small_forward(handle, FLOAT, "NCHW", (2, 8, 8, 8), 8)
    cands = G.engine_configs(handle, g, ("A",))
    kept, _ = G.filter_candidates(cands, FLOAT, False, False)
    plan, _ = G.first_plan(handle, ordered(kept))
    plan.max_packs = 2  # force evictions while threads run
    rng = np.random.default_rng(9)
    w = rng.uniform(-1, 1, wshape).astype(np.float32)
    bw = DevBuf(w.nbytes).upload(w)
    errors, results = [], {}

    def work(i):
        try:
            h = _create_handle()
            x = np.random.default_rng(i).uniform(-1, 1, xshape).astype(np.float32)
            bx = DevBuf(x.nbytes).upload(x)
            outs = [DevBuf(4 * int(np.prod(yshape))) for _ in range(3)]
            ws = DevBuf(plan.workspace_size, fill=None) if plan.workspace_size else None
            for k in range(60):
                plan.execute(h, (bx.ptr, bw.ptr, outs[k % 3].ptr), ws.ptr if ws else 0)
            sync()
            ref = ref_forward(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1))
            for o in outs:
                got = o.download(np.float32, int(np.prod(yshape))).reshape(yshape)
                assert_close(got.astype(np.float64), ref, FLOAT, f"thread {i}")
            _lib.lib().cudnnDestroy(h)
            results[i] = True
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert len(results) == 4


@pytest.mark.gpu_exclusive  # host time against a 5 us margin: other processes' load skews it
def test_execute_host_cost(handle):
    """Host time of ExecutionPlan.execute on a tiny conv (1x8x8x8, eight 3x3 filters)."""
    report = {}
    L = _lib.lib()
    for label, dt, layout in (("f32-nchw", FLOAT, "NCHW"), ("f16-nhwc", HALF, "NHWC")):
        g, xshape, wshape, yshape = _small_forward(handle, dt, layout)
        cands = G.engine_configs(handle, g, ("A", "FALLBACK"))
        kept, _ = G.filter_candidates(cands, dt, True, False)
        plan, _ = G.first_plan(handle, ordered(kept))
        isz = 4 if dt == FLOAT else 2
        bx, bw = DevBuf(isz * int(np.prod(xshape)), 0), DevBuf(isz * int(np.prod(wshape)), 0)
        outs = [DevBuf(isz * int(np.prod(yshape)), 0) for _ in range(12)]
        ws = DevBuf(plan.workspace_size, fill=None) if plan.workspace_size else None
        wsp = ws.ptr if ws else 0
        ptrs = (bx.ptr, bw.ptr, outs[0].ptr)
        for _ in range(50):
            plan.execute(handle, ptrs, wsp)
        sync()

        def per_call(fn, n=300, reps=7):
            best = 1e9
            for _ in range(reps):
                sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                t = (time.perf_counter() - t0) / n
                best = min(best, t)
            sync()
            return best * 1e6

        vp = plan._packs[(ptrs, wsp)]
        raw = L.cudnnBackendExecute
        pp, vpp = plan._plan_ptr, vp.ptr
        r = {"plan": plan.tag, "raw_cudnnBackendExecute_us": per_call(lambda: raw(handle, pp, vpp)),
             "execute_hit_us": per_call(lambda: plan.execute(handle, ptrs, wsp))}
        many = [(bx.ptr, bw.ptr, o.ptr) for o in outs]
        it = itertools.cycle(many)
        plan.max_packs = 4  # 12 buffer sets cycling through 4 slots: every call misses
        r["execute_miss_us"] = per_call(lambda: plan.execute(handle, next(it), wsp))
        plan.max_packs = 8
        r["overhead_vs_raw_us"] = r["execute_hit_us"] - r["raw_cudnnBackendExecute_us"]
        report[label] = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
        try:
            import torch
            import torch.nn.functional as F

            tx = torch.zeros(xshape, device="cuda", dtype=torch.float32 if dt == FLOAT else torch.float16)
            tw = torch.zeros(wshape, device="cuda", dtype=tx.dtype)
            if layout == "NHWC":
                tx = tx.to(memory_format=torch.channels_last)
                tw = tw.to(memory_format=torch.channels_last)
            for _ in range(50):
                F.conv2d(tx, tw, padding=1)
            report[label]["torch_conv2d_us"] = round(per_call(lambda: F.conv2d(tx, tw, padding=1)), 2)
        except Exception as exc:  # torch is optional
            report[label]["torch"] = repr(exc)
    _REPORT["host_cost"] = report
    for r in report.values():
        assert r["execute_hit_us"] < r["raw_cudnnBackendExecute_us"] + 5.0, report


@pytest.mark.parametrize("direction", G.DIRECTIONS)
def test_every_candidate_computes_the_same(handle, direction):
    """Every precompiled candidate of modes A and FALLBACK (bf16 NHWC, a tensor-core friendly
    shape) finalizes or is refused cleanly, and each that runs matches the reference."""
    dt, layout = BF16, "NHWC"
    rng = np.random.default_rng(zlib.crc32(direction.encode()))
    N, C, K, H = 4, 32, 64, 14
    xshape, wshape, yshape = (N, C, H, H), (K, C, 3, 3), (N, K, H, H)
    xs, x64 = quantize(rng.uniform(-1, 1, xshape), dt)
    ws_, w64 = quantize(rng.uniform(-1, 1, wshape) / 12, dt)
    ys, y64 = quantize(rng.uniform(-1, 1, yshape) / 12, dt)
    specs = {n: G.TensorSpec(u, s, strides_for(s, layout), dt)
             for n, u, s in (("x", 1, xshape), ("w", 2, wshape), ("y", 3, yshape))}
    g = G.build_convolution_graph(handle, direction, specs["x"], specs["w"], specs["y"],
                                  1, 1, 1, FLOAT)
    bufs = {"x": DevBuf(xs.nbytes).upload(to_physical(xs, layout)),
            "w": DevBuf(ws_.nbytes).upload(to_physical(ws_, layout)),
            "y": DevBuf(ys.nbytes).upload(to_physical(ys, layout))}
    if direction == "forward":
        out_name, oshape, ref = "y", yshape, ref_forward(x64, w64, (1, 1), (1, 1), (1, 1))
    elif direction == "backward_data":
        out_name, oshape = "x", xshape
        ref = ref_backward_data(y64, w64, xshape, (1, 1), (1, 1), (1, 1))
    else:
        out_name, oshape = "w", wshape
        ref = ref_backward_filter(x64, y64, wshape, (1, 1), (1, 1), (1, 1))
    cands = G.engine_configs(handle, g, ("A", "FALLBACK"))
    kept, _ = G.filter_candidates(cands, dt, True, False)
    rows, ran = [], 0
    for c in kept[:24]:
        if c.runtime_compiled:
            rows.append((c.tag, "skipped: runtime compiled"))
            continue
        plan = G.ExecutionPlan(c)
        try:
            plan.finalize(handle)
        except CudnnError as exc:
            rows.append((c.tag, f"finalize: {exc.status_name}"))
            continue
        out = DevBuf(ys.nbytes if out_name == "y" else (xs.nbytes if out_name == "x" else ws_.nbytes))
        wsb = DevBuf(plan.workspace_size, fill=None) if plan.workspace_size else None
        ptrs = {n: (out.ptr if n == out_name else bufs[n].ptr) for n in g.specs}
        plan.execute(handle, ptrs, wsb.ptr if wsb else 0)
        sync()
        got = decode(from_physical(out.download(np.uint16, int(np.prod(oshape))), oshape, layout), dt)
        err = float(np.max(np.abs(got - ref)) / max(1.0, np.max(np.abs(ref))))
        rows.append((c.tag, f"ok err={err:.2e} ws={plan.workspace_size} "
                            f"fin={plan.finalize_time * 1e3:.2f}ms"))
        assert_close(got, ref, dt, f"{direction} candidate {c.tag}")
        ran += 1
        plan.close()
    _REPORT.setdefault("every_candidate", {})[direction] = rows
    assert ran >= 1, rows


def test_deterministic_filter_gives_reproducible_wgrad(handle):
    dt, layout = HALF, "NHWC"
    rng = np.random.default_rng(21)
    N, C, K, H = 8, 32, 32, 16
    xshape, wshape, yshape = (N, C, H, H), (K, C, 3, 3), (N, K, H, H)
    xs, _ = quantize(rng.uniform(-1, 1, xshape), dt)
    ys, _ = quantize(rng.uniform(-1, 1, yshape), dt)
    specs = [G.TensorSpec(u, s, strides_for(s, layout), dt)
             for u, s in ((1, xshape), (2, wshape), (3, yshape))]
    g = G.build_convolution_graph(handle, "backward_filter", *specs, 1, 1, 1)
    cands = G.engine_configs(handle, g, ("A", "FALLBACK"))
    kept, dropped = G.filter_candidates(cands, dt, True, deterministic=True)
    assert all(not c.nondeterministic for c in kept)
    assert all("NONDETERMINISTIC" in r or "DOWN_CONVERT" in r for _, r in dropped)
    plan, _ = G.first_plan(handle, ordered(kept))
    bx = DevBuf(xs.nbytes).upload(to_physical(xs, layout))
    by = DevBuf(ys.nbytes).upload(to_physical(ys, layout))
    wsb = DevBuf(plan.workspace_size, fill=None) if plan.workspace_size else None
    results = []
    for _ in range(3):
        out = DevBuf(2 * int(np.prod(wshape)))
        plan.execute(handle, (bx.ptr, out.ptr, by.ptr), wsb.ptr if wsb else 0)
        sync()
        results.append(out.download(np.float16, int(np.prod(wshape))))
    assert all(np.array_equal(results[0], r) for r in results[1:])
    _REPORT["deterministic_wgrad"] = (plan.tag, len(kept), len(dropped),
                                      sum(1 for c in cands if c.nondeterministic))
