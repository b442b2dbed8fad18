"""Reliability under load, memory pressure and threads (GPU).

* Resource hygiene: many convolution calls of mixed shapes (PYCUDNN_HYGIENE_CALLS, default
  20,000; 100,000 for a long soak) leave the live legacy descriptors, backend descriptors
  and handles flat after warm-up, and the process's RSS and the device memory in use within a
  bound; the benchmark caches are bounded; a thread that ends returns its handle to the pool.
* Memory pressure: with the GPU filled until ~300 MB are free, heuristic and benchmark calls on
  both engines still succeed with correct results; with almost nothing free the error is
  OutOfMemoryError naming the bytes, and the next call after the memory is freed succeeds.
* Concurrency: 16 threads x PYCUDNN_CONCURRENCY_CALLS (default 200; 1,000 for a long soak)
  calls of mixed shapes, dtypes and directions on their own streams and on one shared stream,
  against precomputed float64 references: zero wrong results; and with the caches cold, threads
  racing to search the same keys run one search per key.

The measured figures are printed in pytest's terminal summary ("pycudnn reliability figures"),
kept in pytest's cache (``pycudnn/reliability``) and written to ``$PYCUDNN_RELIABILITY_REPORT``
(JSON) when set, for docs/reliability.md.

Some tests here need no GPU (the cache's own bound and order): they carry no ``gpu`` mark.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import random
import threading
import time

import numpy as np
import pytest

import reference as R

gpu = pytest.mark.gpu

HYGIENE_CALLS = int(os.environ.get("PYCUDNN_HYGIENE_CALLS", "20000"))
THREAD_CALLS = int(os.environ.get("PYCUDNN_CONCURRENCY_CALLS", "200"))
THREADS = 16
MiB = 1 << 20

# ---- the figures ---------------------------------------------------------------------------------------

FIGURES: dict[str, object] = {}


class _FiguresPlugin:
    def summary_lines(self) -> list[str]:
        """Folded into the run's one summary block by conftest.py."""
        return [f"reliability: {k}: {v}" for k, v in FIGURES.items()]

    def pytest_terminal_summary(self, terminalreporter, config) -> None:
        if not FIGURES:
            return
        try:
            config.cache.set("pycudnn/reliability", FIGURES)
        except Exception:
            pass
        target = os.environ.get("PYCUDNN_RELIABILITY_REPORT")
        if target:
            with open(target, "w") as f:
                json.dump(FIGURES, f, indent=1, default=str)


@pytest.fixture(scope="module", autouse=True)
def _figures(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("pycudnn-reliability-figures"):
        pm.register(_FiguresPlugin(), "pycudnn-reliability-figures")
    yield FIGURES


def figure(name: str, value) -> None:
    FIGURES[name] = value
    print(f"{name}: {value}")


# ---- helpers ----------------------------------------------------------------------------------------------

def _modules():
    from pycudnn.search import cache
    from pycudnn.ffi import backend
    from pycudnn.cudnn import descriptors
    from pycudnn.runtime import handle, memory

    return cache, backend, descriptors, handle, memory


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settle() -> None:
    """Wait for the device, collect garbage (finalizers free buffers), return pooled memory."""
    _, _, _, _, M = _modules()
    M.synchronize()
    gc.collect()
    gc.collect()
    M.synchronize()
    M.empty_cache()


def device_used() -> int:
    """Device memory pycudnn holds on device 0 (`memory_in_use`: its pool's used bytes), which
    other processes sharing the GPU do not change, unlike the device's free memory."""
    _, _, _, _, M = _modules()
    return M.memory_in_use(0)


def cached_entries() -> int:
    """Entries of pycudnn's per-process tables that grow with new problems (the search caches
    and the prepared fast paths): flat once every problem has run."""
    from pycudnn.api import prepared

    algos = _modules()[0]
    return sum(len(c) for c in algos.caches.values()) + len(prepared.remembered_calls())


def live_counts() -> dict[str, int]:
    _, backend, descriptors, handle, _ = _modules()
    return {"legacy descriptors": descriptors.live_descriptor_count(),
            "backend descriptors": backend.live_count(),
            "handles": handle.live_handle_count(), "cached entries": cached_entries()}


def rel_error(got, ref) -> float:
    got = np.asarray(got, np.float64)
    if ref.size == 0:
        return 0.0
    return float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()), 1e-6)


