"""Algorithm search, the benchmark cache and the iterator that tries candidates in order.

This is the behaviour of PyTorch's ``Conv_v7.cpp`` (see ``docs/architecture.md``):

* `ConvolutionParams` is the immutable cache key: everything
  that changes the answer.
* `BenchmarkCache` holds one record per key, one cache per direction, thread-safe, with a
  per-key search lock so two threads asking for the same new key run one search, and a reader
  never waits on a search for another key.
* `try_all()` is the reference's ``AlgoIterator::try_all``: the cached record first (searched
  again when it runs out of memory), else every candidate in order, skipping those that run out of
  memory or fail inside cuDNN, caching the first that succeeds; when all fail it raises
  `NoAlgorithmError` listing each candidate and why.
* An *engine* (`Engine`) supplies the candidates and runs one.
  `V7Search` here is the legacy Get/Find engine; the graph engine implements the same contract,
  so the key, caches, iterator, tuning database and guards are shared.

The key and the arguments live in `pycudnn.search.problem` (re-exported here); the
registry of engines and the functions that act on every engine and cache (``clear_caches``,
``set_cache_limit``, ``benchmark_cache``, ``strategy_for``) in `pycudnn.dispatch.engines`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable

from .._types import (BwdDataAlgo, BwdFilterAlgo, ConvolutionBwdDataAlgoPerf,
                       ConvolutionBwdFilterAlgoPerf, ConvolutionFwdAlgoPerf, Determinism, FwdAlgo,
                       MathType, Status)
from ..cudnn.descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor
from ..cudnn.tensor_ops import relu_descriptor, scalar, scalar_pointers
from ..errors import (CudnnError, NoAlgorithmError, OutOfMemoryError, PycudnnError,
                      StreamCaptureError)
from ..ffi import library as _lib
from ..runtime.memory import allocate, mem_get_info, stream_is_capturing
from . import tuning_db
from .engine import Engine, Record, release, workspace
from .problem import (DIRECTION, DIRECTIONS, ConvolutionArgs, ConvolutionParams, EpilogueKind,
                      written_bytes)

__all__ = [
    "DIRECTIONS", "ConvolutionParams", "ConvolutionArgs", "AlgoRecord", "BenchmarkCache",
    "SearchStrategy", "V7Search", "try_all", "caches", "check_precision", "precision_problem",
    "error_if_capturing", "relu_descriptor", "scalar_pointers", "scalar", "V7Direction", "v7_direction",
]

#: the engine contract under its earlier name
SearchStrategy = Engine

log = logging.getLogger("pycudnn")


# ---- records and arguments ------------------------------------------------------------------------

@dataclass(frozen=True)
class AlgoRecord:
    """One legacy (v7) candidate: algorithm, math type and workspace, applied together."""

    algo: int
    math_type: int
    workspace: int
    time_ms: float = -1.0                # measured by Find; -1 for heuristics
    deterministic: bool = True
    direction: str = "forward"
    source: str = "heuristics"           # "heuristics", "find" or "default"

    @property
    def algo_name(self) -> str:
        enum = _V7_TABLE[self.direction].algo_enum
        try:
            return f"{enum.__name__}.{enum(self.algo).name}"
        except ValueError:
            return f"algo {self.algo}"

    def describe(self) -> str:
        t = f", {self.time_ms:.4f} ms" if self.time_ms >= 0 else ""
        return (f"{self.algo_name} (math={MathType(self.math_type).name}, "
                f"workspace={self.workspace} B{t}, {self.source})")


# ---- the cache ------------------------------------------------------------------------------------

class _SearchLock:
    """A per-key lock that exists only while a thread holds or waits for it.

    Keeping one lock per key for ever grew without bound for keys that never get a record
    (deterministic v7 calls, failed searches); counting users and removing the entry when the last
    one leaves keeps the map as small as the number of searches in flight.
    """

    __slots__ = ("cache", "key", "lock", "users")

    def __init__(self, cache: "BenchmarkCache", key: ConvolutionParams) -> None:
        self.cache = cache
        self.key = key
        self.lock = threading.Lock()
        self.users = 0

    def __enter__(self) -> "_SearchLock":
        self.lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()
        self.cache._leave(self)


class BenchmarkCache:
    """Thread-safe map ConvolutionParams -> record, bounded, with per-key search locks.

    Reads take no lock (a dict lookup is atomic in CPython); writes and evictions do.
    """

    def __init__(self, direction: str, maxsize: int | None = 4096) -> None:
        self.direction = direction
        self.maxsize = maxsize
        self._map: OrderedDict[ConvolutionParams, Record] = OrderedDict()
        self._lock = threading.Lock()
        self._search_locks: dict[ConvolutionParams, _SearchLock] = {}
        self.searches = 0  # number of searches run (tests assert one per key)

    def get(self, key: ConvolutionParams) -> Any:
        """The record for ``key`` (and it becomes the most recently used), or None."""
        record = self._map.get(key)
        if record is not None and self.maxsize is not None:
            with self._lock:  # the hot path never comes here: it replays prepared convolutions
                try:
                    self._map.move_to_end(key)
                except KeyError:  # evicted meanwhile
                    pass
        return record

    def set_maxsize(self, maxsize: int | None) -> None:
        """Bound the cache (None: unbounded), evicting the least recently used entries now."""
        with self._lock:
            self.maxsize = maxsize
            self._evict()

    def insert(self, key: ConvolutionParams, record: Any) -> None:
        with self._lock:
            self._map[key] = record
            self._map.move_to_end(key)
            self._evict()

    def _evict(self) -> None:
        if self.maxsize is not None:
            while len(self._map) > self.maxsize:
                self._map.popitem(last=False)

    def search_lock(self, key: ConvolutionParams) -> _SearchLock:
        """The lock serializing searches for ``key``; use it as ``with cache.search_lock(key):``
        (the entry is removed when no thread holds or waits for it any more)."""
        with self._lock:
            entry = self._search_locks.get(key)
            if entry is None:
                entry = self._search_locks[key] = _SearchLock(self, key)
            entry.users += 1
            return entry

    def _leave(self, entry: _SearchLock) -> None:
        with self._lock:
            entry.users -= 1
            if entry.users == 0 and self._search_locks.get(entry.key) is entry:
                del self._search_locks[entry.key]

    @property
    def searches_in_flight(self) -> int:
        """Keys a thread is searching (or waiting to search) right now."""
        return len(self._search_locks)

    def clear(self) -> None:
        with self._lock:
            self._map.clear()
            self.searches = 0

    def items(self) -> list[tuple[ConvolutionParams, Record]]:
        with self._lock:
            return list(self._map.items())

    def __len__(self) -> int:
        return len(self._map)


caches: dict[str, BenchmarkCache] = {d: BenchmarkCache(d) for d in DIRECTIONS}


# ---- guards ---------------------------------------------------------------------------------------

def precision_problem(params: ConvolutionParams, math_type: int) -> str | None:
    """Why ``math_type`` may not run ``params`` (None when it may).

    The reference's rule: strict float32 runs on FMA math only. Beyond it, float32 and float64
    data never run with ``TENSOR_OP_MATH_ALLOW_CONVERSION`` (which converts the inputs down to
    half precision), and the math type must be one cuDNN defines.
    """
    try:
        math = MathType(math_type)
    except ValueError:
        return f"unknown math type {math_type!r}"
    if params.dtype == "float32" and not params.allow_tf32 and math != MathType.FMA_MATH:
        return f"float32 with allow_tf32=False must run with FMA math, got {math.name}"
    if params.dtype in ("float32", "float64") and math == MathType.TENSOR_OP_MATH_ALLOW_CONVERSION:
        return f"{params.dtype} data may not be converted down to half precision ({math.name})"
    return None


def check_precision(params: ConvolutionParams, math_type: int) -> None:
    """The reference's ASSERT_CORRECT_PRECISION (see `precision_problem()`), before a launch."""
    problem = precision_problem(params, math_type)
    if problem is not None:
        raise PycudnnError(f"internal error: {problem}")


