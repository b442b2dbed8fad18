"""The activation modes, one row each: everything the functions, the compiled kernels and the
CuPy drop-in know of a mode comes from its `Activation` row in `ACTIVATIONS`.

A row names the mode, its legacy ``cudnnActivationMode_t`` (None: the graph API alone runs it,
from the first call), its graph pointwise forward and backward modes and the attributes ``coef``
sets there, the CuPy 13 constant, and how PyTorch's values at the edges (NaN, +-inf, the kinks)
are reached where cuDNN's legacy kernel gives others (`Activation.edges`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .._types import ActivationMode
from ..cudnn.graph import PointwiseStep
from ..ffi.backend import Attr, PointwiseMode

__all__ = ["Activation", "ACTIVATIONS", "NAMES", "LEGACY", "GRAPH_ONLY", "CUPY_CONSTANTS",
           "SCALARS", "row"]

#: the host scalars a row's graph steps may read by name: each one's value for a call's coef
SCALARS: dict[str, Callable[[float], float]] = {"one": lambda coef: 1.0,
                                                "coef": lambda coef: coef}


def _always(coef: float) -> bool:
    return True


def _never(coef: float) -> bool:
    return False


def _alpha_one(coef: float) -> bool:
    return coef == 1.0


@dataclass(frozen=True)
class Activation:
    """One activation mode.

    ``forward``/``backward`` are the graph's pointwise modes (the backward one reads ``x`` and
    ``dy``); ``from_output`` replaces the backward mode by steps reading ``y`` (names ``y``,
    ``dy``, ``dx`` and virtual intermediates). ``pytorch_backward`` are steps reading ``x`` and
    ``dy`` (and the scalars named in `SCALARS`) that give PyTorch's gradient where neither of
    cuDNN's backward kernels does: with them a call that asks for PyTorch's values runs this
    compiled graph from its first call. ``params`` are the graph attributes set to ``coef``,
    ``fixed`` those set to a constant. ``compiles_backward(coef)`` says whether a
    compiled backward kernel gives the legacy kernel's values (else the signature keeps the
    legacy kernel). ``edges`` names the correction that gives PyTorch's edge values:
    ``"nan_passes"`` (dy passes where y is NaN) or ``"open_ceiling"`` (0 at x == coef); ``""``
    none.
    """
    name: str
    legacy: ActivationMode | None
    forward: PointwiseMode | None
    backward: PointwiseMode | None
    formula: str
    params: tuple[Attr, ...] = ()
    fixed: tuple[tuple[Attr, float], ...] = ()
    from_output: tuple[PointwiseStep, ...] = ()
    pytorch_backward: tuple[PointwiseStep, ...] = ()
    compiles_backward: Callable[[float], bool] = field(default=_always, compare=False)
    #: the legacy descriptor's coef goes through this setter too (swish's beta)
    legacy_setter: str = ""
    #: why the mode is refused, where it is
    refused: str = ""
    cupy: str = ""
    edges: str = ""


_S = PointwiseStep
_P = PointwiseMode

ACTIVATIONS: tuple[Activation, ...] = (
    Activation("relu", ActivationMode.RELU, _P.RELU_FWD, _P.RELU_BWD, "max(x, 0)",
               compiles_backward=_never, cupy="CUDNN_ACTIVATION_RELU", edges="nan_passes"),
    Activation("sigmoid", ActivationMode.SIGMOID, _P.SIGMOID_FWD, _P.SIGMOID_BWD,
               "1 / (1 + exp(-x))",
               # dy * y * (1 - y): as much memory as SIGMOID_BWD, which recomputes from x
               from_output=(_S(_P.MUL, x="y", b="y", y="yy"), _S(_P.SUB, x="y", b="yy", y="d"),
                            _S(_P.MUL, x="dy", b="d", y="dx")),
               cupy="CUDNN_ACTIVATION_SIGMOID"),
    Activation("tanh", ActivationMode.TANH, _P.TANH_FWD, _P.TANH_BWD, "tanh(x)",
               # dy * (1 - tanh(x)^2) as dy * 4 * sigmoid(2x) * sigmoid(-2x), with no
               # cancellation: cuDNN's tanh is ~1e-5 relative off, and 1 - y * y (PyTorch's
               # formula, both cuDNN kernels') amplifies that ~2.7x at |x| ~ 1
               pytorch_backward=(_S(_P.ADD, x="x", b="x", y="2x"), _S(_P.NEG, x="2x", y="-2x"),
                                 _S(_P.SIGMOID_FWD, x="2x", y="s"),
                                 _S(_P.SIGMOID_FWD, x="-2x", y="r"),
                                 _S(_P.MUL, x="s", b="r", y="sr"), _S(_P.ADD, x="sr", b="sr", y="2sr"),
                                 _S(_P.ADD, x="2sr", b="2sr", y="g"),
                                 _S(_P.MUL, x="dy", b="g", y="dx")),
               cupy="CUDNN_ACTIVATION_TANH"),
    Activation("clipped_relu", ActivationMode.CLIPPED_RELU, _P.RELU_FWD, _P.RELU_BWD,
               "min(max(x, 0), coef)", params=(Attr.POINTWISE_RELU_UPPER_CLIP,),
               fixed=((Attr.POINTWISE_RELU_LOWER_CLIP, 0.0),), compiles_backward=_never,
               cupy="CUDNN_ACTIVATION_CLIPPED_RELU", edges="open_ceiling"),
    Activation("elu", ActivationMode.ELU, _P.ELU_FWD, _P.ELU_BWD,
               "x for x > 0, else coef * (exp(x) - 1)", params=(Attr.POINTWISE_ELU_ALPHA,),
               # at x == 0 with alpha != 1 the two kernels take different one-sided gradients
               compiles_backward=_alpha_one, cupy="CUDNN_ACTIVATION_ELU"),
    Activation("identity", ActivationMode.IDENTITY, None, None, "x",
               refused="cuDNN runs its identity activation only fused into a convolution "
                       "(cudnnConvolutionBiasActivationForward), not on its own; the result "
                       "would be the input itself",
               cupy="CUDNN_ACTIVATION_IDENTITY"),
    Activation("swish", ActivationMode.SWISH, _P.SWISH_FWD, _P.SWISH_BWD,
               "x * sigmoid(coef * x)", params=(Attr.POINTWISE_SWISH_BETA,),
               legacy_setter="cudnnSetActivationDescriptorSwishBeta",
               # PyTorch's silu_backward, dy * s * (1 + x * (1 - s)) with s = sigmoid(x), for
               # any beta (x as beta * x, 1 - s as sigmoid(-beta * x)): dy at x = 1e30 and NaN
               # at +-inf, where cuDNN's kernels give 0 and finite values
               pytorch_backward=(_S(_P.MUL, x="x", b="coef", y="bx"), _S(_P.NEG, x="bx", y="-bx"),
                                 _S(_P.SIGMOID_FWD, x="bx", y="s"),
                                 _S(_P.SIGMOID_FWD, x="-bx", y="r"),
                                 _S(_P.MUL, x="bx", b="r", y="f"), _S(_P.ADD, x="f", b="one", y="g"),
                                 _S(_P.MUL, x="s", b="g", y="h"), _S(_P.MUL, x="dy", b="h", y="dx")),
               cupy="CUDNN_ACTIVATION_SWISH"),
    Activation("gelu", None, _P.GELU_FWD, _P.GELU_BWD, "x * Phi(x) = x * (1 + erf(x / sqrt(2))) / 2"),
    Activation("gelu_tanh", None, _P.GELU_APPROX_TANH_FWD, _P.GELU_APPROX_TANH_BWD,
               "x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) / 2"),
)

_ROWS = {a.name: a for a in ACTIVATIONS}
#: the mode names the functions take (refused ones included: they get their own message)
NAMES: tuple[str, ...] = tuple(a.name for a in ACTIVATIONS if not a.refused)
#: cudnnActivationMode_t -> row, for the modes the legacy kernels run
LEGACY: dict[ActivationMode, Activation] = {a.legacy: a for a in ACTIVATIONS
                                            if a.legacy is not None}
#: the modes only the graph API runs
GRAPH_ONLY: frozenset[str] = frozenset(a.name for a in ACTIVATIONS if a.legacy is None)
#: CuPy 13's ``CUDNN_ACTIVATION_*`` constants: name -> value
CUPY_CONSTANTS: dict[str, int] = {a.cupy: int(a.legacy) for a in ACTIVATIONS
                                  if a.cupy and a.legacy is not None}


def row(name: str) -> Activation:
    """The row of mode ``name`` (a name from the table)."""
    return _ROWS[name]