def _round(a, dtype):
    from pycudnn._types import normalize_dtype

    return np.asarray(a, np.float32).astype(normalize_dtype(dtype)).astype(np.float64)


TOL = {"float64": 1e-9, "float32": 3e-5, "float16": 1e-2, "bfloat16": 6e-2}


@dataclasses.dataclass
class Problem:
    """One convolution with device inputs uploaded once and its float64 reference."""

    name: str
    fn: str
    dtype: str
    engine: str
    args: tuple
    kwargs: dict
    ref: np.ndarray
    tol: float

    def __call__(self, stream=None, **extra):
        import pycudnn

        f = {"convolution": pycudnn.convolution, "conv_transpose": pycudnn.conv_transpose,
             "backward_data": pycudnn.convolution_backward_data,
             "backward_filter": pycudnn.convolution_backward_filter,
             "add_relu": pycudnn.convolution_add_relu}[self.fn]
        return f(*self.args, stream=stream, engine=self.engine, **self.kwargs, **extra)


def make_problems(seed: int = 0, fused: bool = True, engines=("graph", "v7")) -> list[Problem]:
    """Mixed shapes (1-D to 3-D), dtypes, layouts, directions and engines."""
    import pycudnn

    rng = np.random.default_rng(seed)
    specs = [
        # name, fn, dtype, x shape, w shape, geometry, memory format
        ("fwd2d-f32", "convolution", "float32", (2, 8, 12, 12), (16, 8, 3, 3), dict(padding=1), "contiguous"),
        ("fwd2d-f16-nhwc", "convolution", "float16", (2, 16, 10, 10), (16, 16, 3, 3), dict(padding=1, stride=2), "channels_last"),
        ("fwd1d-bf16", "convolution", "bfloat16", (3, 8, 20), (8, 4, 5), dict(padding=2, groups=2), "contiguous"),
        ("fwd3d-f32", "convolution", "float32", (1, 4, 6, 6, 6), (8, 4, 3, 3, 3), dict(padding=1), "contiguous"),
        ("fwd2d-f64-dil", "convolution", "float64", (2, 4, 9, 9), (4, 4, 3, 3), dict(dilation=2, padding=2), "contiguous"),
        ("bwd-data2d-f32", "backward_data", "float32", (2, 8, 12, 12), (16, 8, 3, 3), dict(padding=1), "contiguous"),
        ("bwd-data2d-f16-nhwc", "backward_data", "float16", (2, 16, 8, 8), (16, 16, 3, 3), dict(padding=1), "channels_last"),
        ("bwd-filter2d-f32", "backward_filter", "float32", (2, 8, 12, 12), (16, 8, 3, 3), dict(padding=1), "contiguous"),
        ("bwd-filter2d-bf16-nhwc", "backward_filter", "bfloat16", (2, 16, 8, 8), (16, 16, 3, 3), dict(padding=1), "channels_last"),
        ("transpose2d-f32", "conv_transpose", "float32", (2, 8, 6, 6), (8, 4, 3, 3), dict(stride=2, padding=1, output_padding=1), "contiguous"),
    ]
    if fused:
        specs += [
            ("fwd2d-f32-bias-relu", "convolution", "float32", (2, 8, 12, 12), (16, 8, 3, 3), dict(padding=1, activation="relu"), "contiguous"),
            ("add-relu2d-f16-nhwc", "add_relu", "float16", (2, 16, 8, 8), (16, 16, 3, 3), dict(padding=1, alpha=0.5), "channels_last"),
        ]
    problems = []
    for engine in engines:
        for name, fn, dtype, xs, ws, geo, fmt in specs:
            nd = len(xs) - 2
            t = lambda v: (v,) * nd if isinstance(v, int) else v  # noqa: E731
            stride, padding = t(geo.get("stride", 1)), t(geo.get("padding", 0))
            dilation, groups = t(geo.get("dilation", 1)), geo.get("groups", 1)
            x = _round(rng.standard_normal(xs), dtype)
            w = _round(rng.standard_normal(ws), dtype)
            dev = lambda a: pycudnn.from_numpy(a.astype(np.float32) if dtype != "float64" else a,  # noqa: E731
                                               dtype=dtype, memory_format=fmt if a.ndim in (4, 5) else "contiguous")
            kw = {k: v for k, v in geo.items() if k != "alpha"}
            kw["allow_tf32"] = False
            tol = TOL[dtype] * (2 if fn in ("backward_filter", "add_relu") else 1)
            if fn == "convolution":
                y = R.conv_forward(x, w, stride, padding, dilation, groups)
                args = (dev(x), dev(w))
                if geo.get("activation") == "relu":
                    b = _round(rng.standard_normal(ws[0]), dtype)
                    args = args + (dev(b),)
                    y = np.maximum(y + b.reshape((1, -1) + (1,) * nd), 0)
            elif fn == "add_relu":
                y0 = R.conv_forward(x, w, stride, padding, dilation, groups)
                z = _round(rng.standard_normal(y0.shape), dtype)
                args = (dev(x), dev(w), dev(z))
                kw["alpha"] = geo["alpha"]
                y = np.maximum(y0 + geo["alpha"] * z, 0)
            elif fn == "backward_data":
                dy_shape = (xs[0], ws[0]) + tuple(R.out_shape(xs[2:], ws[2:], stride, padding, dilation))
                dy = _round(rng.standard_normal(dy_shape), dtype)
                args = (dev(dy), dev(w), xs)
                y = R.conv_backward_data(dy, w, xs, stride, padding, dilation, groups)
            elif fn == "backward_filter":
                dy_shape = (xs[0], ws[0]) + tuple(R.out_shape(xs[2:], ws[2:], stride, padding, dilation))
                dy = _round(rng.standard_normal(dy_shape), dtype)
                args = (dev(x), dev(dy), ws)
                y = R.conv_backward_filter(x, dy, ws, stride, padding, dilation, groups)
            else:
                op = t(geo.get("output_padding", 0))
                args = (dev(x), dev(w))
                y = R.conv_transpose(x, w, stride, padding, op, dilation, groups)
            problems.append(Problem(f"{name}-{engine}", fn, dtype, engine, args, kw, y, tol))
    return problems