def error_if_capturing(stream: int, what: str) -> None:
    """Measuring during CUDA stream capture is refused (the reference's errorIfCapturingCudnnBenchmark)."""
    if stream_is_capturing(stream):
        raise StreamCaptureError(
            f"{what}: cannot benchmark (search by measurement) while the stream is being captured "
            f"into a CUDA graph; run the convolution once with the same shapes before capturing "
            f"(a warm-up fills the cache), or pass benchmark=False")


# ---- the iterator -------------------------------------------------------------------------------

def try_all(args: ConvolutionArgs, strategy: Engine, cache: BenchmarkCache | None = None) -> Any:
    """Run the convolution with the first record that works; return that record.

    Order: the cached record (on out-of-memory, search again); else the strategy's candidates
    (defaults only when deterministic without benchmark), skipping candidates above the workspace
    limit, those that run out of memory, and those that fail inside cuDNN. The first success is
    cached. One search per key at a time.
    """
    params = args.params
    if cache is None:
        cache = caches[params.direction]
    # Conv_v7's rule: deterministic without benchmark runs only the default algorithm (uncached).
    only_default = params.deterministic and not args.benchmark and strategy.deterministic_uses_default
    failed_cached = None
    if not only_default:
        record = cache.get(params)
        if record is not None:
            try:
                strategy.run(args, record)
                return record
            except OutOfMemoryError:
                failed_cached = record  # search again: the next candidate may need less memory

    failures: list[tuple[str, str]] = []
    with cache.search_lock(params):
        if not only_default:
            # Another thread may have finished the search while this one waited for the lock.
            record = cache.get(params)
            if record is not None and record is not failed_cached:
                try:
                    strategy.run(args, record)
                    return record
                except OutOfMemoryError as exc:
                    failures.append((record.describe(), f"OutOfMemoryError: {exc}"))
            if args.benchmark and failed_cached is None:
                record = _from_tuning_db(args, strategy)
                if record is not None:
                    cache.insert(params, record)
                    return record
        if only_default:
            candidates: Iterable[Any] = strategy.default_candidates(args)
        else:
            cache.searches += 1
            log.debug("searching (%s, %s): %s", strategy.name,
                      "benchmark" if args.benchmark else "heuristics", params.short())
            candidates = strategy.candidates(args)
        limit = params.workspace_limit
        for record in candidates:
            if limit is not None and record.workspace > limit:
                failures.append((record.describe(),
                                 f"needs a workspace of {record.workspace} B, above workspace_limit={limit}"))
                continue
            try:
                strategy.run(args, record)
            except (OutOfMemoryError, CudnnError) as exc:
                failures.append((record.describe(), f"{type(exc).__name__}: {_first_line(exc)}"))
                log.debug("candidate failed, trying the next: %s: %s", record.describe(),
                          failures[-1][1])
                continue
            if not only_default:
                cache.insert(params, record)
                if args.benchmark:
                    _to_tuning_db(args, strategy, record)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("chose %s for %s%s", record.describe(), params.short(),
                          f" after {len(failures)} failed candidate(s)" if failures else "")
            return record
    lines = [f"  - {what}: {why}" for what, why in failures] or ["  (no candidate was offered)"]
    raise NoAlgorithmError(
        f"unable to find a valid cuDNN algorithm to run the convolution ({params.short()}); "
        f"candidates tried:\n" + "\n".join(lines), failures)


