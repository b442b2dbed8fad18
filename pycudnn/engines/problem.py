"""What one convolution problem is: its direction, the key that identifies it, its arguments.

* `Direction` and `DIRECTION`: the one
  table that says, for each direction, which tensor is written, which two the public function
  takes as inputs, and in what order the legacy C functions take their operands. Tensors are
  named by their *forward* roles everywhere: ``x`` (input), ``w`` (weight), ``y`` (output).
* `EpilogueKind`: the fused epilogues.
* `ConvolutionParams`: the immutable cache key.
* `ConvolutionArgs`: one call's arguments (key, handle, stream
  and the device pointer of each role).

This module knows nothing of engines, caches or the public functions; they all read it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from .._types import normalize_dtype
from ..runtime.tensor import span_elements

__all__ = ["Direction", "DIRECTION", "DIRECTIONS", "ROLES", "EpilogueKind", "ConvolutionParams",
           "ConvolutionArgs", "role_bytes", "written_bytes"]

#: the forward roles, in the order the graph engine's plans and the prepared calls pass pointers
ROLES = ("x", "w", "y")


@dataclass(frozen=True)
class Direction:
    """One direction of a convolution, in forward roles (``x`` input, ``w`` weight, ``y`` output)."""

    name: str
    #: the role this direction computes (writes)
    written: str
    #: the roles the public function takes as its two inputs, in argument order
    inputs: tuple[str, str]
    #: the legacy C functions' operand order: (first input, second input, output)
    operands: tuple[str, str, str]

    @property
    def written_index(self) -> int:
        """Index of the written role in `ROLES` (x, w, y)."""
        return ROLES.index(self.written)

    @property
    def call_positions(self) -> tuple[int, int, int]:
        """Where x, w and y are in the public function's ``(a, b, out)``: with ``t = (a, b, out)``,
        the forward roles are ``t[i] for i in call_positions``."""
        order = (*self.inputs, self.written)
        return order.index("x"), order.index("w"), order.index("y")


#: the direction table: every place that needs to know what a direction reads and writes asks here
DIRECTION: dict[str, Direction] = {
    "forward": Direction("forward", "y", ("x", "w"), ("x", "w", "y")),
    "backward_data": Direction("backward_data", "x", ("y", "w"), ("w", "y", "x")),
    "backward_filter": Direction("backward_filter", "w", ("x", "y"), ("x", "y", "w")),
}
DIRECTIONS = tuple(DIRECTION)


class EpilogueKind(str, enum.Enum):
    """What a fused convolution adds after the convolution (values are the key's strings)."""

    NONE = ""
    BIAS = "bias"
    BIAS_RELU = "bias_relu"
    #: conv + alpha * z + bias, then ReLU
    ADD_RELU = "add_relu"

    @property
    def has_bias(self) -> bool:
        return self is not EpilogueKind.NONE

    @property
    def has_z(self) -> bool:
        return self is EpilogueKind.ADD_RELU


@dataclass(frozen=True)
class ConvolutionParams:
    """Everything that changes which algorithm is right (the cache key; immutable and hashable).

    Shapes are those cuDNN sees: 1-D convolutions arrive here already as 2-D with a unit height.
    ``input``/``weight``/``output`` are the forward convolution's roles in every direction (for
    backward data, ``input`` is the gradient being computed), as in the reference.
    """

    direction: str
    device: int
    cudnn_version: int
    dtype: str
    input_shape: tuple[int, ...]
    input_strides: tuple[int, ...]
    weight_shape: tuple[int, ...]
    weight_format: str                   # "NCHW" or "NHWC" (filters have a format, not strides)
    output_shape: tuple[int, ...]
    output_strides: tuple[int, ...]
    padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    deterministic: bool
    allow_tf32: bool
    workspace_limit: int | None
    engine: str
    #: fused epilogue: an `EpilogueKind` value ("" for none)
    epilogue: str = ""
    #: strides of the residual z for "add_relu" (its shape is the output's)
    z_strides: tuple[int, ...] | None = None
    alpha: float = 1.0
    #: byte alignment promised for each pointer (x, w, y[, z, b]); the graph engine bakes it into
    #: its graphs, so it is part of the key there (empty for the v7 engine, which needs none)
    alignments: tuple[int, ...] = ()
    #: graph engine with benchmark: time at most this many candidates (None: all). A search cut
    #: short is a different answer from a full one, so it is part of the key (None otherwise).
    benchmark_limit: int | None = None

    def short(self) -> str:
        """One line for logs and the cache listing."""
        ep = f" +{self.epilogue}" if self.epilogue else ""
        return (f"{self.direction}{ep} {self.dtype} x{list(self.input_shape)} w{list(self.weight_shape)}"
                f" y{list(self.output_shape)} pad{list(self.padding)} stride{list(self.stride)}"
                f" dil{list(self.dilation)} groups={self.groups} fmt={self.weight_format}"
                f" det={self.deterministic} tf32={self.allow_tf32} engine={self.engine}"
                + (f" benchmark_limit={self.benchmark_limit}" if self.benchmark_limit is not None else ""))


@dataclass
class ConvolutionArgs:
    """One call's arguments: the key, where it runs, and the device pointers of each role.

    ``x``/``w``/``y`` are the forward roles (pointers); ``z``/``bias`` the fused epilogue's.
    ``out_may_hold_data``: the written buffer must not be scribbled on by a search (it aliases
    something the call reads), so searches that write it use a scratch buffer instead.
    ``tuning_db``: whether this call may read and write the persistent tuning database.
    """

    params: ConvolutionParams
    handle: int
    stream: int
    x: int
    w: int
    y: int
    benchmark: bool = False
    z: int = 0
    bias: int = 0
    out_may_hold_data: bool = False
    tuning_db: bool = True

    def pointers(self, written: int | None = None) -> tuple[int, ...]:
        """``(x, w, y, [z,] [bias])`` as the graph engine's plans and prepared calls take them;
        ``written`` replaces the pointer of the role the direction writes (a scratch buffer)."""
        ptrs = [self.x, self.w, self.y]
        if written is not None:
            ptrs[DIRECTION[self.params.direction].written_index] = written
        kind = EpilogueKind(self.params.epilogue)
        if kind.has_z:
            ptrs.append(self.z)
        if kind.has_bias:
            ptrs.append(self.bias)
        return tuple(ptrs)


def role_bytes(p: ConvolutionParams, role: str) -> int:
    """Bytes the tensor of ``role`` ("x", "w" or "y") spans under ``p``.

    The item size comes from the same parser the descriptors use (``normalize_dtype``), so a
    buffer sized here is never smaller than what a kernel given these parameters touches.
    """

    itemsize = normalize_dtype(p.dtype).itemsize
    if role == "x":
        return span_elements(p.input_shape, p.input_strides) * itemsize
    if role == "y":
        return span_elements(p.output_shape, p.output_strides) * itemsize
    if role == "w":  # filters are dense in their format
        return math.prod(p.weight_shape) * itemsize
    raise ValueError(f"role: expected one of {ROLES}, got {role!r}")


def written_bytes(p: ConvolutionParams) -> int:
    """Bytes the tensor ``p``'s direction writes spans (for a scratch buffer of the same size)."""
    return role_bytes(p, DIRECTION[p.direction].written)
