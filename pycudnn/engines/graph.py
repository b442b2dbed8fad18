"""The graph engine: cuDNN's backend API behind the same search contract as the v7 engine.

`GraphEngine` supplies candidates and runs one; the cache key, the per-direction caches,
the iterator with its fallbacks, the guards and the batch splitting are those of
`pycudnn.search` and `pycudnn.api.conv`. Only the search differs:

* candidates are cuDNN's heuristics (modes A, B and FALLBACK, in that order), every engine config
  with its knob choices, filtered by their notes as PyTorch does (no down-converting engines; no
  tensor cores for strict float32; no non-deterministic engines when asked);
* without ``benchmark`` the first candidate whose plan finalizes and runs is taken (plans are
  finalized lazily, in order);
* with ``benchmark`` the first ``benchmark_limit`` precompiled candidates (all of them, the
  runtime-compiled ones too, with ``benchmark_limit=None``), within a time budget, are
  finalized and timed on the caller's stream held on a GPU-side gate, so that no host launch
  gap is timed (`pycudnn.runtime.gate`), and the candidates are ranked by that time.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from .._types import MathType
from ..cudnn.graph.build import (DT_FLOAT, Epilogue, OperationGraph, TensorSpec, bias_spec,
                                 build_convolution_graph, nchw_strides, nhwc_strides)
from ..cudnn.graph.plan import (EngineConfig, ExecutionPlan, LazyCandidates, candidate_refusal,
                                filter_candidates, iter_engine_configs)
from ..ffi.backend import to_data_type
from ..errors import CudnnError, NoAlgorithmError, OutOfMemoryError
from ..runtime.memory import (allocate, event_create, event_destroy, event_elapsed_ms, event_record,
                              event_synchronize, mem_get_info, stream_synchronize)
from ..runtime.handle import set_handle_stream
from ..runtime.memory.capture import is_capturing
from ..runtime.memory.replay import settings as replay_settings
from ..runtime.memory.workspaces import thread_workspace
from .contract import Engine, check_precision, error_if_capturing, release, workspace
from .problem import ConvolutionArgs, ConvolutionParams, EpilogueKind, written_bytes
from .stored import (INT64_MAX, INT_MAX, brief, checked_int, checked_ints, checked_record,
                     checked_text)

if TYPE_CHECKING:
    from ..runtime.gate import StreamGate

__all__ = ["GraphEngine", "GraphRecord", "GraphChoice", "BENCHMARK_TIME_BUDGET_S", "HEURISTIC_MODES"]

log = logging.getLogger("pycudnn")

#: heuristics modes asked, in order of preference
HEURISTIC_MODES = ("A", "B", "FALLBACK")
#: wall-clock seconds one benchmark search may spend timing candidates (the rest are kept, untimed,
#: as fallbacks after the timed ones)
BENCHMARK_TIME_BUDGET_S = 10.0
#: ungated timing (no gate on this GPU): trials of back-to-back runs each
_TRIALS, _REPS = 3, 3
#: gated timing: rounds over the contenders, and the GPU time (ms) each candidate's runs span
#: (2 rounds chose the same plans as 3 on the first-result shapes, within 0.7%, the search
#: taking 8.2 ms a shape against 10.0: benchmarks/probes/measured_search_pieces.py)
_ROUNDS, _GATED_SPAN_MS = 2, 0.1
#: a candidate whose first gated run took more than this times the fastest one's is not timed
#: further (one run behind the gate has no launch gap: a 1.25x difference is not noise)
PRUNE_FACTOR = 1.25
#: a precompiled plan this much slower than a runtime-compiled best is preferred (see _measure)
PRECOMPILED_PREFERENCE = 0.03

_UID = {"x": 1, "w": 2, "y": 3, "z": 4, "b": 5}


@dataclass(eq=False)
class GraphRecord:
    """One candidate plan of the graph engine (finalized on first use)."""

    plan: ExecutionPlan
    direction: str
    time_ms: float = -1.0
    source: str = "heuristics"
    mode: str = ""
    graph_index: int = 0  # which of the equivalent graphs (0: alpha on ALPHA2, 1: alpha as a multiply)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def workspace(self) -> int:
        """Bytes of workspace (0 until the plan is finalized)."""
        return self.plan.workspace_size or 0

    @property
    def fused(self) -> bool:
        return self.plan.graph.epilogue is not None

    def finalize(self, handle: int) -> ExecutionPlan:
        if not self.plan.finalized:
            with self._lock:
                self.plan.finalize(handle)
                if self.plan.runtime_compiled:
                    log.info("graph engine: %s compiled at run time in %.1f ms",
                             self.plan.tag, (self.plan.finalize_time or 0) * 1e3)
        return self.plan

    def describe(self) -> str:
        t = f", {self.time_ms:.4f} ms" if self.time_ms >= 0 else ""
        ws = f"workspace={self.plan.workspace_size} B" if self.plan.finalized else "not finalized"
        notes = ",".join(getattr(n, "name", str(n)) for n in self.plan.notes)
        rc = ", runtime-compiled" if self.plan.runtime_compiled else ""
        return (f"graph {self.plan.tag} (mode {self.mode}, {ws}{t}, notes=[{notes}]{rc}, "
                f"{self.source}) for {self.plan.graph.description}")


@dataclass(frozen=True)
class GraphChoice:
    """What the tuning database keeps of a `GraphRecord`: its identity as a frozen value (as
    cudnn-frontend's ``PlanConfig``): which graph, the engine id and the knob choices, read back
    with `from_stored`, which checks every field."""

    graph: int
    engine_id: int
    knobs: tuple[tuple[int, int], ...]
    workspace: int
    tag: str | None = None        # None: not stored
    time_ms: float | None = None  # None: not measured

    @classmethod
    def from_stored(cls, data: Any, params: ConvolutionParams) -> "GraphChoice":
        """The choice ``data`` (a stored record for ``params``) holds, once exactly the fields
        `to_stored` writes are there, each of its type and range (a ``plan_json`` written by
        earlier versions is accepted and left out: plans are rebuilt from engine id and knobs).

        Raises:
            TypeError, ValueError: naming the first field that is wrong.
        """
        graphs = 2 if params.epilogue == "add_relu" and params.alpha != 1.0 else 1

        def knobs(v: Any) -> tuple[tuple[int, int], ...]:
            if not isinstance(v, list) or len(v) > 64:
                raise TypeError(f"record.knobs: expected a list of at most 64 [type, value] pairs, "
                                f"got {brief(v)}")
            out = []
            for kv in v:
                t, value = checked_ints("record.knobs[]", kv, 2, -INT64_MAX - 1, INT64_MAX)
                out.append((checked_int("record.knobs[] type", t, 0, INT_MAX), value))
            return tuple(out)

        fields = checked_record(data, "graph", {
            "graph": (True, lambda v: checked_int("record.graph", v, 0, graphs - 1)),
            "engine_id": (True, lambda v: checked_int("record.engine_id", v, 0, INT_MAX)),
            "knobs": (True, knobs),
            "workspace": (True, lambda v: checked_int("record.workspace", v, 0)),
            "tag": (False, lambda v: checked_text("record.tag", v, 1024)),
            "plan_json": (False, lambda v: checked_text("record.plan_json", v, 8 << 20,
                                                        printable=False))})
        fields.pop("plan_json", None)
        return cls(**fields)

    def to_stored(self) -> dict[str, Any]:
        """The record as the tuning database keeps it (JSON data; fields not known left out)."""
        out: dict[str, Any] = {"graph": self.graph, "engine_id": self.engine_id,
                               "knobs": [list(kv) for kv in self.knobs], "workspace": self.workspace}
        if self.tag is not None:
            out["tag"] = self.tag
        if self.time_ms is not None:
            out["time_ms"] = self.time_ms
        return out


def _weight_strides(params: ConvolutionParams) -> tuple[int, ...]:
    return nhwc_strides(params.weight_shape) if params.weight_format == "NHWC" else nchw_strides(params.weight_shape)


class _KeyGraphs:
    """The operation graph(s) of one ConvolutionParams and its candidates, per heuristics mode,
    built on first need: without benchmark, mode B (25-38 ms of heuristics per graph on an H200)
    is asked only when every candidate of mode A failed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.graphs: list[OperationGraph] | None = None
        self.by_mode: dict[tuple[int, str], _ModeCandidates] = {}
        self.seen: set = set()
        self.dropped: list[tuple[str, str]] = []
        self.problems: list[str] = []


class _ModeCandidates:
    """One heuristics mode's candidates of one graph: the records that passed so far, in order,
    and the configs not described yet (``source``; None once used up)."""

    def __init__(self, source: LazyCandidates) -> None:
        self.records: list[GraphRecord] = []
        self.source: LazyCandidates | None = source
        self.problems_copied = 0  # how many of ``source.problems`` are in the key's problems


class GraphEngine(Engine):
    """The graph (backend API) engine."""

    name = "graph"
    #: deterministic without benchmark still searches (deterministic engines only) and caches;
    #: the v7 rule of one fixed default algorithm belongs to the legacy API.
    deterministic_uses_default = False
    epilogues = frozenset(EpilogueKind)
    cached_workspace = True  # replays (launcher) reuse this thread's workspace

    def __init__(self, max_keys: int = 512) -> None:
        self._key_graphs: OrderedDict[ConvolutionParams, _KeyGraphs] = OrderedDict()
        self._lock = threading.Lock()
        self.max_keys = max_keys

    def clear(self) -> None:
        with self._lock:
            self._key_graphs.clear()

    # -- graphs -----------------------------------------------------------------------------
    def _specs(self, p: ConvolutionParams) -> dict[str, TensorSpec]:
        al = dict(zip("xwyzb", p.alignments)) if p.alignments else {}
        specs = {
            "x": TensorSpec(_UID["x"], p.input_shape, p.input_strides, p.dtype, alignment=al.get("x", 16)),
            "w": TensorSpec(_UID["w"], p.weight_shape, _weight_strides(p), p.dtype, alignment=al.get("w", 16)),
            "y": TensorSpec(_UID["y"], p.output_shape, p.output_strides, p.dtype, alignment=al.get("y", 16)),
        }
        kind = EpilogueKind(p.epilogue)
        if kind.has_z:
            assert p.z_strides is not None  # ConvolutionParams with a z epilogue always carry its strides
            specs["z"] = TensorSpec(_UID["z"], p.output_shape, p.z_strides, p.dtype, alignment=al.get("z", 16))
        if kind.has_bias:
            specs["b"] = bias_spec(_UID["b"], p.output_shape[1], len(p.output_shape), p.dtype,
                                   alignment=al.get("b", 16))
        return specs

    def _epilogues(self, p: ConvolutionParams, specs: dict[str, TensorSpec]) -> list[Epilogue | None]:
        kind = EpilogueKind(p.epilogue)
        if kind is EpilogueKind.NONE:
            return [None]
        if kind in (EpilogueKind.BIAS, EpilogueKind.BIAS_RELU):
            return [Epilogue(bias=specs["b"], relu=kind is EpilogueKind.BIAS_RELU)]
        first = Epilogue(z=specs["z"], alpha=p.alpha, bias=specs["b"], relu=True)
        if p.alpha == 1.0:
            return [first]
        # alpha on the add's ALPHA2 first; else alpha as a multiply by a by-value scalar
        return [first, Epilogue(z=specs["z"], alpha=p.alpha, bias=specs["b"], relu=True, alpha_mode="mul")]

    def key_graphs(self, args: ConvolutionArgs) -> _KeyGraphs:
        p = args.params
        prep = self._key_graphs.get(p)
        if prep is None:
            with self._lock:
                prep = self._key_graphs.get(p)
                if prep is None:
                    prep = self._key_graphs[p] = _KeyGraphs()
                    while len(self._key_graphs) > self.max_keys:
                        self._key_graphs.popitem(last=False)
        return prep

    def _graphs(self, args: ConvolutionArgs, prep: _KeyGraphs) -> list[OperationGraph]:
        if prep.graphs is None:
            p = args.params
            specs = self._specs(p)
            graphs = []
            for ep in self._epilogues(p, specs):
                try:
                    graphs.append(build_convolution_graph(
                        args.handle, p.direction, specs["x"], specs["w"], specs["y"], p.padding,
                        p.stride, p.dilation, None, ep))
                except CudnnError as exc:
                    prep.problems.append(f"graph {ep.alpha_mode if ep else ''}: {exc}".strip())
            prep.graphs = graphs
        return prep.graphs

    def _mode(self, args: ConvolutionArgs, prep: _KeyGraphs, gi: int, mode: str) -> Iterator[GraphRecord]:
        """The candidates of graph ``gi`` from one heuristics mode, deduplicated and filtered,
        each config described only when the caller asks for the next one.

        The records made so far are kept (`_ModeCandidates`): a later search of the key, or
        another thread, gets the same records in the same order, then goes on describing where
        the furthest one stopped. Configs are taken and checked under ``prep.lock``; records are
        yielded outside it, so a caller finalizing or running one holds no lock.
        """
        key = (gi, mode)
        with prep.lock:
            state = prep.by_mode.get(key)
            if state is None:
                g = self._graphs(args, prep)[gi]
                state = prep.by_mode[key] = _ModeCandidates(
                    iter_engine_configs(args.handle, g, (mode,)))
        i = 0
        while True:
            with prep.lock:
                if i >= len(state.records) and not self._next_record(args, prep, gi, mode, state):
                    return
                rec = state.records[i]
            i += 1
            yield rec

    @staticmethod
    def _next_record(args: ConvolutionArgs, prep: _KeyGraphs, gi: int, mode: str,
                     state: _ModeCandidates) -> bool:
        """Describe configs of ``state`` until one passes (appended to ``state.records``: True)
        or none is left (False). Called under ``prep.lock``."""
        source = state.source
        if source is None:
            return False
        p = args.params
        is_float32 = to_data_type(p.dtype) == DT_FLOAT
        try:
            for c in source:
                if (gi, c.key) in prep.seen:  # offered by an earlier mode
                    c.close()
                    continue
                prep.seen.add((gi, c.key))
                why = candidate_refusal(c, is_float32, p.allow_tf32, p.deterministic)
                if why is not None:
                    prep.dropped.append((c.tag, why))
                    c.close()
                    continue
                state.records.append(GraphRecord(ExecutionPlan(c), p.direction, mode=mode,
                                                 graph_index=gi))
                return True
        finally:
            prep.problems.extend(source.problems[state.problems_copied:])
            state.problems_copied = len(source.problems)
        state.source = None
        if log.isEnabledFor(logging.DEBUG):
            log.debug("graph engine: %s: graph %d mode %s gives %d candidates", p.short(), gi,
                      mode, len(state.records))
        return False

    def _iter_candidates(self, args: ConvolutionArgs, prep: _KeyGraphs, gi: int) -> Iterator[GraphRecord]:
        for mode in HEURISTIC_MODES:
            yield from self._mode(args, prep, gi, mode)

    def describe_params(self, params: ConvolutionParams) -> list[str]:
        prep = self._key_graphs.get(params)
        if prep is None:
            return []
        lines = [f"graph: {g.description}" for g in (prep.graphs or [])]
        if prep.dropped:
            lines.append("dropped by notes: " + ", ".join(f"{t} ({why})" for t, why in prep.dropped[:8]))
        lines.extend(f"heuristics: {pr}" for pr in prep.problems[:4])
        return lines

    # -- the engine contract --------------------------------------------------------------------
    def candidates(self, args: ConvolutionArgs) -> Iterable[GraphRecord]:
        """Heuristic candidates lazily, mode by mode (without benchmark), or timed (with).

        Where there are several equivalent graphs (alpha on ALPHA2, then alpha as a multiply by
        a by-value scalar) the later ones are fallbacks: their candidates are offered, or timed,
        only when none of the earlier graph's could be. Some engines take the by-value form but
        compute it wrong (eng8 of FALLBACK gave NaN on cuDNN 9.19), so it is never preferred.
        """
        prep = self.key_graphs(args)
        if not args.benchmark:
            return self._lazy(args, prep)
        for gi in range(len(self._graphs(args, prep))):
            cands = self._iter_candidates(args, prep, gi)
            first = next(cands, None)
            if first is None:
                continue
            try:
                return self._measure(args, itertools.chain((first,), cands))
            except NoAlgorithmError:
                if gi == len(prep.graphs or []) - 1:
                    raise
        self._none_left(args, prep, [])
        return []

    def _lazy(self, args: ConvolutionArgs, prep: _KeyGraphs) -> Iterator[GraphRecord]:
        offered = 0
        for gi in range(len(self._graphs(args, prep))):
            for rec in self._iter_candidates(args, prep, gi):
                offered += 1
                yield rec
        if not offered:
            self._none_left(args, prep, [])

    def _none_left(self, args: ConvolutionArgs, prep: _KeyGraphs, cands: list) -> None:
        if cands:
            return
        raise NoAlgorithmError(
            f"no engine of cuDNN's heuristics takes {args.params.short()}"
            + ("; " + "; ".join(prep.problems) if prep.problems else "")
            + (f"; dropped by notes: {prep.dropped}" if prep.dropped else ""),
            [(t, why) for t, why in prep.dropped])

    def default_candidates(self, args: ConvolutionArgs) -> Iterable[GraphRecord]:  # lazy without benchmark
        return self.candidates(args)

    def _check(self, p: ConvolutionParams, record: GraphRecord) -> None:
        # The reference's precision rule, on engine notes: strict float32 never uses tensor cores.
        if record.plan.config.tensor_core:
            check_precision(p, MathType.TENSOR_OP_MATH)

    def run(self, args: ConvolutionArgs, record: GraphRecord) -> None:
        p = args.params
        plan = record.finalize(args.handle)
        self._check(p, record)
        ws_size = plan.workspace_size or 0
        if p.workspace_limit is not None and ws_size > p.workspace_limit:
            raise OutOfMemoryError(f"plan {plan.tag} needs a workspace of {ws_size} B, above "
                                   f"workspace_limit={p.workspace_limit}")
        self.launch(p, record, args.handle, args.pointers(), args.stream)

    def launcher(self, params: ConvolutionParams,
                 record: GraphRecord) -> Callable[[int, tuple[int, ...], int], None]:
        """The remembered call's launch: one ``cudnnBackendExecute``, on the thread's cached
        workspace where the plan needs one. With graph replay on when the launcher is made
        (`replay.configure`), `_replaying_launcher`'s instead."""
        if replay_settings()["enabled"]:
            return self._replaying_launcher(params, record)
        plan = record.plan
        execute = plan.execute
        nbytes = plan.workspace_size or 0
        if not nbytes:
            def launch_without_workspace(handle: int, pointers: tuple[int, ...], stream: int) -> None:
                execute(handle, pointers, 0)  # the hot path: one call into the plan
            return launch_without_workspace
        device = params.device

        def launch_with_workspace(handle: int, pointers: tuple[int, ...], stream: int) -> None:
            self._execute(record, device, handle, pointers, stream, self.cached_workspace)
        return launch_with_workspace

    def _replaying_launcher(self, params: ConvolutionParams,
                            record: GraphRecord) -> Callable[[int, tuple[int, ...], int], None]:
        """A launch repeating with the same pointers, workspace and handle is replayed from a
        CUDA graph of it (`Replays`): one ``cuGraphLaunch`` instead of ``cudnnBackendExecute``.
        Never while the caller's stream is being captured (the caller's own graph then captures
        a plain launch, on a workspace of its own)."""
        plan = record.plan
        execute = plan.execute
        nbytes = plan.workspace_size or 0
        device = params.device
        replays = plan.replays
        graphs, due, build = replays.graphs, replays.due, replays.build

        def captured(handle: int, pointers: tuple[int, ...], ws: int, stream: int) -> Callable[[int], None]:
            def run(capture_stream: int) -> None:
                set_handle_stream(handle, capture_stream)
                try:
                    execute(handle, pointers, ws)
                finally:
                    set_handle_stream(handle, stream)
            return run

        if not nbytes:
            def launch_without_workspace(handle: int, pointers: tuple[int, ...], stream: int) -> None:
                key = (pointers, handle)
                graph = graphs.get(key)
                if graph is not None:
                    if not is_capturing(stream) and graph.launch(stream):
                        return
                elif due(key) and not is_capturing(stream):
                    graph = build(key, captured(handle, pointers, 0, stream), device)
                    if graph is not None and graph.launch(stream):
                        return
                execute(handle, pointers, 0)
            return launch_without_workspace

        def launch_with_workspace(handle: int, pointers: tuple[int, ...], stream: int) -> None:
            if is_capturing(stream):
                self._execute(record, device, handle, pointers, stream, False)
                return
            ws = thread_workspace(nbytes, device, stream)
            key = (pointers, ws, handle)
            graph = graphs.get(key)
            if graph is not None:
                if graph.launch(stream):
                    return
            elif due(key):
                graph = build(key, captured(handle, pointers, ws, stream), device)
                if graph is not None and graph.launch(stream):
                    return
            execute(handle, pointers, ws)
        return launch_with_workspace

    def launch(self, params: ConvolutionParams, record: GraphRecord, handle: int,
               pointers: tuple[int, ...], stream: int) -> None:
        # the first launch of a record (a search, a cold call): a workspace of its own
        self._execute(record, params.device, handle, pointers, stream, False)

    @staticmethod
    def _execute(record: GraphRecord, device: int, handle: int, pointers: tuple[int, ...],
                 stream: int, cached: bool) -> None:
        ws, owned = workspace(record.plan.workspace_size or 0, device, stream, cached)
        try:
            record.plan.execute(handle, pointers, ws)
        finally:
            release(owned, stream)

    # -- tuning database ----------------------------------------------------------------------
    def serialize(self, record: GraphRecord) -> dict[str, Any]:
        """What the tuning database keeps of a plan: which graph, engine id and knob choices.

        Not the plan's JSON: a plan deserialized from a file carries its own tensors and could
        touch memory other than this call's (the database is untrusted), so plans are always
        rebuilt on the local graph from engine id and knobs.
        """
        plan = record.plan
        return GraphChoice(record.graph_index, plan.engine_id,
                           tuple((int(t), int(v)) for t, v in plan.key[1]),
                           plan.workspace_size or 0, plan.tag,
                           record.time_ms if record.time_ms >= 0 else None).to_stored()

    def check_stored(self, data: Any, params: ConvolutionParams) -> dict[str, Any]:
        return GraphChoice.from_stored(data, params).to_stored()

    def check_stored_params(self, params: ConvolutionParams) -> None:
        super().check_stored_params(params)
        # a call gives the alignment of each pointer the graph reads: x, w, y (z, bias)
        n = {"": 3, "bias": 4, "bias_relu": 4, "add_relu": 5}[params.epilogue]
        if len(params.alignments) != n:
            raise ValueError(f"params.alignments: expected {n} values, got "
                             f"{len(params.alignments)}: {list(params.alignments)}")

    def restore(self, args: ConvolutionArgs, data: dict[str, Any]) -> GraphRecord:
        """Rebuild a stored choice on this process's graph for ``args`` (no heuristics).

        Only the graph index, engine id and knob choices are read from the record (the database
        is untrusted input): the plan is built from them on the graph of this key, so it computes
        this convolution on these tensors or fails to finalize. It then gets the checks a search
        applies: the engine's notes (no down-conversion, no tensor cores for strict float32, no
        non-deterministic engine when determinism is asked) and the workspace limit.

        Raises:
            TypeError, ValueError: the record does not check out for this key (the caller drops it).
            CudnnError: cuDNN does not take the engine and knobs for this graph.
        """
        p = args.params
        prep = self.key_graphs(args)
        graphs = self._graphs(args, prep)
        stored = GraphChoice.from_stored(data, p)
        gi = stored.graph
        if not gi < len(graphs):
            raise ValueError(f"graph: expected an int in [0, {len(graphs)}), got {gi!r}")
        time_ms = -1.0 if stored.time_ms is None else stored.time_ms
        cfg = EngineConfig.from_key(graphs[gi], stored.engine_id, list(stored.knobs))
        _, dropped = filter_candidates([cfg], p.dtype, p.allow_tf32, p.deterministic)
        if dropped:
            cfg.close()
            raise ValueError(f"stored plan {cfg.tag} is not allowed here: {dropped[0][1]}")
        rec = GraphRecord(ExecutionPlan(cfg), p.direction, time_ms, "tuning-db", "db", gi)
        plan = rec.finalize(args.handle)
        ws = plan.workspace_size or 0
        if p.workspace_limit is not None and ws > p.workspace_limit:
            raise ValueError(f"stored plan {plan.tag} needs a workspace of {ws} B, above "
                             f"workspace_limit={p.workspace_limit}")
        return rec

    # -- measurement --------------------------------------------------------------------------
    def _measure(self, args: ConvolutionArgs, cands: Iterable[GraphRecord]) -> Iterator[GraphRecord]:
        """The candidates ranked by measured time; those not timed (limit, time budget) follow
        as fallbacks in heuristics order.

        With a ``benchmark_limit`` (the default), runtime-compiled candidates are left out of the
        timing: each costs 0.3-1 s to build, and precompiled engines are the heuristics' first
        choices. ``benchmark_limit=None`` is the exhaustive search, which builds and times them.
        ``cands`` is read only as far as the timing needs: the configs after the last timed one
        are described only if the caller goes on to them (describing every config of the three
        modes cost more than timing the first ten).
        """
        p = args.params
        error_if_capturing(args.stream, "graph engine benchmark")
        limit = p.benchmark_limit
        budget = BENCHMARK_TIME_BUDGET_S
        scratch = None
        out_ptr = None
        if args.out_may_hold_data:
            # timing writes the output: never into data the caller still needs
            scratch = allocate(written_bytes(p), p.device, args.stream)
            out_ptr = scratch.ptr
        rest = iter(cands)
        ready: list[GraphRecord] = []
        untimed: list[GraphRecord] = []
        failures: list[tuple[str, str]] = []
        start = time.perf_counter()
        try:
            free, _ = mem_get_info(p.device)
            ceiling = free if p.workspace_limit is None else min(free, p.workspace_limit)
            while (limit is None or len(ready) < limit) and time.perf_counter() - start <= budget:
                rec = next(rest, None)
                if rec is None:
                    break
                if limit is not None and rec.plan.runtime_compiled:
                    untimed.append(rec)  # exhaustive search only (see above)
                    continue
                try:
                    plan = rec.finalize(args.handle)
                except CudnnError as exc:
                    failures.append((rec.plan.tag, f"finalize: {exc.status_name}"))
                    continue
                if (plan.workspace_size or 0) > ceiling:
                    failures.append((plan.tag, f"workspace {plan.workspace_size} B > {ceiling} B available"))
                    continue
                ready.append(rec)
            times = self._time_all(args, ready, out_ptr, failures)
        finally:
            if scratch is not None:
                scratch.close(args.stream)
        timed = [GraphRecord(r.plan, r.direction, t, "measured", r.mode, r.graph_index)
                 for r, t in zip(ready, times) if t is not None]
        if not timed and not untimed:
            nxt = next(rest, None)  # a fallback left untimed by the limit or the budget?
            if nxt is None:
                raise NoAlgorithmError(f"no graph-engine plan could be timed for {p.short()}", failures)
            untimed.append(nxt)
        timed.sort(key=lambda r: r.time_ms)
        if timed and timed[0].plan.runtime_compiled:
            # A runtime-compiled plan must be compiled again in every process that rebuilds it
            # (30-1000 ms); a precompiled plan within 3% of it is the better choice to keep.
            best = timed[0].time_ms
            for i, r in enumerate(timed[1:], 1):
                if not r.plan.runtime_compiled and r.time_ms <= best * (1 + PRECOMPILED_PREFERENCE):
                    timed.insert(0, timed.pop(i))
                    break
        if log.isEnabledFor(logging.DEBUG):
            log.debug("graph engine benchmark %s: %s", p.short(),
                      ", ".join(f"{r.plan.tag}={r.time_ms:.4f}ms" for r in timed[:5]))
        return itertools.chain(timed, untimed, rest)

    def _time_all(self, args: ConvolutionArgs, ready: list[GraphRecord], out_ptr: int | None,
                  failures: list[tuple[str, str]]) -> list[float | None]:
        """Each finalized candidate's time per run in ms (None where it failed to run).

        Every candidate runs once first (CUDA loads its kernels then: a kernel loaded while the
        stream is held could wait on the held stream). Then, with the stream held on the GPU
        (`pycudnn.runtime.gate`), one run of each gives its time without launch gaps, which sets
        how many runs each timing takes (about 100 us of GPU time, 3 to 25 runs) and drops those
        more than `PRUNE_FACTOR` times slower than the fastest (that run is their time); then
        `_ROUNDS` rounds of the others, each in another candidate order, and the median per
        candidate.
        Without a gate (a GPU that cannot wait on host memory) the runs are timed back to back.
        """
        if not ready:
            return []
        # imported here: a heuristics first call needs neither
        import statistics

        from ..runtime.gate import gate_for

        p = args.params
        ptrs = args.pointers(out_ptr)
        ws_size = max(r.plan.workspace_size or 0 for r in ready)
        ws = allocate(ws_size, p.device, args.stream)
        wptr = ws.ptr if ws_size else 0
        ok: list[int] = []
        try:
            for i, rec in enumerate(ready):
                try:
                    rec.plan.execute(args.handle, ptrs, wptr)
                    ok.append(i)
                except CudnnError as exc:
                    failures.append((rec.plan.tag, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
            stream_synchronize(args.stream)
            if not ok:
                return [None] * len(ready)  # none ran: the failures say why
            gate = gate_for(p.device)
            times: dict[int, list[float]] = {i: [] for i in ok}
            if gate is None:
                for _ in range(_TRIALS):
                    for i in ok:
                        times[i].append(self.gated_round(args, None, [(ready[i], _REPS)], ptrs, wptr)[0])
            else:
                first = self._batched(args, gate, [(ready[i], 1) for i in ok], ptrs, wptr)
                reps = {i: max(3, min(25, int(_GATED_SPAN_MS / max(t, 1e-4)))) for i, t in zip(ok, first)}
                # candidates far slower than the best one in that run cannot win: their one run
                # ranks them, and the rounds time the rest (a depthwise layer's slow kernels
                # took most of a search's time)
                best = max(min(first), 0.002)  # ms: below what one event pair resolves
                contenders = [i for i, t in zip(ok, first) if t <= PRUNE_FACTOR * best]
                for i, t in zip(ok, first):
                    if i not in contenders:
                        times[i].append(t)
                for r in range(_ROUNDS):
                    n = len(contenders)
                    order = (contenders[r % n:] + contenders[:r % n] if r % 2 == 0
                             else list(reversed(contenders)))
                    got = self._batched(args, gate, [(ready[i], reps[i]) for i in order], ptrs, wptr)
                    for i, t in zip(order, got):
                        times[i].append(t)
        finally:
            ws.close(args.stream)
        return [statistics.median(times[i]) if i in times else None for i in range(len(ready))]

    def _batched(self, args: ConvolutionArgs, gate: StreamGate, runs: list[tuple[GraphRecord, int]],
                 ptrs: tuple[int, ...], wptr: int) -> list[float]:
        """Time ``runs`` ((candidate, repetitions)) behind holds of ``gate``, at most
        `MAX_QUEUED` runs queued behind one hold; ms per run of each."""
        from ..runtime.gate import MAX_QUEUED

        out: list[float] = []
        batch: list[tuple[GraphRecord, int]] = []
        queued = 0
        for rec, n in runs:
            if batch and queued + n > MAX_QUEUED:
                out += self.gated_round(args, gate, batch, ptrs, wptr)
                batch, queued = [], 0
            batch.append((rec, n))
            queued += n
        if batch:
            out += self.gated_round(args, gate, batch, ptrs, wptr)
        return out

    def gated_round(self, args: ConvolutionArgs, gate: StreamGate | None,
                    runs: list[tuple[GraphRecord, int]], ptrs: tuple[int, ...],
                    wptr: int) -> list[float]:
        """One batch: (hold,) per candidate an event, its runs, an event; (open,) then each
        candidate's ms per run. Public as a seam for tests and tooling."""
        s = args.stream
        events: list[int] = []
        # everything after the first event is made runs inside the try blocks: a failure (an
        # event that cannot be made, a watchdog thread that cannot start, an interrupt) still
        # opens a queued hold, else the caller's stream would wait on the word forever, and
        # destroys the events made so far
        try:
            for _ in range(len(runs) + 1):
                events.append(event_create())
            generation = 0
            timer = None
            try:
                if gate is not None:
                    generation = gate.hold(s)
                    timer = gate.watchdog(generation)
                event_record(events[0], s)
                for k, (rec, n) in enumerate(runs):
                    for _ in range(n):
                        rec.plan.execute(args.handle, ptrs, wptr)
                    event_record(events[k + 1], s)
            finally:
                if gate is not None and generation:
                    gate.open(generation)
                if timer is not None:
                    timer.cancel()
            event_synchronize(events[-1])
            return [event_elapsed_ms(events[k], events[k + 1]) / n
                    for k, (_, n) in enumerate(runs)]
        finally:
            for ev in events:
                event_destroy(ev)