def check(problem: Problem, y, stream=None) -> float:
    err = rel_error(y.numpy(stream=stream), problem.ref)
    assert err <= problem.tol, f"{problem.name}: error {err:.3g} > {problem.tol}"
    return err


# ---- the cache's bound and order (no GPU needed) ----------------------------------------------------------

def test_benchmark_cache_honours_its_bound():
    from pycudnn.search.cache import BenchmarkCache

    cache = BenchmarkCache("forward", maxsize=3)
    for k in range(10):
        cache.insert(("key", k), k)
        assert len(cache) <= 3
    assert [k for k, _ in cache.items()] == [("key", 7), ("key", 8), ("key", 9)]


def test_benchmark_cache_is_least_recently_used():
    from pycudnn.search.cache import BenchmarkCache

    cache = BenchmarkCache("forward", maxsize=3)
    for k in "abc":
        cache.insert(k, k)
    assert cache.get("a") == "a"  # 'a' is now the most recently used
    cache.insert("d", "d")
    assert cache.get("a") == "a", "the entry just used was evicted (FIFO, not LRU)"
    assert cache.get("b") is None
    cache.set_maxsize(1)  # lowering the bound evicts now, least recently used first
    assert len(cache) == 1 and cache.get("a") == "a"


def test_set_cache_limit_bounds_every_cache():
    import pycudnn
    from pycudnn.search.cache import caches
    from pycudnn.api import prepared

    try:
        pycudnn.set_cache_limit(2)
        assert all(c.maxsize == 2 for c in caches.values())
        assert prepared.FAST_CALLS_MAX == 2
        with pytest.raises(ValueError, match="entries"):
            pycudnn.set_cache_limit(0)
    finally:
        pycudnn.set_cache_limit(None)
        for c in caches.values():
            c.set_maxsize(4096)