# ---- the persistent tuning database hooks ---------------------------------------------------------
# pycudnn.search.tuning_db owns the file; the engines own what a record is (serialize / restore).

def _database_on(args: ConvolutionArgs) -> bool:
    return args.tuning_db and tuning_db.enabled()


def _from_tuning_db(args: ConvolutionArgs, strategy: Engine) -> Any:
    """A record measured by an earlier process for this key, rebuilt and run once; else None.

    A record that does not check out for this key, no longer rebuilds or fails to run (driver or
    library changed, hand-edited, imported from elsewhere) is dropped and logged, and the search
    runs as if it had never been there.
    """
    if not _database_on(args):
        return None
    data = tuning_db.lookup(args.params)
    if data is None:
        return None
    try:
        record = strategy.restore(args, data)
        strategy.run(args, record)
    except OutOfMemoryError:
        return None  # memory is short now: search this time, keep the record for later
    except Exception as exc:  # a record from disk may be stale or hand-edited: never fatal
        log.warning("tuning database: dropping the record for %s (%s: %s); searching again",
                    args.params.short(), type(exc).__name__, _first_line(exc))
        tuning_db.drop(args.params)
        return None
    log.debug("tuning database: reused %s for %s", record.describe(), args.params.short())
    return record


def _to_tuning_db(args: ConvolutionArgs, strategy: Engine, record: Any) -> None:
    if not _database_on(args):
        return
    try:
        tuning_db.store(args.params, strategy.serialize(record))
    except Exception as exc:  # noqa: BLE001 - a read-only disk or a bad file must not fail the call
        log.warning("tuning database: could not store a record (%s: %s)", type(exc).__name__,
                    _first_line(exc))


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.split("\n", 1)[0]


