"""CPU tests: a tuning-database record is checked against its key as a search checks a candidate,
search bookkeeping does not grow with the number of distinct calls, and a search cut short is not
taken for a full one.

cuDNN's *answers* that need a GPU (its heuristics' list, a workspace size, the launch) come from
stand-ins here; the file, lookup, restore and iterator are pycudnn's real ones. The same rules run
against the real library in tests/test_tuning_db_gpu.py.
"""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from pycudnn._types import BwdFilterAlgo, Determinism, MathType, Status
from pycudnn.engines import contract, v7
from pycudnn.engines.v7 import AlgoRecord, V7Engine
from pycudnn.search.cache import BenchmarkCache
from pycudnn.search.iterate import try_all
from pycudnn.engines.problem import ConvolutionArgs, ConvolutionParams
from pycudnn.errors import NoAlgorithmError
from scripted_engine import ScriptedEngine

IDENTITY = {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}


def wgrad_params(**over) -> ConvolutionParams:
    base = dict(direction="backward_filter", device=0, cudnn_version=92800, dtype="float32",
                input_shape=(32, 64, 56, 56), input_strides=(200704, 3136, 56, 1),
                weight_shape=(64, 64, 3, 3), weight_format="NCHW",
                output_shape=(32, 64, 56, 56), output_strides=(200704, 3136, 56, 1),
                padding=(1, 1), stride=(1, 1), dilation=(1, 1), groups=1, deterministic=True,
                allow_tf32=True, workspace_limit=None, engine="v7")
    base.update(over)
    return ConvolutionParams(**base)


@pytest.fixture
def db(tmp_path, monkeypatch):
    from pycudnn.tuning import db as tuning_db
    from pycudnn.configuration import config

    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYCUDNN_TUNING_DB", raising=False)
    config.reset()
    tuning_db.forget()
    real_identity = tuning_db.device_identity
    # device 0 answers as on a GPU machine; any other device asks the runtime
    monkeypatch.setattr(tuning_db, "device_identity",
                        lambda device: dict(IDENTITY) if device == 0 else real_identity(device))
    yield tuning_db
    tuning_db.forget()
    config.reset()


def _perf(direction, rows):
    """A cudnnGet*_v7 answer: (algo, status, determinism, math type) per row."""
    table = v7.v7_direction(direction)
    arr = (table.perf_struct * len(rows))()
    for i, (algo, status, det, math) in enumerate(rows):
        arr[i].algo, arr[i].status, arr[i].determinism, arr[i].mathType = algo, status, det, math
    return arr, len(rows)


class V7(V7Engine):
    """The real v7 strategy with cuDNN's GPU-side answers stood in: its heuristics say
    backward-filter ALGO_0 is non-deterministic and ALGO_1 deterministic; workspaces are 512 MiB
    for ALGO_1 and 0 for the others; a search offers ALGO_1 then ALGO_3."""

    def __init__(self):
        super().__init__()
        self.ran: list[AlgoRecord] = []

    def _heuristics(self, args):
        det, nondet = Determinism.DETERMINISTIC, Determinism.NON_DETERMINISTIC
        return _perf(args.params.direction, [
            (BwdFilterAlgo.ALGO_0, Status.SUCCESS, nondet, MathType.DEFAULT_MATH),
            (BwdFilterAlgo.ALGO_1, Status.SUCCESS, det, MathType.DEFAULT_MATH),
            (BwdFilterAlgo.ALGO_3, Status.SUCCESS, nondet, MathType.DEFAULT_MATH),
            (BwdFilterAlgo.FFT, Status.NOT_SUPPORTED, det, MathType.DEFAULT_MATH),
        ])

    def workspace_size(self, args, algo, math_type=None):
        return 512 << 20 if algo == BwdFilterAlgo.ALGO_1 else 0

    def candidates(self, args):
        return self.valid_algorithms(args.params, *self._heuristics(args), "find")

    def run(self, args, record):
        contract.check_precision(args.params, record.math_type)
        self.ran.append(record)


def _run_with_stored(db, params, record):
    db.store(params, record)
    s = V7()
    args = ConvolutionArgs(params=params, handle=0, stream=0, x=1, w=2, y=3, benchmark=True)
    return try_all(args, s, BenchmarkCache(params.direction)), s


@pytest.mark.parametrize("stored, why", [
    ({"algo": 0, "math_type": 3, "workspace": 0, "time_ms": 0.0, "deterministic": True},
     "non-deterministic for a deterministic key"),
    ({"algo": 1, "math_type": 2, "workspace": 0, "time_ms": 0.0, "deterministic": True},
     "float32 converted down to half"),
    ({"algo": 5, "math_type": 0, "workspace": 0, "time_ms": 0.0},
     "not supported by cuDNN's heuristics for these descriptors"),
    ({"algo": 1, "math_type": 99, "workspace": 0, "time_ms": 0.0}, "unknown math type"),
    ({"algo": 1.5, "math_type": 0, "workspace": 0, "time_ms": 0.0}, "algo not an int"),
    ({"algo": True, "math_type": 0, "workspace": 0, "time_ms": 0.0}, "algo a bool"),
])
def test_v7_record_that_a_search_would_refuse_is_dropped_and_searched(db, stored, why):
    params = wgrad_params()
    rec, s = _run_with_stored(db, params, stored)
    assert rec.source == "find", why
    assert rec.algo == BwdFilterAlgo.ALGO_1 and rec.deterministic
    assert all(r.source != "tuning-db" for r in s.ran)
    now = db.lookup(params)  # the bad record is gone (replaced by the new search's)
    assert now is not None and now["algo"] == BwdFilterAlgo.ALGO_1


