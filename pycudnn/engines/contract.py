"""The engine contract: what the legacy (v7) and the graph engine each supply.

The key, the caches, the iterator (``pycudnn.search.iterate.try_all``), the tuning database and
the prepared calls are shared; an engine supplies only:

* candidates for a key (heuristics, or measured when ``benchmark``), and the default when
  deterministic without benchmark;
* ``run`` (the first launch, with the checks a record must pass) and ``launch`` (the hot path);
* ``serialize`` / ``restore`` / ``check_stored``: a record as data for the tuning database, back,
  and checked field by field when read (the database is untrusted);
* what it fuses (``supports``), how it describes a key for error messages, and ``clear``.

Shared by both: the workspace policy (`workspace`), the reference's precision rule
(`check_precision`) and the refusal to measure during capture (`error_if_capturing`).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Iterable, Protocol, Sequence

from .._types import MathType
from ..errors import PycudnnError, StreamCaptureError
from ..runtime.memory import allocate_fast, stream_is_capturing
from ..runtime.memory.workspaces import thread_workspace
from .problem import ConvolutionArgs, ConvolutionParams, EpilogueKind

__all__ = ["Engine", "Record", "workspace", "release", "check_precision", "precision_problem",
           "error_if_capturing"]


class Record(Protocol):
    """One candidate of an engine (a v7 algorithm record, a graph-engine plan)."""

    @property
    def workspace(self) -> int:
        """Bytes of workspace it needs (0 where not known yet)."""

    #: measured time of one launch in milliseconds (-1.0 where not measured)
    time_ms: float
    #: how it was chosen: "heuristics", "default", or measured ("find" for v7, "measured" for the
    #: graph engine); a measured choice is what the tuning database keeps
    source: str

    def describe(self) -> str:
        """One line naming the choice, for logs and errors."""


def workspace(nbytes: int, device: int, stream: int, cached: bool) -> tuple[int, Any]:
    """``(pointer, owned)``: a workspace of ``nbytes`` for one launch on ``stream`` (pointer 0
    when none is needed). Pass ``owned`` to `release` after the launch.

    ``cached`` (an engine's ``cached_workspace``): this thread's cached workspace for (device,
    stream), reused across launches (they are ordered on the stream) and grown when a larger one
    is asked (``owned`` is None). Otherwise, and always during CUDA-graph capture (a captured
    graph must never keep an address the cache may free later), a stream-ordered allocation for
    this launch, freed after it. A plain function, not a context manager: it is on the hot path.
    """
    if not nbytes:
        return 0, None
    if not cached or stream_is_capturing(stream):
        ws = allocate_fast(nbytes, device, stream)
        return ws.ptr, ws
    return thread_workspace(nbytes, device, stream), None


def release(owned: Any, stream: int) -> None:
    """Free what `workspace` allocated for one launch (if anything)."""
    if owned is not None:
        owned.close(stream)


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



class Engine(ABC):
    """A search and launcher behind the shared key, caches and iterator."""

    #: the value of the ``engine`` flag that selects it
    name: ClassVar[str]
    #: deterministic without benchmark runs only `default_candidates()`, uncached (the v7
    #: reference's rule); False: the search runs as usual on deterministic candidates
    deterministic_uses_default: ClassVar[bool] = False
    #: the epilogues it fuses into the convolution itself
    epilogues: ClassVar[frozenset[EpilogueKind]] = frozenset({EpilogueKind.NONE})
    #: whether replays (``launcher``) use this thread's cached workspace (see
    #: `workspace`); False: a stream-ordered allocation per launch.
    #: First launches (``run``, searches) always get an allocation of their own.
    cached_workspace: ClassVar[bool] = False

    def supports(self, epilogue: str) -> bool:
        """Whether it fuses ``epilogue`` (an `EpilogueKind` value)."""
        return EpilogueKind(epilogue) in self.epilogues

    @abstractmethod
    def candidates(self, args: ConvolutionArgs) -> Iterable[Any]:
        """Heuristic (``args.benchmark`` False) or measured candidates, best first."""

    def default_candidates(self, args: ConvolutionArgs) -> Sequence[Any] | Iterable[Any]:
        """The candidates when deterministic without benchmark (see ``deterministic_uses_default``)."""
        return self.candidates(args)

    @abstractmethod
    def run(self, args: ConvolutionArgs, record: Any) -> None:
        """Check ``record`` against ``args.params`` and launch it; raise on failure
        (``OutOfMemoryError`` and ``CudnnError`` make the iterator try the next candidate)."""

    @abstractmethod
    def launch(self, params: ConvolutionParams, record: Any, handle: int,
               pointers: tuple[int, ...], stream: int) -> None:
        """Launch a record that already ran for ``params`` (no checks: the hot path).
        ``pointers``: ``(x, w, y, [z,] [bias])``, as
        `ConvolutionArgs.pointers` gives them."""

    @abstractmethod
    def serialize(self, record: Any) -> dict[str, Any]:
        """What the tuning database keeps of ``record`` (JSON data only)."""

    def check_stored(self, data: Any, params: ConvolutionParams) -> dict[str, Any]:
        """A checked copy of ``data``, a record of this engine read back from the tuning
        database for ``params`` (untrusted): exactly the fields `serialize` writes, each of its
        type and range. An engine checks it through the frozen value it keeps a record's
        identity in (as cudnn-frontend's ``PlanConfig``), so the database names no engine field.

        Raises:
            TypeError, ValueError: naming the first field that is wrong.
        """
        raise ValueError(f"record: the {self.name} engine keeps no tuning records")

    def check_stored_params(self, params: ConvolutionParams) -> None:
        """Refuse stored ``params`` (already checked field by field) that no call with this
        engine writes: here an epilogue it does not fuse; engines add their own fields' rules.

        Raises:
            ValueError: naming the field.
        """
        if params.epilogue and not self.supports(params.epilogue):
            raise ValueError(f"params.epilogue: {params.epilogue!r} is not fused by the "
                             f"{self.name} engine")

    @abstractmethod
    def restore(self, args: ConvolutionArgs, data: dict[str, Any]) -> Any:
        """A record rebuilt from the tuning database's ``data`` for ``args.params``, checked as a
        search checks its candidates; ``ValueError`` (or a cuDNN error) when it does not check out."""

    def launcher(self, params: ConvolutionParams, record: Any) -> Callable[[int, tuple[int, ...], int], None]:
        """``launch`` with ``params`` and ``record`` bound: ``launcher(handle, pointers, stream)``.
        Prepared calls take it once; an engine may return something cheaper for its records."""
        return functools.partial(self.launch, params, record)

    def describe_params(self, params: ConvolutionParams) -> list[str]:
        """How the engine holds ``params`` (descriptors, graphs), for error messages."""
        return []

    def clear(self) -> None:
        """Forget per-key state (descriptors, graphs, plans)."""