# ---- the v7 (legacy API) strategy -----------------------------------------------------------------

@dataclass(frozen=True)
class V7Direction:
    """How the v7 engine searches and runs one direction: cuDNN's perf-result struct and
    algorithm enum, the algorithms Find and the workspace sizing consider, the default algorithm,
    and the names of the cuDNN functions it calls (see
    `v7_direction`)."""

    perf_struct: type[ctypes.Structure]
    algo_enum: type[IntEnum]
    algos: tuple[int, ...]           # every algorithm Find and the workspace sizing consider
    default_algo: int
    get_fn: str
    find_fn: str
    workspace_fn: str
    run_fn: str


_V7_TABLE: dict[str, V7Direction] = {
    "forward": V7Direction(
        ConvolutionFwdAlgoPerf, FwdAlgo, tuple(FwdAlgo), FwdAlgo.IMPLICIT_PRECOMP_GEMM,
        "cudnnGetConvolutionForwardAlgorithm_v7", "cudnnFindConvolutionForwardAlgorithmEx",
        "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward"),
    "backward_data": V7Direction(
        ConvolutionBwdDataAlgoPerf, BwdDataAlgo, tuple(BwdDataAlgo), BwdDataAlgo.ALGO_1,
        "cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnFindConvolutionBackwardDataAlgorithmEx",
        "cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData"),
    "backward_filter": V7Direction(
        # WINOGRAD is not implemented for backward filter: the reference leaves it out too.
        ConvolutionBwdFilterAlgoPerf, BwdFilterAlgo,
        tuple(a for a in BwdFilterAlgo if a != BwdFilterAlgo.WINOGRAD), BwdFilterAlgo.ALGO_1,
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7", "cudnnFindConvolutionBackwardFilterAlgorithmEx",
        "cudnnGetConvolutionBackwardFilterWorkspaceSize", "cudnnConvolutionBackwardFilter"),
}


def v7_direction(direction: str) -> V7Direction:
    """The v7 engine's table row for ``direction`` (``"forward"``, ``"backward_data"`` or
    ``"backward_filter"``): what it searches and which cuDNN functions it calls.

    Raises:
        KeyError: ``direction`` is not one of the three.
    """
    return _V7_TABLE[direction]


