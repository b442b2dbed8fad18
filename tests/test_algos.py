"""CPU tests of the search contract: the cache key, the caches and the iterator's fallback order.

The strategies here are scripted stand-ins for an engine (they decide which candidate fails and
how); the iterator, cache and key under test are pycudnn's real ones.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from pycudnn.api.caches import benchmark_cache, clear_caches
from pycudnn.engines import v7
from pycudnn.engines.contract import check_precision
from pycudnn.engines.v7 import AlgoRecord
from pycudnn.search.cache import BenchmarkCache, caches
from pycudnn.search.iterate import try_all
from pycudnn.engines.problem import ConvolutionArgs, ConvolutionParams
from pycudnn.ffi import library
from scripted_engine import ScriptedEngine
from pycudnn.errors import (CudnnBadParamError, CudnnNotSupportedError, NoAlgorithmError,
                            OutOfMemoryError, PycudnnError)


def make_params(**over) -> ConvolutionParams:
    base = dict(direction="forward", device=0, cudnn_version=91900, dtype="float32",
                input_shape=(2, 4, 8, 8), input_strides=(256, 64, 8, 1),
                weight_shape=(8, 4, 3, 3), weight_format="NCHW",
                output_shape=(2, 8, 8, 8), output_strides=(512, 64, 8, 1),
                padding=(1, 1), stride=(1, 1), dilation=(1, 1), groups=1,
                deterministic=False, allow_tf32=True, workspace_limit=None, engine="v7")
    base.update(over)
    return ConvolutionParams(**base)


# ---- the key ------------------------------------------------------------------------------------

def test_params_equal_and_hash_equal():
    a, b = make_params(), make_params()
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1


@pytest.mark.parametrize("field,value", [
    ("device", 1), ("cudnn_version", 92800), ("dtype", "float16"),
    ("input_shape", (2, 4, 8, 9)), ("input_strides", (256, 1, 32, 4)),
    ("weight_shape", (8, 4, 1, 1)), ("weight_format", "NHWC"),
    ("output_strides", (512, 1, 64, 8)), ("padding", (0, 1)), ("stride", (2, 1)),
    ("dilation", (1, 2)), ("groups", 2), ("deterministic", True), ("allow_tf32", False),
    ("workspace_limit", 1 << 20), ("engine", "graph"), ("epilogue", "add_relu"),
    ("direction", "backward_data"), ("alpha", 0.5),
])
def test_every_field_changes_the_key(field, value):
    # CuPy's key left out dilation and groups; PaddlePaddle shipped the same bug.
    a = make_params()
    b = dataclasses.replace(a, **{field: value})
    assert a != b
    assert hash(a) != hash(b) or a != b  # distinct keys even if the hashes collided
    cache = BenchmarkCache("forward")
    cache.insert(a, "A")
    assert cache.get(b) is None


def test_params_are_immutable():
    p = make_params()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.groups = 2  # type: ignore[misc]


# ---- scripted strategy ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Rec:
    name: str
    workspace: int = 0

    def describe(self) -> str:
        return f"rec {self.name} ({self.workspace} B)"


class Scripted(ScriptedEngine):
    """Candidates in a fixed order; ``fail`` maps a candidate name to the exception it raises."""

    name = "scripted"

    def __init__(self, candidates, fail=None, default=None, delay=0.0):
        self._candidates = list(candidates)
        self.fail = dict(fail or {})
        self.default = default or [Rec("default")]
        self.ran: list[str] = []
        self.searches = 0
        self.delay = delay
        self.lock = threading.Lock()

    def candidates(self, args):
        with self.lock:
            self.searches += 1
        time.sleep(self.delay)
        return list(self._candidates)

    def default_candidates(self, args):
        return list(self.default)

    def run(self, args, record):
        with self.lock:
            self.ran.append(record.name)
        exc = self.fail.get(record.name)
        if exc is not None:
            raise exc


def args_for(params, benchmark=False):
    return ConvolutionArgs(params=params, handle=0, stream=0, x=0, w=0, y=0, benchmark=benchmark)


def oom():
    return OutOfMemoryError("out of memory (injected)")


def bad():
    return CudnnBadParamError(2000, "cudnnConvolutionForward", "CUDNN_STATUS_BAD_PARAM", "injected")


def test_first_success_is_cached_and_tried_first_next_time():
    s = Scripted([Rec("a"), Rec("b")])
    cache = BenchmarkCache("forward")
    p = make_params()
    assert try_all(args_for(p), s, cache).name == "a"
    assert cache.get(p) == Rec("a")
    s.ran.clear()
    assert try_all(args_for(p), s, cache).name == "a"
    assert s.ran == ["a"] and s.searches == 1  # cache hit: no second search


def test_candidate_failing_with_cudnn_error_falls_to_next():
    s = Scripted([Rec("a"), Rec("b"), Rec("c")], fail={"a": bad(), "b": CudnnNotSupportedError(3000, "f")})
    cache = BenchmarkCache("forward")
    assert try_all(args_for(make_params()), s, cache).name == "c"
    assert s.ran == ["a", "b", "c"]
    assert cache.get(make_params()).name == "c"


def test_cached_record_out_of_memory_searches_again():
    s = Scripted([Rec("big", 1 << 30), Rec("small", 0)])
    cache = BenchmarkCache("forward")
    p = make_params()
    cache.insert(p, Rec("big", 1 << 30))
    s.fail = {"big": oom()}
    assert try_all(args_for(p), s, cache).name == "small"
    assert s.ran == ["big", "big", "small"] and s.searches == 1
    assert cache.get(p).name == "small"


def test_cached_record_failing_with_other_error_propagates():
    # The reference only recovers from out-of-memory on the cached record.
    s = Scripted([Rec("a")], fail={"a": bad()})
    cache = BenchmarkCache("forward")
    cache.insert(make_params(), Rec("a"))
    with pytest.raises(CudnnBadParamError):
        try_all(args_for(make_params()), s, cache)


def test_workspace_limit_skips_large_candidates():
    s = Scripted([Rec("huge", 10_000), Rec("fits", 100)])
    p = make_params(workspace_limit=1000)
    assert try_all(args_for(p), s, BenchmarkCache("forward")).name == "fits"
    assert s.ran == ["fits"]


def test_all_fail_lists_every_candidate_and_why():
    s = Scripted([Rec("a", 1), Rec("b", 2), Rec("c", 5000)], fail={"a": oom(), "b": bad()})
    p = make_params(workspace_limit=100)
    with pytest.raises(NoAlgorithmError) as info:
        try_all(args_for(p), s, BenchmarkCache("forward"))
    msg = str(info.value)
    assert "rec a (1 B): OutOfMemoryError" in msg
    assert "rec b (2 B): CudnnBadParamError" in msg
    assert "rec c (5000 B)" in msg and "workspace_limit=100" in msg
    assert [f[0] for f in info.value.failures] == ["rec a (1 B)", "rec b (2 B)", "rec c (5000 B)"]


def test_other_exceptions_are_not_swallowed():
    s = Scripted([Rec("a"), Rec("b")], fail={"a": ZeroDivisionError("bug")})
    with pytest.raises(ZeroDivisionError):
        try_all(args_for(make_params()), s, BenchmarkCache("forward"))


def test_deterministic_without_benchmark_uses_only_the_default_and_does_not_cache():
    s = Scripted([Rec("a")], default=[Rec("default")])
    cache = BenchmarkCache("forward")
    p = make_params(deterministic=True)
    assert try_all(args_for(p, benchmark=False), s, cache).name == "default"
    assert s.searches == 0 and cache.get(p) is None
    # with benchmark the search runs (and filters for determinism itself)
    assert try_all(args_for(p, benchmark=True), s, cache).name == "a"
    assert s.searches == 1


def test_one_search_per_key_across_threads():
    s = Scripted([Rec("a")], delay=0.05)
    cache = BenchmarkCache("forward")
    p = make_params()
    results = []
    threads = [threading.Thread(target=lambda: results.append(try_all(args_for(p), s, cache)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r.name == "a" for r in results)
    assert s.searches == 1 and cache.searches == 1


def test_reader_does_not_wait_on_a_search_for_another_key():
    slow = Scripted([Rec("slow")], delay=1.0)
    cache = BenchmarkCache("forward")
    p_slow, p_fast = make_params(), make_params(groups=2)
    cache.insert(p_fast, Rec("fast"))
    t = threading.Thread(target=try_all, args=(args_for(p_slow), slow, cache))
    t.start()
    time.sleep(0.1)  # the slow search now holds its key's lock
    t0 = time.perf_counter()
    fast = Scripted([Rec("fast")])
    assert try_all(args_for(p_fast), fast, cache).name == "fast"
    assert time.perf_counter() - t0 < 0.5
    t.join()


def test_cache_is_bounded_and_clearable():
    cache = BenchmarkCache("forward", maxsize=3)
    keys = [make_params(groups=g) for g in range(1, 6)]
    for i, k in enumerate(keys):
        cache.insert(k, i)
    assert len(cache) == 3
    assert cache.get(keys[0]) is None and cache.get(keys[-1]) == 4
    cache.clear()
    assert len(cache) == 0


def test_benchmark_cache_listing_and_clear_caches():
    clear_caches()
    p = make_params(epilogue="add_relu")
    caches["forward"].insert(p, AlgoRecord(1, 0, 128, 0.5, True, "forward", "find"))
    rows = benchmark_cache()
    assert len(rows) == 1
    row = rows[0]
    assert row["direction"] == "forward" and row["fused"] is True and row["workspace"] == 128
    assert "IMPLICIT_PRECOMP_GEMM" in row["choice"] and "0.5000 ms" in row["choice"]
    clear_caches()
    assert benchmark_cache() == []


# ---- v7 rules that need no GPU ----------------------------------------------------------------------

def test_precision_rule():
    strict = make_params(allow_tf32=False)
    check_precision(strict, 3)  # FMA_MATH
    with pytest.raises(PycudnnError, match="FMA"):
        check_precision(strict, 1)  # TENSOR_OP_MATH
    check_precision(make_params(allow_tf32=True), 1)
    check_precision(make_params(dtype="float16", allow_tf32=False), 1)


def _perf(direction, rows):
    table = v7.v7_direction(direction)
    arr = (table.perf_struct * len(rows))()
    for i, (algo, status, det, math, mem) in enumerate(rows):
        arr[i].algo, arr[i].status, arr[i].determinism = algo, status, det
        arr[i].mathType, arr[i].memory, arr[i].time = math, mem, 0.1 * (i + 1)
    return arr


def test_valid_algorithm_filter():
    rows = [(1, 0, 0, 0, 10), (0, 3000, 1, 0, 0), (2, 0, 1, 1, 20), (3, 0, 1, 3, 30)]
    perf = _perf("forward", rows)
    got = v7.V7Engine.valid_algorithms(make_params(), perf, 4, "find")
    assert [r.algo for r in got] == [1, 2, 3]  # status != success dropped, order kept
    det = v7.V7Engine.valid_algorithms(make_params(deterministic=True), perf, 4, "find")
    assert [r.algo for r in det] == [2, 3]
    strict = v7.V7Engine.valid_algorithms(make_params(allow_tf32=False), perf, 4, "find")
    assert [r.algo for r in strict] == [3]  # only FMA math for strict float32
    with pytest.raises(NoAlgorithmError, match="no valid convolution algorithms"):
        v7.V7Engine.valid_algorithms(make_params(), _perf("forward", [(0, 3000, 1, 0, 0)]), 1, "find")


def test_backward_filter_search_leaves_out_winograd():
    assert 4 not in v7.v7_direction("backward_filter").algos
    assert len(v7.v7_direction("backward_filter").algos) == 6
    assert len(v7.v7_direction("forward").algos) == 8
    assert len(v7.v7_direction("backward_data").algos) == 6


# ---- the v7 Find under concurrent cold searches ------------------------------------------------

class _Device:
    """Free memory that allocations take and closes give back; reading it is slow, which widens
    the window in which two unserialized threads would size their workspaces alike."""

    def __init__(self, free):
        self.free = free
        self.lock = threading.Lock()
        self.in_use = 0
        self.taken: list[tuple[int, int]] = []  # (bytes, free before) of each allocation

    def mem_get_info(self, device):
        free = self.free
        time.sleep(0.005)  # (the bytes were read before the wait)
        return free, 1 << 40

    def allocate(self, n, device, stream):
        with self.lock:
            if n > self.free:
                raise OutOfMemoryError(f"out of memory: {n} B asked, {self.free} free")
            self.taken.append((n, self.free))
            self.free -= n
            self.in_use += n
        dev = self

        class Buf:
            ptr = 1 << 40

            def close(self, stream=None):
                with dev.lock:
                    dev.free += n
                    dev.in_use -= n
        return Buf()


def _v7_with_fake_find(monkeypatch, device, rows_fail_first=0):
    """A V7Engine whose descriptors are libcudnn's and whose Find and workspace sizes are
    scripted: algorithm i needs sizes[i] bytes; the first ``rows_fail_first`` Finds fail every
    row."""
    import ctypes

    sizes = [0, 64 << 20, 512 << 20, 900 << 20]
    calls = []
    engine = v7.V7Engine()
    monkeypatch.setattr(engine, "workspace_size",
                        lambda args, algo, math_type=None: sizes[int(algo) % len(sizes)])
    monkeypatch.setattr(v7, "mem_get_info", device.mem_get_info)
    monkeypatch.setattr(v7, "allocate", device.allocate)
    monkeypatch.setattr(v7, "error_if_capturing", lambda *a: None)

    def find(handle, a, a_ptr, b, b_ptr, conv, out, out_ptr, n, count, perf, ws_ptr, ws_size):
        calls.append((ws_size, v7.sizing_lock(0).locked()))
        time.sleep(0.03)  # a Find takes a while: the others' sizing happens meanwhile
        fail = len(calls) <= rows_fail_first
        for i in range(4):
            perf[i].algo = i
            perf[i].status = 2 if fail or sizes[i] > ws_size else 0  # ALLOC_FAILED
            perf[i].time = float(i)
            perf[i].memory = sizes[i]
            perf[i].determinism = 1
            perf[i].mathType = 0
        count._obj.value = 4
        return 0

    fake = type("Lib", (), {})()
    fake.cudnnFindConvolutionForwardAlgorithmEx = find
    monkeypatch.setattr(library, "lib", lambda: fake)  # what v7 calls
    monkeypatch.setattr(engine, "_heuristics", lambda args: pytest.fail("heuristics used"))
    return engine, calls, sizes


def test_find_leaves_headroom_and_threads_never_size_from_the_same_free_bytes(monkeypatch):
    device = _Device(1 << 30)
    engine, calls, sizes = _v7_with_fake_find(monkeypatch, device)
    errors = []
    barrier = threading.Barrier(8)

    def search(i):
        try:
            barrier.wait()
            p = make_params(input_shape=(2, 4, 8, 8 + i), input_strides=(256 + 32 * i, 64 + 8 * i,
                                                                         8 + i, 1),
                            output_shape=(2, 8, 8, 8 + i),
                            output_strides=(512 + 64 * i, 64 + 8 * i, 8 + i, 1))
            engine.candidates(args_for(p, benchmark=True))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=search, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors  # no thread sized a workspace from bytes another had taken
    assert len(calls) == 8
    # each Find left free memory besides its workspace, for CUDA's lazy module loads: sized
    # from the free bytes as they were when it took its workspace
    assert all(n <= free - v7.find_headroom(free) for n, free in device.taken)
    assert max(ws for ws, _ in calls) == 512 << 20  # 900 MiB would leave under 128 MiB


def test_a_find_whose_rows_all_failed_is_retried_alone_before_the_heuristics(monkeypatch):
    device = _Device(1 << 30)
    engine, calls, sizes = _v7_with_fake_find(monkeypatch, device, rows_fail_first=1)
    got = engine.candidates(args_for(make_params(), benchmark=True))
    assert [r.source for r in got] == ["find"] * 3 and got[0].algo == 0
    assert [locked for _, locked in calls] == [False, True]  # the retry held the sizing lock
    assert not v7.sizing_lock(0).locked() and device.in_use == 0


def test_find_headroom():
    assert v7.find_headroom(1 << 34) == v7.FIND_HEADROOM
    assert v7.find_headroom(100 << 20) == 25 << 20
    assert v7.find_headroom(0) == 0 and v7.find_headroom(-5) == 0


@pytest.mark.parametrize("where", ["sizing", "find", "retried find"])
def test_an_interrupt_during_a_find_leaves_the_sizing_lock_free(monkeypatch, where):
    device = _Device(1 << 30)
    engine, calls, sizes = _v7_with_fake_find(monkeypatch, device,
                                              rows_fail_first=1 if where == "retried find" else 0)
    fake = library.lib()
    find = fake.cudnnFindConvolutionForwardAlgorithmEx

    def interrupted_find(*a):
        find(*a)
        if where == "find" or len(calls) == 2:
            raise KeyboardInterrupt

    def interrupted_sizing(args):
        raise KeyboardInterrupt

    if where == "sizing":
        monkeypatch.setattr(engine, "max_workspace_size", interrupted_sizing)
    else:
        fake.cudnnFindConvolutionForwardAlgorithmEx = interrupted_find
    with pytest.raises(KeyboardInterrupt):
        engine.candidates(args_for(make_params(), benchmark=True))
    assert not v7.sizing_lock(0).locked() and device.in_use == 0
    # the next search on the device is not blocked
    fake.cudnnFindConvolutionForwardAlgorithmEx = find
    monkeypatch.setattr(engine, "max_workspace_size", type(engine).max_workspace_size.__get__(engine))
    assert engine.candidates(args_for(make_params(), benchmark=True))
