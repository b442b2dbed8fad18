"""The legacy (v7) engine: PyTorch's ``Conv_v7.cpp`` search behind the engine contract.

`V7Engine` asks cuDNN's heuristics (cudnnGet*_v7) or measures (cudnnFind*Ex), filters the rows
as the reference's getValidAlgorithms does, sizes workspaces and launches an `AlgoRecord`
(algorithm, math type and workspace, applied together). `V7Choice` is what the tuning database
keeps of a record, checked field by field when it is read back.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from .._types import (BwdDataAlgo, BwdFilterAlgo, ConvolutionBwdDataAlgoPerf,
                       ConvolutionBwdFilterAlgoPerf, ConvolutionFwdAlgoPerf, Determinism, FwdAlgo,
                       MathType, Status)
from ..cudnn.descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor
from ..cudnn.tensor_ops import relu_descriptor, scalar, scalar_pointers
from ..errors import CudnnError, NoAlgorithmError
from ..ffi import library as _lib
from ..runtime.memory import allocate, mem_get_info
from .contract import (Engine, check_precision, error_if_capturing, precision_problem, release,
                       workspace)
from .problem import DIRECTION, ConvolutionArgs, ConvolutionParams, EpilogueKind, written_bytes
from .stored import INT_MAX, checked_bool, checked_int, checked_record

__all__ = ["AlgoRecord", "V7Choice", "V7Engine", "V7Direction", "v7_direction", "find_headroom", "FIND_HEADROOM"]

log = logging.getLogger("pycudnn")


# ---- records ---------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class V7Choice:
    """What the tuning database keeps of an `AlgoRecord`: its identity as a frozen value (as
    cudnn-frontend's ``PlanConfig``), read back with `from_stored`, which checks every field."""

    algo: int
    math_type: int
    workspace: int
    deterministic: bool | None = None  # None: not stored
    time_ms: float | None = None       # None: not measured

    @classmethod
    def from_stored(cls, data: Any, params: ConvolutionParams) -> "V7Choice":
        """The choice ``data`` (a stored record for ``params``) holds, once exactly the fields
        `to_stored` writes are there, each of its type and range.

        Raises:
            TypeError, ValueError: naming the first field that is wrong.
        """
        enum = _V7_TABLE[params.direction].algo_enum

        def algo(v: Any) -> int:
            a = checked_int("record.algo", v, 0, INT_MAX)
            if a not in _enum_values(enum):
                raise ValueError(f"record.algo: {a} is not a {enum.__name__} value")
            return a

        def math_type(v: Any) -> int:
            m = checked_int("record.math_type", v, 0, INT_MAX)
            if m not in _enum_values(MathType):
                raise ValueError(f"record.math_type: {m} is not a cudnnMathType_t value")
            return m

        return cls(**checked_record(data, "v7", {
            "algo": (True, algo), "math_type": (True, math_type),
            "workspace": (True, lambda v: checked_int("record.workspace", v, 0)),
            "deterministic": (False, lambda v: checked_bool("record.deterministic", v))}))

    @classmethod
    def of(cls, record: AlgoRecord) -> "V7Choice":
        """The choice ``record`` made."""
        return cls(record.algo, record.math_type, record.workspace, record.deterministic,
                   record.time_ms if record.time_ms >= 0 else None)

    def to_stored(self) -> dict[str, Any]:
        """The record as the tuning database keeps it (JSON data; fields not known left out)."""
        # every field is a plain scalar: no deep copy (dataclasses.asdict) needed
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return {k: v for k, v in values if v is not None}


@functools.lru_cache(maxsize=None)
def _enum_values(enum: type[IntEnum]) -> frozenset[int]:
    """The values of an enum class (read per stored record: made once)."""
    return frozenset(e.value for e in enum)


# ---- the v7 (legacy API) engine -------------------------------------------------------------------

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


class V7Engine(Engine):
    """Conv_v7.cpp's search: cudnnGet*_v7 (heuristics) or cudnnFind*Ex (measurement)."""

    name = "v7"
    deterministic_uses_default = True
    epilogues = frozenset({EpilogueKind.NONE, EpilogueKind.ADD_RELU})
    # a stream-ordered allocation per launch: a per-thread cache grown and evicted across many
    # streams needs device-wide synchronization, which fails while any stream captures
    cached_workspace = False

    def __init__(self, max_descriptors: int = 1024) -> None:
        self._descriptors: OrderedDict[ConvolutionParams, V7Descriptors] = OrderedDict()
        self._lock = threading.Lock()
        self.max_descriptors = max_descriptors

    def clear(self) -> None:
        with self._lock:
            self._descriptors.clear()

    def descriptors(self, params: ConvolutionParams) -> V7Descriptors:
        descs = self._descriptors.get(params)
        if descs is None:
            descs = V7Descriptors(params)
            with self._lock:
                self._descriptors[params] = descs
                while len(self._descriptors) > self.max_descriptors:
                    self._descriptors.popitem(last=False)
        return descs

    def serialize(self, record: AlgoRecord) -> dict[str, Any]:
        """What the tuning database keeps of a v7 record (data only): its `V7Choice`."""
        return V7Choice.of(record).to_stored()

    def check_stored(self, data: Any, params: ConvolutionParams) -> dict[str, Any]:
        return V7Choice.from_stored(data, params).to_stored()

    def check_stored_params(self, params: ConvolutionParams) -> None:
        super().check_stored_params(params)
        if params.alignments:
            raise ValueError(f"params.alignments: expected 0 values for the v7 engine (it takes "
                             f"no pointer alignments), got {len(params.alignments)}")
        if params.benchmark_limit is not None:
            raise ValueError(f"params.benchmark_limit: the v7 engine takes none (Find times every "
                             f"algorithm), got {params.benchmark_limit}")

    def restore(self, args: ConvolutionArgs, data: dict[str, Any]) -> AlgoRecord:
        """A record from the tuning database, checked as a search checks its candidates.

        The database is untrusted input: only the algorithm and math type are taken from it.
        cuDNN's heuristics for this key say whether the algorithm is supported and deterministic
        (the record's own claims are ignored), the math type must pass the precision rule, and
        the workspace is asked of cuDNN again and held to ``workspace_limit``.

        Raises:
            TypeError, ValueError: the record does not check out for this key (the caller drops it).
        """
        p = args.params
        stored = V7Choice.from_stored(data, p)
        algo, math = stored.algo, stored.math_type
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
        time_ms = -1.0 if stored.time_ms is None else stored.time_ms
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
        getattr(_lib.lib().checked, table.workspace_fn)(
            args.handle, a, b, descs.conv(math_type).handle, out, int(algo), ctypes.byref(size))
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
            sizing = sizing_lock(p.device)
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


def sizing_lock(device: int) -> threading.Lock:
    """The lock under which a search reads the free memory of ``device`` and takes its
    workspace. Public as a seam for tests and tooling."""
    lock = _sizing_locks.get(device)
    if lock is None:
        with _sizing_locks_guard:
            lock = _sizing_locks.setdefault(device, threading.Lock())
    return lock


#: the reference's guard: cuDNN sometimes reports workspaces near 2^64 (treated as unusable)
_ABSURD_WORKSPACE = 1 << 40


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.split("\n", 1)[0]