class V7Descriptors:
    """Legacy descriptors for one ConvolutionParams; the convolution descriptor per math type.

    Descriptors are never mutated after creation, so threads can share them: instead of setting
    the math type on one shared convolution descriptor, each math type gets its own.
    """

    def __init__(self, params: ConvolutionParams) -> None:
        self.params = params
        self.x = TensorDescriptor(params.input_shape, params.dtype, params.input_strides)
        self.w = FilterDescriptor(params.weight_shape, params.dtype, params.weight_format)
        self.y = TensorDescriptor(params.output_shape, params.dtype, params.output_strides)
        self._conv: dict[int | None, ConvolutionDescriptor] = {}
        self._lock = threading.Lock()
        self._conv_cls = ConvolutionDescriptor
        self.search_conv = self.conv(None)  # flags-derived math type, used by Get/Find
        self.z = (TensorDescriptor(params.output_shape, params.dtype, params.z_strides)
                  if params.z_strides is not None else None)
        self.bias = None
        if params.epilogue == EpilogueKind.ADD_RELU:
            k = params.output_shape[1]
            ones = (1,) * (len(params.output_shape) - 2)
            self.bias = TensorDescriptor((1, k) + ones, params.dtype, None)

    def conv(self, math_type: int | None) -> ConvolutionDescriptor:
        """The convolution descriptor with ``math_type`` applied (None: the flags' default)."""
        desc = self._conv.get(math_type)
        if desc is None:
            with self._lock:
                desc = self._conv.get(math_type)
                if desc is None:
                    p = self.params
                    desc = self._conv_cls(p.padding, p.stride, p.dilation, groups=p.groups,
                                          dtype=p.dtype, allow_tf32=p.allow_tf32)
                    if math_type is not None:
                        desc.math_type = math_type
                    self._conv[math_type] = desc
        return desc

    def operands(self, direction: str, args: ConvolutionArgs) -> tuple[int, int, int, int, int, int]:
        """(a_desc, a_ptr, b_desc, b_ptr, out_desc, out_ptr) in the C argument order of ``direction``."""
        descs = {"x": self.x.handle, "w": self.w.handle, "y": self.y.handle}
        ptrs = {"x": args.x, "w": args.w, "y": args.y}
        a, b, out = DIRECTION[direction].operands
        return descs[a], ptrs[a], descs[b], ptrs[b], descs[out], ptrs[out]


