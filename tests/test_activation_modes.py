"""The activation table without a GPU: every other activation table is derived from its rows,
the graphs of the graph-only modes (GELU) and of the edge corrections are the pointwise steps
the cuDNN 9 header names, and the ceiling correction of clipped ReLU is PyTorch's ``x < coef``
for every value of each dtype."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import pycudnn
from pycudnn import cupy_compat as cc
from pycudnn._types import ActivationMode
from pycudnn.ffi.backend import Attr, PointwiseMode
from pycudnn.ops import activation, runtime_kernels
from pycudnn.ops.activation_modes import (
    ACTIVATIONS,
    CUPY_CONSTANTS,
    GRAPH_ONLY,
    NAMES,
    row,
)

BASE = 0x7F00_0000_0000


def t(*shape, dtype="float32", strides=None, region=0):
    return pycudnn.tensor_from_pointer(BASE + (region << 40), shape, dtype, strides=strides)


def test_the_cuDNN_9_header_values_of_the_gelu_pointwise_modes():
    # cudnn_graph_v9.h: CUDNN_POINTWISE_GELU_FWD = 104, GELU_APPROX_TANH_FWD = 107,
    # GELU_BWD = 204, GELU_APPROX_TANH_BWD = 207
    assert (PointwiseMode.GELU_FWD, PointwiseMode.GELU_APPROX_TANH_FWD) == (104, 107)
    assert (PointwiseMode.GELU_BWD, PointwiseMode.GELU_APPROX_TANH_BWD) == (204, 207)


def test_each_legacy_mode_appears_once_and_the_graph_only_ones_are_gelu():
    legacy = [a.legacy for a in ACTIVATIONS if a.legacy is not None]
    assert sorted(legacy) == sorted(ActivationMode)
    assert GRAPH_ONLY == {"gelu", "gelu_tanh"}
    assert row("gelu").forward == PointwiseMode.GELU_FWD
    assert row("gelu_tanh").backward == PointwiseMode.GELU_APPROX_TANH_BWD
    assert "identity" not in NAMES and len(set(NAMES)) == len(NAMES)


def test_the_functions_modes_and_cupys_constants_come_from_the_rows():
    assert list(activation.MODES) == list(NAMES)
    assert activation.MODES["gelu"] is None and activation.MODES["swish"] == ActivationMode.SWISH
    for name, value in CUPY_CONSTANTS.items():
        assert getattr(cc, name) == value
    assert set(CUPY_CONSTANTS) == {n for n in cc.__all__ if n.startswith("CUDNN_ACTIVATION_")}
    # CuPy 13 had no GELU constant
    assert all(not row(m).cupy for m in GRAPH_ONLY)


def test_gelu_graphs_are_one_pointwise_op_reading_x_and_dy():
    for mode, fwd, bwd in (("gelu", PointwiseMode.GELU_FWD, PointwiseMode.GELU_BWD),
                           ("gelu_tanh", PointwiseMode.GELU_APPROX_TANH_FWD,
                            PointwiseMode.GELU_APPROX_TANH_BWD)):
        steps, real, virtual = runtime_kernels.activation_steps(row(mode), 0.0, False)
        assert [(s.mode, s.x, s.y) for s in steps] == [(fwd, "x", "y")]
        assert real == ("x", "y") and virtual == ()
        steps, real, virtual = runtime_kernels.activation_steps(row(mode), 0.0, True)
        assert [(s.mode, s.x, s.dy, s.dx) for s in steps] == [(bwd, "x", "dy", "dx")]
        assert real == ("dy", "x", "dx") and virtual == ()


def test_coef_sets_the_rows_graph_attributes():
    steps, _, _ = runtime_kernels.activation_steps(row("clipped_relu"), 6.0, False)
    assert dict(steps[0].params) == {Attr.POINTWISE_RELU_UPPER_CLIP: 6.0,
                                     Attr.POINTWISE_RELU_LOWER_CLIP: 0.0}
    steps, _, _ = runtime_kernels.activation_steps(row("elu"), 0.5, True)
    assert dict(steps[0].params) == {Attr.POINTWISE_ELU_ALPHA: 0.5}


def test_the_sigmoid_backward_graph_reads_the_output():
    steps, real, virtual = runtime_kernels.activation_steps(row("sigmoid"), 0.0, True)
    assert steps == list(row("sigmoid").from_output)
    assert real == ("dy", "y", "dx") and set(virtual) == {"yy", "d"}


def _evaluate(steps, values):
    """The pointwise steps run in float64 NumPy (IEEE: inf * 0 is NaN), on ``values`` by name."""
    with np.errstate(all="ignore"):
        def sigmoid(v):
            return np.where(v >= 0, 1 / (1 + np.exp(-v)), np.exp(v) / (1 + np.exp(v)))
        ops = {PointwiseMode.ADD: np.add, PointwiseMode.MUL: np.multiply,
               PointwiseMode.SUB: np.subtract, PointwiseMode.NEG: lambda v, _: -v,
               PointwiseMode.SIGMOID_FWD: lambda v, _: sigmoid(v)}
        env = dict(values)
        for st in steps:
            env[st.y] = ops[st.mode](env[st.x], env.get(st.b))
    return env["dx"]


EDGES = np.array([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-8, 0.3, -1.0, 2.5, -6.0, 17.0,
                  40.0, -40.0, 1e30, -1e30])


def _pytorch_gradient(mode, coef, x, dy):
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = torch.tanh(xt) if mode == "tanh" else (
        torch.nn.functional.silu(xt) if coef == 1.0 else xt * torch.sigmoid(coef * xt))
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return xt.grad.numpy()


@pytest.mark.parametrize("mode,coef", [("tanh", 0.0), ("swish", 1.0), ("swish", 0.5),
                                       ("swish", 2.0)])
def test_tanh_and_swish_gradient_graphs_are_pytorchs_values_on_x(mode, coef):
    steps, real, virtual = runtime_kernels.activation_steps(row(mode), coef, True)
    assert real == ("dy", "x", "dx") and not set(virtual) & {"one", "coef"}
    dy = np.linspace(0.5, 3.0, EDGES.size)
    got = _evaluate(steps, {"x": EDGES, "dy": dy, "one": 1.0, "coef": coef})
    want = _pytorch_gradient(mode, coef, EDGES, dy)
    if coef != 1.0 and mode == "swish":  # no PyTorch function: its formula on finite x only
        got, want = got[np.isfinite(EDGES)], want[np.isfinite(EDGES)]
    # NaN where PyTorch's is NaN; where tanh(x) rounds to 1, PyTorch's 1 - y * y is 0 (or a few
    # units of 1e-16 off, from the cancellation) and ours sech(x)^2's true value
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_tanh_and_swish_gradient_graphs_read_their_scalars_by_value():
    build = runtime_kernels.activation_graph(row("swish"), 0.5, ((1, 8, 2, 2), (32, 1, 16, 8)),
                                             np.float32, True, "swish backward")
    dicts = [c.cell_contents for c in build.__closure__ if isinstance(c.cell_contents, dict)]
    tensors = next(d for d in dicts if "dy" in d)
    assert {n for n, spec in tensors.items() if spec.by_value} == {"one", "coef"}
    assert {"one": 1.0, "coef": 0.5} in dicts
    uids = [spec.uid for spec in tensors.values()]
    assert len(set(uids)) == len(uids)


def test_a_gelu_signature_runs_its_graph_on_the_callers_memory_where_it_can():
    x = t(2, 64, 8, 8)
    k = activation.graph_kernel(row("gelu"), 0.0, x, (x.strides,), False, "activation_forward")
    assert k.direct and k.padded == x.size
    assert k.description == f"gelu forward of {x.size} float32 elements"
    # 7 elements have no (1, C, H, W) block with H, W > 1: padded to 8, through copies
    k = activation.graph_kernel(row("gelu_tanh"), 0.0, t(7), ((1,),), True, "activation_backward")
    assert not k.direct and k.padded == 8
    # strided operands go through dense copies
    s = t(2, 3, 8, 8, strides=(384, 128, 16, 2))
    k = activation.graph_kernel(row("gelu"), 0.0, s, (s.strides,), False, "activation_forward")
    assert not k.direct
    x = t(2, 64, 8, 8)
    k = activation.graph_kernel(row("gelu"), 0.0, x, ((4096, 1, 512, 64),), False,
                                "activation_forward")
    assert not k.direct  # the output laid out otherwise


def test_graph_only_modes_never_get_a_legacy_promotion():
    x = t(1, 512, 32, 32)
    assert runtime_kernels.activation_promotion("gelu", 0.0, x, (x.strides,), False, True) is None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("coef", [6.0, 6.1, 1.0, 0.1, 65504.0, 70000.0, math.inf, 1e-30])
def test_the_clipped_relu_ceiling_below_coef_is_pytorchs_strict_test(dtype, coef):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    with np.errstate(invalid="ignore"):
        every = np.arange(1 << 16, dtype=np.uint16).view(dt).astype(np.float64)
    every = every[~np.isnan(every)]
    c = activation.below(coef, dt)
    # the legacy kernel's test is 0 < x <= ceiling; PyTorch's 0 < x < coef
    assert np.array_equal((every > 0) & (every <= c), (every > 0) & (every < coef))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_below_is_the_next_value_down(dtype):
    assert activation.below(6.0, dtype) == float(np.nextafter(np.array(6.0, dtype), -np.inf))
    assert activation.below(math.inf, dtype) == float(np.finfo(dtype).max)
    assert activation.below(0.1, dtype) < 0.1


def _backward(mode, coef, nan, dtype="float32"):
    y, dy, x = (t(2, 3, 4, 4, dtype=dtype, region=r) for r in (1, 2, 3))
    return activation.backward_plan(y, dy, x, mode, coef, None, nan, "activation_backward")


@pytest.mark.parametrize("mode", ["tanh", "swish"])
def test_tanh_and_swish_gradients_run_their_graph_from_the_first_call_where_pytorchs_are_asked(
        mode):
    keep, cupy = activation.NanPropagation.PROPAGATE_NAN, activation.NanPropagation.NOT_PROPAGATE_NAN
    for dtype in ("float32", "float16", "bfloat16"):
        plan = _backward(mode, 1.0, keep, dtype)
        assert plan.graph is not None and plan.launch is None, dtype
        assert plan.graph.description == f"{mode} backward of 96 {dtype} elements"
    # float64 (no graph kernel) and CuPy's calls (cuDNN's values) keep the legacy kernel
    assert _backward(mode, 1.0, keep, "float64").graph is None
    assert _backward(mode, 1.0, cupy).graph is None
    assert _backward(mode, 1.0, cupy).launch is not None


def test_pytorchs_edge_corrections_are_planned_for_pycudnns_calls_and_not_cupys():
    keep, cupy = activation.NanPropagation.PROPAGATE_NAN, activation.NanPropagation.NOT_PROPAGATE_NAN
    assert _backward("relu", 0.0, keep).fix.kind == "nan_passes"
    assert _backward("relu", 1.0, cupy).fix is None
    for mode in ("sigmoid", "tanh", "elu", "clipped_relu", "swish"):
        assert _backward(mode, 1.0, keep).fix is None


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_clipped_relu_backward_ceiling_is_one_value_below_coef(dtype):
    keep, cupy = activation.NanPropagation.PROPAGATE_NAN, activation.NanPropagation.NOT_PROPAGATE_NAN
    assert _backward("clipped_relu", 6.0, keep, dtype).keep[0].coef == activation.below(6.0, dtype)
    assert _backward("clipped_relu", math.inf, keep, dtype).keep[0].coef == float(
        np.finfo(dtype).max)
    assert _backward("clipped_relu", 6.0, cupy, dtype).keep[0].coef == 6.0  # CuPy 13's
    # the forward keeps the ceiling itself
    fwd = activation.forward_plan(t(2, 3, 4, 4, dtype=dtype), "clipped_relu", 6.0, None, keep,
                                   "activation_forward")
    assert fwd.keep[0].coef == 6.0
