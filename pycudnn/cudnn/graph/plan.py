"""From a graph to something that runs: engine configs from cuDNN's heuristics (modes A, B,
FALLBACK; deduplicated; `iter_engine_configs()` describes each only when it is reached, with
receivers each thread reuses across shapes), filtering by numerical and behaviour notes, and
`ExecutionPlan` (the finalized plan, executed with reusable variant packs: the hot path).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable, Iterator, Mapping, NoReturn, Sequence

import numpy.typing as npt

from ...errors import CudnnError, NoAlgorithmError, PycudnnError
from ...ffi import library as _lib
from ...ffi.backend import (
    Attr,
    AttrType,
    BackendDescriptor,
    BehaviorNote,
    ClosedDescriptorError,
    DescriptorType,
    HeurMode,
    KnobType,
    NumericalNote,
    to_data_type,
)
from ...runtime.memory.replay import Replays
from .build import DT_FLOAT, OperationGraph

#: how many knob-choice receivers to pass (cuDNN 9.28 knows 46 knob types)
_KNOB_POOL_SIZE = 64
# variant-pack attributes and their C types, for the prebuilt-array path in ExecutionPlan
_VP_UIDS, _VP_PTRS, _VP_WORKSPACE = (int(Attr.VARIANT_PACK_UNIQUE_IDS),
                                     int(Attr.VARIANT_PACK_DATA_POINTERS),
                                     int(Attr.VARIANT_PACK_WORKSPACE))
_T_INT64, _T_VOID_PTR = int(AttrType.INT64), int(AttrType.VOID_PTR)
_NOTES_MAX = 32


def _enum_or_int(cls: type[IntEnum], v: int) -> int:
    try:
        return cls(v)
    except ValueError:
        return int(v)


@dataclass(eq=False)
class EngineConfig:
    """One candidate: a finalized engine-config descriptor and what the engine says about itself.

    ``key`` (engine id + sorted knob choices) identifies it across processes (a tuning database
    can store it and `from_key()` rebuilds it).
    """
    descriptor: BackendDescriptor
    graph: OperationGraph
    engine_id: int
    knobs: tuple[tuple[int, int], ...]
    numerical_notes: tuple[int, ...]
    behavior_notes: tuple[int, ...]
    mode: str = ""
    rank: int = 0

    @property
    def key(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        return self.engine_id, tuple(sorted((int(t), int(v)) for t, v in self.knobs))

    @property
    def tag(self) -> str:
        """cudnn-frontend style name, e.g. ``eng41_k2=3_k13=0``."""
        return f"eng{self.engine_id}" + "".join(f"_k{t}={v}" for t, v in self.key[1])

    @property
    def runtime_compiled(self) -> bool:
        return BehaviorNote.RUNTIME_COMPILATION in self.behavior_notes

    @property
    def tensor_core(self) -> bool:
        return NumericalNote.TENSOR_CORE in self.numerical_notes

    @property
    def nondeterministic(self) -> bool:
        return NumericalNote.NONDETERMINISTIC in self.numerical_notes

    def close(self) -> None:
        self.descriptor.close()

    def __repr__(self) -> str:
        notes = ",".join(getattr(n, "name", str(n)) for n in self.numerical_notes)
        beh = ",".join(getattr(n, "name", str(n)) for n in self.behavior_notes)
        return f"<EngineConfig {self.tag} mode={self.mode} notes=[{notes}] behavior=[{beh}]>"

    @classmethod
    def from_key(cls, graph: OperationGraph, engine_id: int,
                 knobs: Iterable[tuple[int, int]] = ()) -> "EngineConfig":
        """Rebuild a config from its engine id and knob choices (no heuristics)."""
        engine = BackendDescriptor(DescriptorType.ENGINE)
        made: list[BackendDescriptor] = [engine]
        try:
            engine.set_descriptor(Attr.ENGINE_OPERATION_GRAPH, graph.descriptor)
            engine.set_int64(Attr.ENGINE_GLOBAL_INDEX, engine_id)
            engine.finalize()
            choices = []
            knobs = tuple((int(t), int(v)) for t, v in knobs)
            for t, v in knobs:
                kc = BackendDescriptor(DescriptorType.KNOB_CHOICE)
                made.append(kc)
                kc.set_enum(Attr.KNOB_CHOICE_KNOB_TYPE, t)
                kc.set_int64(Attr.KNOB_CHOICE_KNOB_VALUE, v)
                kc.finalize()
                choices.append(kc)
            cfg = BackendDescriptor(DescriptorType.ENGINECFG)
            made.append(cfg)
            cfg.set_descriptor(Attr.ENGINECFG_ENGINE, engine)
            if choices:
                cfg.set_descriptors(Attr.ENGINECFG_KNOB_CHOICES, choices)
            cfg.finalize()
            num = tuple(engine.get_enums(Attr.ENGINE_NUMERICAL_NOTE, _NOTES_MAX))
            beh = tuple(engine.get_enums(Attr.ENGINE_BEHAVIOR_NOTE, _NOTES_MAX))
        except BaseException:
            for d in made:
                d.close()
            raise
        return cls(cfg, graph, int(engine_id),
                   tuple((_enum_or_int(KnobType, t), v) for t, v in knobs), num, beh, "key", 0)


class CandidateList(list[EngineConfig]):
    """A list of `EngineConfig` with ``problems``: what went wrong while collecting it
    (a heuristic mode that failed, a config that could not be read)."""

    def __init__(self, items: Iterable[EngineConfig] = (),
                 problems: Iterable[str] | None = None) -> None:
        super().__init__(items)
        self.problems: list[str] = list(problems or [])


_MODE_NAMES = {"A": HeurMode.A, "B": HeurMode.B, "FALLBACK": HeurMode.FALLBACK,
               "INSTANT": HeurMode.INSTANT}


class _Receivers(threading.local):
    """This thread's `_KNOB_POOL_SIZE` KNOB_CHOICE receivers for describing heuristic results,
    made on the thread's first description and reused for every config of every later shape
    (cuDNN copies into them; their content is read at once)."""

    knobs: list[BackendDescriptor] | None = None


_receivers = _Receivers()


def _fresh_knobs(old: list[BackendDescriptor] | None) -> list[BackendDescriptor]:
    fresh = [BackendDescriptor(DescriptorType.KNOB_CHOICE) for _ in range(_KNOB_POOL_SIZE)]
    for k in old or ():
        k.close()
    _receivers.knobs = fresh
    return fresh


def _describe(cfg: BackendDescriptor
              ) -> tuple[int, tuple[tuple[int, int], ...], tuple[int, ...], tuple[int, ...]]:
    engine = cfg.get_descriptor(Attr.ENGINECFG_ENGINE, DescriptorType.ENGINE)
    try:
        eid = engine.get_int64(Attr.ENGINE_GLOBAL_INDEX)
        num = tuple(engine.get_enums(Attr.ENGINE_NUMERICAL_NOTE, _NOTES_MAX))
        beh = tuple(engine.get_enums(Attr.ENGINE_BEHAVIOR_NOTE, _NOTES_MAX))
    finally:
        engine.close()
    knob_pool = _receivers.knobs or _fresh_knobs(None)
    try:
        n = cfg.fill_descriptors(Attr.ENGINECFG_KNOB_CHOICES, knob_pool)
    except CudnnError:
        # receivers reused from an earlier config refused: retry once with fresh ones
        knob_pool = _fresh_knobs(knob_pool)
        n = cfg.fill_descriptors(Attr.ENGINECFG_KNOB_CHOICES, knob_pool)
    knobs = []
    for kc in knob_pool[:n]:
        t = kc.get_enum(Attr.KNOB_CHOICE_KNOB_TYPE)
        v = kc.get_int64(Attr.KNOB_CHOICE_KNOB_VALUE)
        knobs.append((t, v))
    return eid, tuple(knobs), num, beh


def _mode_enums(modes: Sequence[str | HeurMode]) -> list[tuple[str, HeurMode]]:
    if isinstance(modes, str):
        modes = (modes,)
    out = []
    for m in modes:
        key = m.name if isinstance(m, HeurMode) else str(m).upper()
        if key not in _MODE_NAMES:
            raise ValueError(f"unknown heuristic mode {m!r}; expected one of {sorted(_MODE_NAMES)}")
        out.append((key, _MODE_NAMES[key]))
    return out


class LazyCandidates(Iterator[EngineConfig]):
    """Candidate engine configs from cuDNN's heuristics, produced one at a time: each mode is
    queried when the configs before it are used up, and each config is described (engine id,
    knobs, notes: a dozen ``cudnnBackendGetAttribute`` calls) only when it is reached, so a
    caller that stops at the first usable one describes no more. Order and deduplication are
    `engine_configs()`'s; ``problems`` grows as modes or configs fail. `close()` frees the
    configs not reached yet."""

    def __init__(self, graph: OperationGraph, modes: Sequence[str | HeurMode]) -> None:
        if not isinstance(graph, OperationGraph):
            raise TypeError(f"graph must be an OperationGraph, got {type(graph).__name__}")
        self.graph = graph
        self.problems: list[str] = []
        self._modes = _mode_enums(modes)
        self._seen: set[tuple[int, tuple[tuple[int, int], ...]]] = set()
        self._pending: list[BackendDescriptor] = []  # this mode's results not reached yet
        self._mode = ""
        self._rank = 0

    def __iter__(self) -> "LazyCandidates":
        return self

    def _query(self, name: str, mode: HeurMode) -> None:
        heur = BackendDescriptor(DescriptorType.ENGINEHEUR)
        try:
            heur.set_descriptor(Attr.ENGINEHEUR_OPERATION_GRAPH, self.graph.descriptor)
            heur.set_enum(Attr.ENGINEHEUR_MODE, mode)
            heur.finalize()
            count = heur.get_count(Attr.ENGINEHEUR_RESULTS)
            cfgs = heur.get_descriptors(Attr.ENGINEHEUR_RESULTS, DescriptorType.ENGINECFG, count)
        except CudnnError as exc:
            self.problems.append(f"heuristics mode {name}: {exc}")
            cfgs = []
        finally:
            heur.close()
        cfgs.reverse()  # popped from the end, best first
        self._pending, self._mode, self._rank = cfgs, name, 0

    def __next__(self) -> EngineConfig:
        while True:
            if not self._pending:
                if not self._modes:
                    raise StopIteration
                self._query(*self._modes.pop(0))
                continue
            cfg = self._pending.pop()
            rank = self._rank
            self._rank += 1
            try:
                eid, knobs, num, beh = _describe(cfg)
            except CudnnError as exc:
                self.problems.append(f"mode {self._mode} result {rank}: {exc}")
                cfg.close()
                continue
            c = EngineConfig(cfg, self.graph, eid, knobs, num, beh, self._mode, rank)
            if c.key in self._seen:
                cfg.close()
                continue
            self._seen.add(c.key)
            return c

    def close(self) -> None:
        """Free the configs not reached yet, and query no further mode."""
        for cfg in self._pending:
            cfg.close()
        self._pending = []
        self._modes = []


def iter_engine_configs(handle: int, graph: OperationGraph,
                        modes: Sequence[str | HeurMode] = ("A", "B", "FALLBACK")) -> LazyCandidates:
    """`engine_configs()` as a `LazyCandidates`: described as they are reached."""
    return LazyCandidates(graph, modes)


def engine_configs(handle: int, graph: OperationGraph,
                   modes: Sequence[str | HeurMode] = ("A", "B", "FALLBACK")) -> CandidateList:
    """Candidate engine configs from cuDNN's heuristics, in the order of ``modes`` and then of
    each mode's ranking, deduplicated by `EngineConfig.key`, every one described (see
    `iter_engine_configs()` for the lazy form).

    A mode that fails is recorded in ``problems`` and skipped (the others still answer).
    """
    lazy = LazyCandidates(graph, modes)
    out = CandidateList(lazy)
    out.problems = lazy.problems
    return out


def candidate_refusal(c: EngineConfig, is_float32: bool, allow_tf32: bool,
                      deterministic: bool) -> str | None:
    """Why `filter_candidates()` drops ``c`` (None: kept); ``is_float32``: the data is float32."""
    notes = c.numerical_notes
    if NumericalNote.DOWN_CONVERT_INPUTS in notes:
        return "DOWN_CONVERT_INPUTS"
    if is_float32 and not allow_tf32 and NumericalNote.TENSOR_CORE in notes:
        return "TENSOR_CORE with float32 and allow_tf32=False"
    if deterministic and NumericalNote.NONDETERMINISTIC in notes:
        return "NONDETERMINISTIC with deterministic=True"
    return None


def filter_candidates(cands: Iterable[EngineConfig], dtype: int | npt.DTypeLike, allow_tf32: bool,
                      deterministic: bool) -> tuple[list[EngineConfig], list[tuple[EngineConfig, str]]]:
    """Drop candidates the way PyTorch's v8 path does: DOWN_CONVERT_INPUTS engines always;
    TENSOR_CORE engines for float32 data when TF32 is not allowed; NONDETERMINISTIC engines when
    determinism is asked for. Returns ``(kept, [(dropped, reason), ...])``."""
    is_float32 = to_data_type(dtype) == DT_FLOAT
    kept, dropped = [], []
    for c in cands:
        why = candidate_refusal(c, is_float32, allow_tf32, deterministic)
        if why is None:
            kept.append(c)
        else:
            dropped.append((c, why))
    return kept, dropped


class ExecutionPlan:
    """An execution plan built from an `EngineConfig` (lazily: call `finalize()`).

    After finalize: ``workspace_size`` (bytes), ``finalize_time`` (seconds), ``engine_id``,
    ``knobs``, ``notes`` (numerical), ``behavior_notes``, ``runtime_compiled``.
    """

    def __init__(self, config: EngineConfig, max_packs: int = 8) -> None:
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        if max_packs < 1:
            raise ValueError("max_packs must be >= 1")
        self.config = config
        self.graph = config.graph
        self.uids = config.graph.uids
        self._alignments = config.graph.alignments
        self._names = tuple(config.graph.specs)
        self.max_packs = int(max_packs)
        self.descriptor: BackendDescriptor | None = None
        self.workspace_size: int | None = None
        self.finalize_time: float | None = None
        self._plan_ptr: int | None = None
        self._exec: Any = None  # cudnnBackendExecute (a ctypes function) once finalized
        self._packs: OrderedDict[tuple[Sequence[int], int], BackendDescriptor] = OrderedDict()
        self._lock = threading.Lock()
        #: this plan's repeated launches as CUDA graphs (the engines' launchers use them)
        self.replays = Replays()

    # -- facts ---------------------------------------------------------------------------------
    engine_id = property(lambda self: self.config.engine_id)
    knobs = property(lambda self: self.config.knobs)
    notes = property(lambda self: self.config.numerical_notes)
    behavior_notes = property(lambda self: self.config.behavior_notes)
    runtime_compiled = property(lambda self: self.config.runtime_compiled)
    tag = property(lambda self: self.config.tag)
    key = property(lambda self: self.config.key)

    @property
    def finalized(self) -> bool:
        return self._plan_ptr is not None

    def __repr__(self) -> str:
        state = (f"workspace={self.workspace_size} finalize={self.finalize_time * 1e3:.2f}ms"
                 if self.finalized and self.finalize_time is not None else "not finalized")
        return f"<ExecutionPlan {self.tag} {state}>"

    # -- building ------------------------------------------------------------------------------

    def finalize(self, handle: int) -> "ExecutionPlan":
        """Build the plan (may compile kernels: see ``runtime_compiled``). Idempotent."""
        if self._plan_ptr is not None:
            return self
        if self.graph.closed:
            raise ClosedDescriptorError("ExecutionPlan.finalize: its operation graph was closed")
        d = BackendDescriptor(DescriptorType.EXECUTION_PLAN)
        try:
            d.set_handle(Attr.EXECUTION_PLAN_HANDLE, handle)
            d.set_descriptor(Attr.EXECUTION_PLAN_ENGINE_CONFIG, self.config.descriptor)
            t0 = time.perf_counter()
            d.finalize()
            self.finalize_time = time.perf_counter() - t0
            self.workspace_size = d.get_int64(Attr.EXECUTION_PLAN_WORKSPACE_SIZE)
        except CudnnError as exc:
            d.close()
            raise exc.add_context(f"plan: {self.tag} for {self.graph.description}")
        except BaseException:
            d.close()
            raise
        self._adopt(d)
        return self

    def _adopt(self, d: BackendDescriptor) -> None:
        L = _lib.lib()
        self.descriptor = d
        self._exec = L.cudnnBackendExecute
        self._setattr = L.cudnnBackendSetAttribute
        self._finalize_fn = L.cudnnBackendFinalize
        all_uids = self.uids + self.graph.by_value_uids
        self._uid_array = (ctypes.c_int64 * len(all_uids))(*all_uids)
        self._plan_ptr = d.ptr

    @classmethod
    def from_json(cls, handle: int, graph: OperationGraph, text: str,
                  max_packs: int = 8) -> "ExecutionPlan":
        """Deserialize a plan saved with `json()` (same cuDNN version and device); ``graph``
        supplies the uids the variant packs use, so it must be the graph the plan was made for.

        Only for JSON this process trusts: the text carries the plan's own tensors, and nothing
        here proves they are ``graph``'s (pycudnn's tuning database never stores or loads plan
        JSON for that reason; it rebuilds plans with `EngineConfig.from_key()`).

        Raises:
            CudnnError: cuDNN does not take the text, or the plan's engine config (and so its
                notes) cannot be read.
        """
        d = BackendDescriptor(DescriptorType.EXECUTION_PLAN)
        try:
            d.set_handle(Attr.EXECUTION_PLAN_HANDLE, handle)
            d.set_chars(Attr.EXECUTION_PLAN_JSON_REPRESENTATION, text)
            t0 = time.perf_counter()
            d.finalize()
            elapsed = time.perf_counter() - t0
            ws = d.get_int64(Attr.EXECUTION_PLAN_WORKSPACE_SIZE)
        except BaseException:
            d.close()
            raise
        cfg_desc = None
        try:  # the engine config the plan carries, to report engine id and notes
            cfg_desc = d.get_descriptor(Attr.EXECUTION_PLAN_ENGINE_CONFIG, DescriptorType.ENGINECFG)
            eid, knobs, num, beh = _describe(cfg_desc)
            cfg = EngineConfig(cfg_desc, graph, eid, knobs, num, beh, "json", 0)
        except BaseException:
            # no engine config, no notes: nothing to check the plan against (never run it)
            if cfg_desc is not None:
                cfg_desc.close()
            d.close()
            raise
        plan = cls(cfg, max_packs)
        plan.finalize_time = elapsed
        plan.workspace_size = ws
        plan._adopt(d)
        return plan

    def json(self) -> str:
        """The plan's JSON representation (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION)."""
        if self.descriptor is None:
            raise PycudnnError("ExecutionPlan.json: finalize the plan first")
        return self.descriptor.get_json()

    # -- running -------------------------------------------------------------------------------

    def execute(self, handle: int, ptrs: Sequence[int] | Mapping[int | str, int],
                workspace: int = 0) -> None:
        """Run the plan on ``handle``'s stream.

        Args:
            handle: cudnnHandle_t (int); one per thread.
            ptrs: device pointers as a tuple ordered like `uids` (x, w, y[, z][, b]) -
                the fast path - or a mapping from uid or name ("x", "w", ...) to pointer.
            workspace: device pointer of at least ``workspace_size`` bytes (0 if none needed).
        """
        if ptrs.__class__ is not tuple:
            ptrs = self._order(ptrs)
        key = (ptrs, workspace)
        packs = self._packs
        vp = packs.get(key)
        if vp is None:
            vp = self._new_pack(ptrs, workspace)
        else:
            try:
                packs.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile; vp stays valid (we hold it)
                pass
        status = self._exec(handle, self._plan_ptr, vp._ptr)
        if status:
            self._raise_exec(status, ptrs, workspace)

    def _order(self, ptrs: Sequence[int] | Mapping[int | str, int]) -> tuple[int, ...]:
        if isinstance(ptrs, Mapping):
            out = []
            for uid, name in zip(self.uids, self._names):
                if uid in ptrs:
                    out.append(ptrs[uid])
                elif name in ptrs:
                    out.append(ptrs[name])
                else:
                    raise KeyError(f"ExecutionPlan.execute: no pointer for tensor {name!r} "
                                   f"(uid {uid}); expected keys {dict(zip(self._names, self.uids))}")
            return tuple(out)
        if isinstance(ptrs, (list, Sequence)) and not isinstance(ptrs, (str, bytes)):
            return tuple(ptrs)
        raise TypeError(f"ExecutionPlan.execute: ptrs must be a tuple ordered like uids "
                        f"{self.uids} or a mapping uid/name -> pointer, got {type(ptrs).__name__}")

    def _new_pack(self, ptrs: Sequence[int], workspace: int) -> BackendDescriptor:
        if self._plan_ptr is None:
            if self.descriptor is not None:
                raise ClosedDescriptorError("ExecutionPlan used after close()")
            raise PycudnnError("ExecutionPlan.execute: call finalize(handle) first")
        if len(ptrs) != len(self.uids):
            raise ValueError(f"ExecutionPlan.execute: {len(ptrs)} pointers given, the graph has "
                             f"{len(self.uids)} tensors {dict(zip(self._names, self.uids))}")
        key = (ptrs, workspace)
        if any(type(p) is not int for p in ptrs):  # numpy integers and other __index__ types
            norm = []
            for name, p in zip(self._names, ptrs):
                if isinstance(p, bool) or not hasattr(p, "__index__"):
                    raise TypeError(f"ExecutionPlan.execute: pointer for {name!r} must be an "
                                    f"int, got {p!r}")
                norm.append(p.__index__())
            ptrs = tuple(norm)
        if type(workspace) is not int and hasattr(workspace, "__index__") \
                and not isinstance(workspace, bool):
            workspace = workspace.__index__()
        for name, p, align in zip(self._names, ptrs, self._alignments):
            if p <= 0 or p >= 1 << 64:
                raise ValueError(f"ExecutionPlan.execute: pointer for {name!r} is not a valid "
                                 f"device address: {p:#x}")
            if p % align:
                raise ValueError(f"ExecutionPlan.execute: pointer for {name!r} ({p:#x}) is not "
                                 f"{align}-byte aligned as the graph declares")
        if isinstance(workspace, bool) or not isinstance(workspace, int) or workspace < 0:
            raise TypeError(f"ExecutionPlan.execute: workspace must be a device pointer (int), "
                            f"got {workspace!r}")
        if self.workspace_size and not workspace:
            raise ValueError(f"ExecutionPlan.execute: plan {self.tag} needs a workspace of "
                             f"{self.workspace_size} bytes")
        vp = BackendDescriptor(DescriptorType.VARIANT_PACK)
        # Arguments were validated above: set the three attributes with prebuilt ctypes arrays
        # (the generic typed setters would re-validate every element).
        all_ptrs = (*ptrs, *self.graph.by_value_ptrs)
        n = len(all_ptrs)
        setattr_ = self._setattr
        p = vp.ptr
        st = setattr_(p, _VP_UIDS, _T_INT64, n, self._uid_array)
        if not st:
            st = setattr_(p, _VP_PTRS, _T_VOID_PTR, n, (ctypes.c_void_p * n)(*all_ptrs))
        if not st:
            st = setattr_(p, _VP_WORKSPACE, _T_VOID_PTR, 1, ctypes.byref(ctypes.c_void_p(workspace)))
        if not st:
            st = self._finalize_fn(p)
        if st:
            try:  # raise first: cuDNN's reason is read before the destroy call
                _lib.raise_status(st, "variant pack (cudnnBackendSetAttribute/Finalize)",
                                  f"plan: {self.tag}",
                                  f"uids: {self.uids + self.graph.by_value_uids}")
            finally:
                vp.close()
        vp.finalized = True
        with self._lock:
            packs = self._packs
            packs[key] = vp  # the caller's key: equal ints hash alike, so later hits find it
            while len(packs) > self.max_packs:
                packs.popitem(last=False)  # dropped, not closed: a thread may still hold it
        return vp

    def _raise_exec(self, status: int, ptrs: Sequence[int], workspace: int) -> NoReturn:
        if self._plan_ptr is None:
            raise ClosedDescriptorError("ExecutionPlan used after close()")
        _lib.raise_status(status, "cudnnBackendExecute",
                          f"plan: {self.tag} for {self.graph.description}",
                          f"pointers: {dict(zip(self._names, (hex(p) for p in ptrs)))} "
                          f"workspace: {workspace:#x} ({self.workspace_size} bytes needed)")

    @property
    def cached_packs(self) -> int:
        """How many variant packs the LRU holds."""
        return len(self._packs)

    def clear_packs(self) -> None:
        """Forget cached variant packs (call when buffers they point to are freed and reused
        for something else is harmless: packs are keyed by the pointers themselves)."""
        with self._lock:
            self._packs = OrderedDict()
        self.replays.clear()

    def close(self) -> None:
        """Destroy the plan, its cached variant packs and its launch graphs (idempotent)."""
        with self._lock:
            self._plan_ptr = None
            self._packs = OrderedDict()
        self.replays.clear()  # before the plan: a graph's kernels may live in its modules
        if self.descriptor is not None:
            self.descriptor.close()

    def __enter__(self) -> "ExecutionPlan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def first_plan(handle: int, candidates: Iterable[EngineConfig], max_attempts: int | None = None,
               skip_runtime_compiled: bool = False
               ) -> tuple[ExecutionPlan, list[tuple[str, str]]]:
    """Finalize candidates in order until one works; returns ``(plan, failures)`` where
    failures are ``(tag, reason)`` of the ones that did not. Raises NoAlgorithmError if none."""
    failures: list[tuple[str, str]] = []
    tried = 0
    for c in candidates:
        if skip_runtime_compiled and c.runtime_compiled:
            failures.append((c.tag, "skipped: runtime compiled"))
            continue
        if max_attempts is not None and tried >= max_attempts:
            break
        tried += 1
        plan = ExecutionPlan(c)
        try:
            return plan.finalize(handle), failures
        except CudnnError as exc:
            failures.append((c.tag, f"{exc.status_name}: {exc.reason}"))
    raise NoAlgorithmError(f"no engine config finalized ({len(failures)} tried)", failures)