class V7Search(Engine):
    """Conv_v7.cpp's search: cudnnGet*_v7 (heuristics) or cudnnFind*Ex (measurement)."""

    name = "v7"
    deterministic_uses_default = True
    epilogues = frozenset({EpilogueKind.NONE, EpilogueKind.ADD_RELU})
    # a stream-ordered allocation per launch: a per-thread cache grown and evicted across many
    # streams needs device-wide synchronization, which fails while any stream captures
    cached_workspace = False

    def __init__(self, max_prepared: int = 1024) -> None:
        self._prepared: OrderedDict[ConvolutionParams, V7Descriptors] = OrderedDict()
        self._lock = threading.Lock()
        self.max_prepared = max_prepared

    def clear(self) -> None:
        with self._lock:
            self._prepared.clear()

    def descriptors(self, params: ConvolutionParams) -> V7Descriptors:
        descs = self._prepared.get(params)
        if descs is None:
            descs = V7Descriptors(params)
            with self._lock:
                self._prepared[params] = descs
                while len(self._prepared) > self.max_prepared:
                    self._prepared.popitem(last=False)
        return descs

    def serialize(self, record: AlgoRecord) -> dict[str, Any]:
        """What the tuning database keeps of a v7 record (data only)."""
        return {"algo": record.algo, "math_type": record.math_type, "workspace": record.workspace,
                "time_ms": record.time_ms, "deterministic": record.deterministic}

    def restore(self, args: ConvolutionArgs, data: dict[str, Any]) -> AlgoRecord:
        """A record from the tuning database, checked as a search checks its candidates.

        The database is untrusted input: only the algorithm and math type are taken from it.
        cuDNN's heuristics for this key say whether the algorithm is supported and deterministic
        (the record's own claims are ignored), the math type must pass the precision rule, and
        the workspace is asked of cuDNN again and held to ``workspace_limit``.

        Raises:
            ValueError: the record does not check out for this key (the caller drops it).
        """
        p = args.params
        algo, math = _plain_int(data.get("algo"), "algo"), _plain_int(data.get("math_type"), "math_type")
        try:
            _V7_TABLE[p.direction].algo_enum(algo)
        except ValueError:
            raise ValueError(f"algo {algo} is not a {p.direction} algorithm of this cuDNN") from None
        problem = precision_problem(p, math)
        if problem is not None:
            raise ValueError(problem)
        # the same filter a search applies: supported for these descriptors, deterministic if asked
        valid = self.valid_algorithms(p, *self._heuristics(args), "heuristics")
        match = [r for r in valid if r.algo == algo]
        if not match:
            raise ValueError(
                f"{_V7_TABLE[p.direction].algo_enum(algo).name} is not a valid algorithm for this key "
                f"(cuDNN's heuristics: unsupported{' or non-deterministic' if p.deterministic else ''})")
        ws = self.workspace_size(args, algo, math)
        if ws >= _ABSURD_WORKSPACE:
            raise ValueError(f"cuDNN reports an absurd workspace of {ws} bytes")
        if p.workspace_limit is not None and ws > p.workspace_limit:
            raise ValueError(f"needs a workspace of {ws} B, above workspace_limit={p.workspace_limit}")
        time_ms = data.get("time_ms", -1.0)
        time_ms = float(time_ms) if type(time_ms) in (int, float) and time_ms >= 0 else -1.0
        return AlgoRecord(algo, math, ws, time_ms, match[0].deterministic, p.direction, "tuning-db")

    def _heuristics(self, args: ConvolutionArgs) -> tuple[Any, int]:
        """cudnnGet*_v7 for ``args``: (perf array, count)."""
        p = args.params
        table = _V7_TABLE[p.direction]
        descs = self.descriptors(p)
        a, _, b, _, out, _ = descs.operands(p.direction, args)
        n = len(table.algos)
        perf = (table.perf_struct * n)()
        count = ctypes.c_int(0)
        status = getattr(_lib.lib(), table.get_fn)(
            args.handle, a, b, descs.search_conv.handle, out, n, ctypes.byref(count), perf)
        if status:
            _lib.raise_status(status, table.get_fn, f"  params: {p.short()}")
        return perf, count.value

    def describe_params(self, params: ConvolutionParams) -> list[str]:
        """The legacy descriptors of ``params`` as cuDNN holds them (for error context)."""
        d = self.descriptors(params)
        lines = [f"input: {d.x!r}", f"weight: {d.w!r}", f"output: {d.y!r}", f"conv: {d.search_conv!r}"]
        if d.z is not None:
            lines.append(f"z: {d.z!r}")
        return lines

    # -- workspace sizing --
    def workspace_size(self, args: ConvolutionArgs, algo: int, math_type: int | None = None) -> int:
        """cudnnGet*WorkspaceSize for one algorithm; raises CudnnError if it is not supported."""
        p = args.params
        table = _V7_TABLE[p.direction]
        descs = self.descriptors(p)
        a, _, b, _, out, _ = descs.operands(p.direction, args)
        size = ctypes.c_size_t(0)
        fn = getattr(_lib.lib(), table.workspace_fn)
        status = fn(args.handle, a, b, descs.conv(math_type).handle, out, int(algo), ctypes.byref(size))
        if status:
            _lib.raise_status(status, table.workspace_fn)
        return size.value

    def max_workspace_size(self, args: ConvolutionArgs) -> int:
        """The reference's getMaxWorkspaceSize: the largest per-algorithm workspace that can be
        allocated now (free device memory less `find_headroom`), never above
        ``workspace_limit``."""
        p = args.params
        free, _total = mem_get_info(p.device)
        free -= find_headroom(free)
        ceiling = free if p.workspace_limit is None else min(free, p.workspace_limit)
        best = 0
        for algo in _V7_TABLE[p.direction].algos:
            try:
                size = self.workspace_size(args, algo)
            except CudnnError:
                continue
            if best < size <= ceiling:
                best = size
        return best

    # -- candidates --
    def candidates(self, args: ConvolutionArgs) -> list[AlgoRecord]:
        if not args.benchmark:
            return self.valid_algorithms(args.params, *self._heuristics(args), "heuristics")
        p = args.params
        table = _V7_TABLE[p.direction]
        error_if_capturing(args.stream, table.find_fn)
        descs = self.descriptors(p)
        a, a_ptr, b, b_ptr, out, out_ptr = descs.operands(p.direction, args)
        n = len(table.algos)

        def find(alone: bool) -> tuple[ctypes.Array[Any], int]:
            perf = (table.perf_struct * n)()
            count = ctypes.c_int(0)
            sizing = _sizing_lock(p.device)
            # the free memory is read and the workspace taken under one lock per device: two
            # threads never both size a workspace to the same free bytes (docs/reliability.md);
            # a retry (alone) keeps it through the Find: no other search takes memory meanwhile.
            # `with` leaves no bytecode between the acquire and the block's protection, where an
            # interrupt would leak the lock and block every later Find on the device
            with sizing if alone else contextlib.nullcontext():
                with contextlib.nullcontext() if alone else sizing:
                    ws_size = self.max_workspace_size(args)
                    workspace = allocate(ws_size, p.device, args.stream)
                scratch = None
                try:
                    out_ptr_ = out_ptr
                    if args.out_may_hold_data:
                        # cudnnFind*Ex writes garbage into its output: never into data the
                        # caller needs
                        scratch = allocate(written_bytes(p), p.device, args.stream)
                        out_ptr_ = scratch.ptr
                    status = getattr(_lib.lib(), table.find_fn)(
                        args.handle, a, a_ptr, b, b_ptr, descs.search_conv.handle, out, out_ptr_,
                        n, ctypes.byref(count), perf, workspace.ptr, ws_size)
                    if status:
                        _lib.raise_status(status, table.find_fn, f"  params: {p.short()}")
                finally:
                    workspace.close(args.stream)
                    if scratch is not None:
                        scratch.close(args.stream)
            return perf, count.value

        try:
            return self.valid_algorithms(p, *find(False), "find")
        except NoAlgorithmError as exc:
            # every row failed: seen with 16 threads searching cold keys at once, when the
            # other threads' Find workspaces left no memory for the modules CUDA loads at a
            # kernel's first launch. Once more with the device's memory to itself, then the
            # heuristics' candidates (which try_all runs with its fallbacks)
            first = exc
        try:
            return self.valid_algorithms(p, *find(True), "find")
        except NoAlgorithmError as exc:
            log.warning("%s (and %s at the first Find); falling back to cuDNN's heuristics for "
                        "this key", exc, _first_line(first))
            return self.valid_algorithms(p, *self._heuristics(args), "heuristics")

    @staticmethod
    def valid_algorithms(p: ConvolutionParams, perf: ctypes.Array[Any], count: int,
                         source: str) -> list[AlgoRecord]:
        """The reference's getValidAlgorithms: of the first ``count`` rows of cuDNN's answer
        ``perf`` (from ``source``, "find" or "heuristics"), those that succeeded, are
        deterministic when ``p`` asks for it and keep ``p``'s precision rule, in cuDNN's order.

        Raises:
            NoAlgorithmError: no row is left.

        The reference also blocklists FFT algorithms for strided backward data on cuDNN < 7.5;
        pycudnn requires cuDNN >= 9, where that bug is fixed, so there is nothing to block.
        """
        out = []
        failed: list[str] = []
        for i in range(count):
            r = perf[i]
            if r.status != Status.SUCCESS:
                failed.append(f"algo {int(r.algo)}: status {int(r.status)}")
                continue
            deterministic = r.determinism == Determinism.DETERMINISTIC
            if p.deterministic and not deterministic:
                continue
            if precision_problem(p, r.mathType) is not None:
                continue  # would break the precision rule; check_precision guards the launch too
            out.append(AlgoRecord(int(r.algo), int(r.mathType), int(r.memory), float(r.time),
                                  deterministic, p.direction, source))
        if not out:
            raise NoAlgorithmError(
                f"no valid convolution algorithms available in cuDNN for {p.short()} "
                f"({count} returned by {source}, none successful"
                f"{' and deterministic' if p.deterministic else ''}"
                f"{'; ' + ', '.join(failed) if failed else ''})")
        return out

    def default_candidates(self, args: ConvolutionArgs) -> list[AlgoRecord]:
        """The reference's onlyDefaultAlgorithm, with its math-type rule."""
        p = args.params
        table = _V7_TABLE[p.direction]
        if p.dtype in ("float16", "bfloat16"):
            math = MathType.TENSOR_OP_MATH
        elif p.dtype == "float32" and not p.allow_tf32:
            math = MathType.FMA_MATH
        else:
            math = MathType.DEFAULT_MATH
        ws = self.workspace_size(args, table.default_algo, int(math))
        return [AlgoRecord(int(table.default_algo), int(math), ws, -1.0, True, p.direction, "default")]

    # -- running --
    def run(self, args: ConvolutionArgs, record: AlgoRecord) -> None:
        check_precision(args.params, record.math_type)
        self.launch(args.params, record, args.handle, args.pointers(), args.stream)

    def launch(self, params: ConvolutionParams, record: AlgoRecord, handle: int,
               pointers: tuple[int, ...], stream: int) -> None:
        p = params
        descs = self.descriptors(p)
        conv = descs.conv(record.math_type)
        ws, owned = workspace(record.workspace, p.device, stream, self.cached_workspace)
        try:
            if p.epilogue == EpilogueKind.ADD_RELU:
                x, w, y, z, bias = pointers
                act = relu_descriptor()
                one, _ = scalar_pointers(p.dtype)
                alpha2 = scalar(p.dtype, p.alpha)
                # ADD_RELU params always carry z_strides, and V7Descriptors gives them a bias
                assert descs.z is not None and descs.bias is not None
                status = _lib.lib().cudnnConvolutionBiasActivationForward(
                    handle, one, descs.x.handle, x, descs.w.handle, w, conv.handle, record.algo, ws,
                    record.workspace, ctypes.addressof(alpha2), descs.z.handle, z,
                    descs.bias.handle, bias, act.handle, descs.y.handle, y)
                if status:
                    _lib.raise_status(status, "cudnnConvolutionBiasActivationForward")
                return
            table = _V7_TABLE[p.direction]
            by_role = dict(zip("xwy", pointers))
            desc_of = {"x": descs.x.handle, "w": descs.w.handle, "y": descs.y.handle}
            a, b, out = DIRECTION[p.direction].operands
            one, zero = scalar_pointers(p.dtype)
            status = getattr(_lib.lib(), table.run_fn)(
                handle, one, desc_of[a], by_role[a], desc_of[b], by_role[b], conv.handle,
                record.algo, ws, record.workspace, zero, desc_of[out], by_role[out])
            if status:
                _lib.raise_status(status, table.run_fn)
        finally:
            release(owned, stream)