# ---- resource hygiene ---------------------------------------------------------------------------------------

@gpu
def test_memory_in_use_counts_pycudnns_allocations_of_both_kinds():
    """The seam the hygiene tests read: cuda.core buffers and the hot path's allocations both
    come from the pool `memory_in_use` reads, and a free gives the bytes back."""
    from pycudnn.runtime import memory as M

    settle()
    base = M.memory_in_use(0)
    a = M.allocate(64 * MiB, 0)
    b = M.allocate_fast(32 * MiB, 0, 0)
    M.synchronize()
    held = M.memory_in_use(0) - base
    a.close()
    b.close()
    settle()
    after = M.memory_in_use(0) - base
    figure("memory_in_use: 96 MiB held -> after the frees (MiB)",
           f"{held / MiB:.1f} -> {after / MiB:.1f}")
    assert 96 * MiB <= held <= 100 * MiB
    assert after <= 1 * MiB


@gpu
def test_many_calls_leave_resources_flat():
    """HYGIENE_CALLS calls cycling through mixed problems (half with out=, half allocating):
    live descriptors, handles and cached entries exactly flat after warm-up, backend descriptors
    within the variant-pack LRU bound, pycudnn's device memory within a bound. Only pycudnn's
    own bookkeeping is asserted (another process may share the GPU); RSS is a figure."""
    import pycudnn

    problems = make_problems(seed=1)
    outs = {}
    with pycudnn.flags(tuning_db=False):
        for rep in range(4):  # warm-up: search, plans, prepared fast paths, pools
            for p in problems:
                y = p()
                if rep == 0:
                    check(p, y)
                outs[p.name] = pycudnn.empty(y.shape, y.dtype, memory_format=y.memory_format)
                p(out=outs[p.name])
        settle()
        base_counts, base_rss, base_dev = live_counts(), rss_bytes(), device_used()
        samples = []
        t0 = time.perf_counter()
        n = len(problems)
        step = max(HYGIENE_CALLS // 10, 1)
        for i in range(HYGIENE_CALLS):
            p = problems[i % n]
            if (i // n) % 2:
                p(out=outs[p.name])
            else:
                p()
            if (i + 1) % step == 0:
                settle()
                samples.append((i + 1, live_counts(), rss_bytes(), device_used()))
        elapsed = time.perf_counter() - t0
        for p in problems:  # still right at the end
            check(p, p())
    settle()
    end_counts, end_rss, end_dev = live_counts(), rss_bytes(), device_used()
    backend_slack = 8 * n  # each plan keeps at most 8 variant packs (ExecutionPlan.max_packs)
    figure("hygiene: calls", HYGIENE_CALLS)
    figure("hygiene: host time per call (us)", round(elapsed / HYGIENE_CALLS * 1e6, 1))
    figure("hygiene: live counts after warm-up -> end", f"{base_counts} -> {end_counts}")
    figure("hygiene: RSS growth (MiB)", round((end_rss - base_rss) / MiB, 2))
    figure("hygiene: pycudnn's device memory growth (MiB, after empty_cache)",
           round((end_dev - base_dev) / MiB, 2))
    trend = [(i, c["legacy descriptors"], c["backend descriptors"], c["handles"],
              round((r - base_rss) / MiB, 1), round((d - base_dev) / MiB, 1)) for i, c, r, d in samples]
    figure("hygiene: samples (call, legacy, backend, handles, +RSS MiB, +device MiB)", trend)
    for _, c, _, _ in samples:
        assert c["legacy descriptors"] == base_counts["legacy descriptors"], trend
        assert c["handles"] == base_counts["handles"], trend
        assert c["cached entries"] <= base_counts["cached entries"] + n, trend  # no growth per call
        assert c["backend descriptors"] <= base_counts["backend descriptors"] + backend_slack, trend
    assert end_dev - base_dev <= 64 * MiB, trend


def device_memory_taken() -> int:
    """Device memory taken on device 0 by every process (total less free): for a check that
    must see memory the pool's own counters miss, run alone (``gpu_exclusive``)."""
    _, _, _, _, M = _modules()
    free, total = M.mem_get_info(0)
    return total - free


@gpu
@pytest.mark.gpu_exclusive  # reads the device's free memory, which other processes change
def test_short_lived_streams_leave_device_memory_flat():
    """Calls on many streams that are then destroyed: the per-(thread, device, stream) workspace
    the prepared fast path keeps (memory.workspaces.thread_workspace) must not outlive its stream."""
    import pycudnn
    from cuda.bindings import runtime as rt

    # a problem whose chosen plan needs a workspace (else there is nothing to keep)
    candidates = [((8, 64, 28, 28), (64, 64, 3, 3)), ((4, 32, 16, 16, 16), (32, 32, 3, 3, 3)),
                  ((16, 128, 14, 14), (128, 128, 3, 3)), ((8, 256, 7, 7), (512, 256, 3, 3))]
    chosen = None
    rng = np.random.default_rng(2)
    for xs, ws in candidates:
        x = pycudnn.from_numpy(rng.standard_normal(xs).astype(np.float32))
        w = pycudnn.from_numpy(rng.standard_normal(ws).astype(np.float32))
        pycudnn.convolution(x, w, padding=1, engine="graph", tuning_db=False)
        rows = [r for r in pycudnn.benchmark_cache()
                if r["engine"] == "graph" and r["params"].input_shape == tuple(xs)]
        ws_bytes = max((r["workspace"] or 0 for r in rows), default=0)
        if ws_bytes:
            chosen = (x, w, 1, ws_bytes)
            break
    if chosen is None:
        pytest.skip("no candidate problem got a plan with a workspace on this GPU")
    x, w, pad, ws_bytes = chosen
    pycudnn.convolution(x, w, padding=pad, engine="graph")

    def many_streams(work) -> None:
        streams = []
        for _ in range(64):
            err, s = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
            assert not int(err)
            streams.append(s)
            work(int(s))
        for s in streams:
            rt.cudaStreamSynchronize(s)
            rt.cudaStreamDestroy(s)

    # The driver itself keeps ~36 MiB after the first 64 streams come and go (measured on the
    # H200, no pycudnn call involved) and reuses it afterwards: pay that before measuring.
    many_streams(lambda s: None)
    settle()
    before = device_memory_taken()
    many_streams(lambda s: [pycudnn.convolution(x, w, padding=pad, engine="graph", stream=s)
                            for _ in range(2)])
    settle()
    growth = device_memory_taken() - before
    figure("streams: pycudnn's device memory kept after 64 destroyed streams (MiB)",
           round(growth / MiB, 2))
    figure("streams: plan workspace (MiB)", round(ws_bytes / MiB, 2))
    assert growth <= 16 * MiB, (f"{growth / MiB:.1f} MiB still held after the 64 streams were "
                                f"destroyed (workspace {ws_bytes / MiB:.2f} MiB per stream)")


@gpu
def test_benchmark_cache_bound_evicts_and_searches_again():
    import pycudnn
    from pycudnn.search.cache import caches

    cache = caches["forward"]
    old = cache.maxsize
    rng = np.random.default_rng(4)
    w = pycudnn.from_numpy(rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
    xs = [pycudnn.from_numpy(rng.standard_normal((1, 4, 6 + i, 6)).astype(np.float32)) for i in range(10)]
    pycudnn.clear_caches()
    try:
        cache.maxsize = 4
        for x in xs:
            pycudnn.convolution(x, w, tuning_db=False)
        assert len(cache) == 4
        kept = sorted(p.input_shape[2] for p, _ in cache.items())
        assert kept == [12, 13, 14, 15], kept
        before = cache.searches
        # a flags() block changes the call signature, so the prepared fast path (which keeps its
        # own map of up to prepared.FAST_CALLS_MAX choices) does not answer for the cache
        with pycudnn.flags(deterministic=False):
            pycudnn.convolution(xs[0], w, tuning_db=False)
        assert cache.searches == before + 1, "an evicted key must be searched again"
        assert len(cache) == 4
    finally:
        cache.maxsize = old
        pycudnn.clear_caches()
    figure("caches: bound", "BenchmarkCache.maxsize (attribute; default 4096 per direction)")


@gpu
def test_thread_that_ends_returns_its_handle():
    import pycudnn
    from pycudnn.runtime import handle as H

    p = make_problems(seed=5, fused=False, engines=("graph",))[0]
    errors = []

    def work():
        try:
            check(p, p())
            assert H.thread_handle_count() == 1
        except BaseException as exc:
            errors.append(exc)

    def run_thread():
        t = threading.Thread(target=work)
        t.start()
        t.join()
        for _ in range(200):
            gc.collect()
            if H.pooled_handle_count(0) >= 1:
                break
            time.sleep(0.01)

    run_thread()  # a first thread: makes (or reuses) a handle and returns it
    assert not errors, errors
    pooled, live = H.pooled_handle_count(0), H.live_handle_count(0)
    assert pooled >= 1, "the ended thread's handle did not return to the pool"
    settle()
    dev0 = device_used()
    for _ in range(16):  # sequential threads reuse the pooled handle: none is created
        run_thread()
    assert not errors, errors
    settle()
    assert H.live_handle_count(0) == live, "threads created handles instead of reusing the pool"
    assert H.pooled_handle_count(0) == pooled
    growth = device_used() - dev0
    figure("threads: handles created by 16 sequential threads", H.live_handle_count(0) - live)
    figure("threads: pycudnn's device memory kept by 16 ended threads (MiB)", round(growth / MiB, 2))
    assert growth <= 16 * MiB, f"ended threads left {growth / MiB:.1f} MiB behind (per-thread workspaces?)"


# ---- memory pressure --------------------------------------------------------------------------------------------

class Filler:
    """Device memory taken with cudaMalloc (outside pycudnn's pools) until ``free`` bytes remain."""

    def __init__(self) -> None:
        self.ptrs: list[int] = []

    def fill_to(self, target_free: int) -> int:
        from cuda.bindings import runtime as rt

        _, _, _, _, M = _modules()
        settle()
        chunk = 8 << 30
        free = M.mem_get_info(0)[0]
        while free > target_free and chunk >= 1 << 20:
            size = min(chunk, free - target_free)
            if size < 1 << 20:
                break
            err, ptr = rt.cudaMalloc(size)
            if int(err):
                rt.cudaGetLastError()
                chunk //= 2
                continue
            self.ptrs.append(int(ptr))
            free = M.mem_get_info(0)[0]
            chunk = min(chunk, max(free - target_free, 1 << 20))
        return free

    def release(self) -> None:
        from cuda.bindings import runtime as rt

        while self.ptrs:
            rt.cudaFree(self.ptrs.pop())
        settle()


@pytest.fixture
def filler():
    f = Filler()
    yield f
    f.release()


def _pressure_problems():
    import pycudnn

    rng = np.random.default_rng(6)
    xs, ws = (8, 64, 32, 32), (64, 64, 3, 3)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    dy = rng.standard_normal((8, 64, 32, 32)).astype(np.float32)
    geo = ((1, 1), (1, 1), (1, 1), 1)
    refs = {"forward": R.conv_forward(x, w, *geo), "backward_data": R.conv_backward_data(dy, w, xs, *geo),
            "backward_filter": R.conv_backward_filter(x, dy, ws, *geo)}
    X, W, DY = (pycudnn.from_numpy(a) for a in (x, w, dy))
    calls = {"forward": lambda **kw: pycudnn.convolution(X, W, padding=1, **kw),
             "backward_data": lambda **kw: pycudnn.convolution_backward_data(DY, W, xs, padding=1, **kw),
             "backward_filter": lambda **kw: pycudnn.convolution_backward_filter(X, DY, ws, padding=1, **kw)}
    return calls, refs, (X, W, DY)


@gpu
@pytest.mark.gpu_exclusive  # fills the device: another process would run out
def test_calls_succeed_with_300_mb_free(filler):
    """Heuristics and benchmark on both engines, searched afresh while only ~300 MB are free."""
    import pycudnn

    calls, refs, _ = _pressure_problems()
    for direction, call in calls.items():  # load the kernels before memory is short
        call(allow_tf32=False, tuning_db=False)
    pycudnn.clear_caches()
    free = filler.fill_to(300 * MiB)
    figure("pressure: free while filled (MiB)", round(free / MiB))
    assert free <= 400 * MiB, f"could not fill the device ({free / MiB:.0f} MiB still free)"
    results = {}
    for engine in ("graph", "v7"):
        for benchmark in (False, True):
            for direction, call in calls.items():
                y = call(engine=engine, benchmark=benchmark, allow_tf32=False, tuning_db=False,
                         benchmark_limit=8)
                err = rel_error(y.numpy(), refs[direction])
                results[f"{engine}/{'benchmark' if benchmark else 'heuristics'}/{direction}"] = err
                assert err <= 5e-4, f"{engine} benchmark={benchmark} {direction}: error {err:.3g}"
                del y
    chosen = {row["params"].direction + "/" + row["engine"]: row["workspace"] for row in pycudnn.benchmark_cache()}
    figure("pressure: workspaces chosen at ~300 MB free (bytes)", chosen)
    figure("pressure: max relative error at ~300 MB free", f"{max(results.values()):.2g}")


@gpu
@pytest.mark.gpu_exclusive  # fills the device: another process would run out
def test_out_of_memory_names_sizes_and_recovers(filler):
    import pycudnn

    calls, refs, (X, W, DY) = _pressure_problems()
    big_x = pycudnn.from_numpy(np.ones((64, 64, 64, 64), np.float32))  # 64 MiB; output 64 MiB
    out = pycudnn.empty((8, 64, 32, 32))
    for engine in ("graph", "v7"):
        pycudnn.convolution(big_x, W, padding=1, engine=engine, tuning_db=False)
        calls["forward"](engine=engine, out=out, allow_tf32=False, tuning_db=False)
    free = filler.fill_to(4 * MiB)
    figure("pressure: free while nearly full (MiB)", round(free / MiB, 1))
    outcomes = {}
    try:
        for engine in ("graph", "v7"):
            with pytest.raises(pycudnn.OutOfMemoryError) as info:
                pycudnn.convolution(big_x, W, padding=1, engine=engine, tuning_db=False)
            msg = str(info.value)
            assert str(64 * 64 * 64 * 64 * 4) in msg and "bytes" in msg, msg
            outcomes[f"{engine}: 64 MiB output"] = msg.split("\n")[0][:160]
            # with out= given, only workspaces are needed: a zero-workspace algorithm must run,
            # or the error must still be OutOfMemoryError naming the bytes
            pycudnn.clear_caches()
            try:
                y = calls["forward"](engine=engine, out=out, allow_tf32=False, tuning_db=False)
                assert rel_error(y.numpy(), refs["forward"]) <= 5e-4
                outcomes[f"{engine}: out= given, cache cold"] = "ran (small-workspace algorithm)"
            except pycudnn.OutOfMemoryError as exc:
                assert "bytes" in str(exc), exc
                outcomes[f"{engine}: out= given, cache cold"] = str(exc).split("\n")[0][:160]
    finally:
        filler.release()
    figure("pressure: nearly full outcomes", outcomes)
    for engine in ("graph", "v7"):  # the next call after freeing succeeds
        y = pycudnn.convolution(big_x, W, padding=1, engine=engine, tuning_db=False)
        assert y.shape == (64, 64, 64, 64)
        for direction, call in calls.items():
            assert rel_error(call(engine=engine, allow_tf32=False, tuning_db=False).numpy(),
                             refs[direction]) <= 5e-4


# ---- concurrency ------------------------------------------------------------------------------------------------

def _streams(n: int) -> list[int]:
    from cuda.bindings import runtime as rt

    out = []
    for _ in range(n):
        err, s = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
        assert not int(err), err
        out.append(int(s))
    return out


def _destroy(streams) -> None:
    from cuda.bindings import runtime as rt

    for s in streams:
        rt.cudaStreamSynchronize(s)
        rt.cudaStreamDestroy(s)


def _hammer(problems, streams, calls, barrier=None, seed=0):
    """THREADS threads, each ``calls`` calls of random problems on its stream; every result
    checked against its float64 reference."""
    import pycudnn

    wrong, errors, done = [], [], [0] * THREADS

    def worker(tid):
        rng = random.Random(seed * 1000 + tid)
        stream = streams[tid % len(streams)]
        try:
            with pycudnn.flags(tuning_db=False):
                if barrier is not None:
                    barrier.wait()
                for _ in range(calls):
                    p = problems[rng.randrange(len(problems))]
                    y = p(stream=stream)
                    err = rel_error(y.numpy(stream=stream), p.ref)
                    if err > p.tol:
                        wrong.append((p.name, tid, err))
                    done[tid] += 1
        except BaseException as exc:  # reported in the main thread
            errors.append((tid, repr(exc)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wrong, errors, sum(done), time.perf_counter() - t0


@gpu
@pytest.mark.parametrize("mode", ["own streams", "shared stream"])
def test_threads_get_right_results(mode):
    import pycudnn

    problems = make_problems(seed=7)
    with pycudnn.flags(tuning_db=False):
        for p in problems:  # warm: this test is about running concurrently; the next about searching
            check(p, p())
    streams = _streams(THREADS if mode == "own streams" else 1)
    try:
        wrong, errors, n, elapsed = _hammer(problems, streams, THREAD_CALLS, seed=1)
    finally:
        gc.collect()
        _destroy(streams)
    figure(f"concurrency ({mode}): calls, wrong results, errors",
           f"{n} calls by {THREADS} threads in {elapsed:.1f} s: {len(wrong)} wrong, {len(errors)} errors")
    assert not errors, errors[:5]
    assert not wrong, wrong[:10]
    assert n == THREADS * THREAD_CALLS


@gpu
@pytest.mark.parametrize("measure", [False, True])  # not "benchmark": pytest-benchmark owns that name
def test_cold_cache_threads_search_each_key_once(measure):
    """The caches cold; 16 threads released at once on the same keys (plain convolutions in every
    direction, both engines): one search per key, and every result right."""
    import pycudnn
    from pycudnn.search.cache import caches

    problems = make_problems(seed=8, fused=False)
    extra = {"benchmark": measure, "benchmark_limit": 3}
    for p in problems:
        p.kwargs.update(extra)
    pycudnn.clear_caches()
    before = {d: c.searches for d, c in caches.items()}
    streams = _streams(THREADS)
    try:
        wrong, errors, n, elapsed = _hammer(problems, streams, 3 * len(problems),
                                            barrier=threading.Barrier(THREADS), seed=2)
    finally:
        gc.collect()
        _destroy(streams)
    assert not errors, errors[:5]
    assert not wrong, wrong[:10]
    searches = {d: caches[d].searches - before[d] for d in caches}
    keys = {d: len(caches[d]) for d in caches}
    figure(f"cold cache (benchmark={measure}): searches vs keys per direction",
           f"{searches} vs {keys} over {n} calls in {elapsed:.1f} s")
    assert searches == keys, f"searches {searches} != distinct keys {keys}"
    expected = {"forward": 0, "backward_data": 0, "backward_filter": 0}
    for p in problems:
        expected["backward_data" if p.fn in ("backward_data", "conv_transpose")
                 else p.fn if p.fn == "backward_filter" else "forward"] += 1
    assert keys == expected, f"keys {keys} != problems per direction {expected}"