def test_v7_record_above_the_workspace_limit_is_dropped(db):
    params = wgrad_params(workspace_limit=1 << 20, deterministic=False)
    rec, _ = _run_with_stored(db, params, {"algo": 1, "math_type": 0, "workspace": 0, "time_ms": 0.0})
    # ALGO_1 needs 512 MiB (cuDNN's answer, not the record's "workspace": 0): the search takes
    # ALGO_0, the first candidate within the limit
    assert rec.source == "find" and rec.algo == BwdFilterAlgo.ALGO_0


def test_v7_record_that_checks_out_is_used_with_cudnns_workspace_and_determinism(db):
    params = wgrad_params()
    rec, s = _run_with_stored(db, params, {"algo": 1, "math_type": 0, "workspace": 0,
                                           "time_ms": 0.5, "deterministic": False})
    assert rec.source == "tuning-db" and rec.algo == BwdFilterAlgo.ALGO_1
    assert rec.workspace == 512 << 20  # asked of cuDNN again, not read from the record
    assert rec.deterministic  # what cuDNN says, not what the record claims


def test_precision_rule_refuses_down_conversion_of_wide_data():
    p32, p64 = wgrad_params(), wgrad_params(dtype="float64")
    for p in (p32, p64):
        assert "half precision" in contract.precision_problem(p, MathType.TENSOR_OP_MATH_ALLOW_CONVERSION)
    assert contract.precision_problem(wgrad_params(dtype="float16"), MathType.TENSOR_OP_MATH) is None
    assert "unknown math type" in contract.precision_problem(p32, 7)


# ---- bookkeeping that must not grow with the number of distinct calls ----------------------------

class FailingV7(ScriptedEngine):
    """A strategy whose default runs and whose search finds nothing (every candidate fails)."""

    name = "v7"
    deterministic_uses_default = True

    def default_candidates(self, args):
        return [AlgoRecord(1, 3, 0, direction=args.params.direction, source="default")]

    def candidates(self, args):
        return []

    def run(self, args, record):
        pass


def _args(p):
    return ConvolutionArgs(params=p, handle=0, stream=0, x=0, w=0, y=0, benchmark=False)


def test_search_locks_do_not_outlive_the_search():
    base = wgrad_params(direction="forward", workspace_limit=None)
    cache = BenchmarkCache("forward", maxsize=16)
    s = FailingV7()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(1, 5001):  # deterministic v7 without benchmark: the default, never cached
            try_all(_args(dataclasses.replace(base, input_shape=(n, 64, 56, 56))), s, cache)
        for n in range(1, 1001):  # failed searches
            p = dataclasses.replace(base, deterministic=False, input_shape=(n, 64, 56, 56))
            with pytest.raises(NoAlgorithmError):
                try_all(_args(p), s, cache)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache) == 0 and cache.searches_in_flight == 0
    assert grown < 256 << 10, f"{grown} bytes kept after 6,000 distinct calls"


def test_search_lock_still_serializes_one_key():
    import threading
    import time

    cache = BenchmarkCache("forward")
    key = wgrad_params()
    inside, overlaps = [], []

    def search():
        with cache.search_lock(key):
            if inside:
                overlaps.append(1)
            inside.append(1)
            time.sleep(0.01)
            inside.pop()

    threads = [threading.Thread(target=search) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not overlaps and cache.searches_in_flight == 0


# ---- a search cut short is another key --------------------------------------------------------------

def test_benchmark_limit_is_part_of_the_key():
    full = wgrad_params(engine="graph")
    cut = dataclasses.replace(full, benchmark_limit=2)
    assert full != cut
    cache = BenchmarkCache("backward_filter")
    cache.insert(cut, "best of the first 2")
    assert cache.get(full) is None
    assert "benchmark_limit=2" in cut.short()


# ---- scratch buffers are sized from the parsed dtype ------------------------------------------------

@pytest.mark.parametrize("dtype, itemsize", [("float64", 8), ("float32", 4), ("float16", 2),
                                             ("bfloat16", 2)])
def test_scratch_sizes_follow_the_dtype_the_descriptors_use(dtype, itemsize):
    from pycudnn.engines.problem import role_bytes, written_bytes

    p = wgrad_params(dtype=dtype)
    span = 32 * 64 * 56 * 56
    assert role_bytes(p, "y") == role_bytes(p, "x") == span * itemsize
    assert role_bytes(p, "w") == written_bytes(p) == int(np.prod((64, 64, 3, 3))) * itemsize


def test_scratch_size_refuses_an_unknown_dtype():
    from pycudnn.engines.problem import written_bytes

    with pytest.raises((TypeError, ValueError)):
        written_bytes(wgrad_params(dtype="complex-ish"))


# ---- graph-engine measurements write scratch only where a direction writes --------------------------

@pytest.mark.parametrize("direction, slot", [("forward", 2), ("backward_data", 0),
                                             ("backward_filter", 1)])
def test_graph_benchmark_scratch_replaces_the_written_tensor(direction, slot):
    p = wgrad_params(direction=direction, engine="graph")
    args = ConvolutionArgs(params=p, handle=0, stream=0, x=0x1000, w=0x2000, y=0x3000)
    expected = [0x1000, 0x2000, 0x3000]
    expected[slot] = 0xABC00
    assert args.pointers(0xABC00) == tuple(expected)
    assert args.pointers() == (0x1000, 0x2000, 0x3000)