#: the most device memory a Find leaves free besides its workspace (a quarter of the free
#: memory when that is less): CUDA loads a kernel's module into device memory at its first
#: launch (lazy loading), and a Find given every free byte, as the reference's
#: getMaxWorkspaceSize gives it, leaves none for those loads, its own or another thread's
FIND_HEADROOM = 128 << 20

_sizing_locks: dict[int, threading.Lock] = {}
_sizing_locks_guard = threading.Lock()


def find_headroom(free: int) -> int:
    """The bytes of ``free`` a Find's workspace leaves (see `FIND_HEADROOM`)."""
    return min(FIND_HEADROOM, max(free, 0) // 4)


def _sizing_lock(device: int) -> threading.Lock:
    """The lock under which a search reads the free memory of ``device`` and takes its
    workspace."""
    lock = _sizing_locks.get(device)
    if lock is None:
        with _sizing_locks_guard:
            lock = _sizing_locks.setdefault(device, threading.Lock())
    return lock


#: the reference's guard: cuDNN sometimes reports workspaces near 2^64 (treated as unusable)
_ABSURD_WORKSPACE = 1 << 40


def _plain_int(value: Any, name: str) -> int:
    """``value`` when it is an int (not a bool), else ValueError naming ``name``."""
    if type(value) is not int:
        raise ValueError(f"{name}: expected an int, got {value!r}")
    return value
