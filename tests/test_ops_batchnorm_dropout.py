"""Batch normalization and dropout without a GPU: the C rows against libcudnn's symbols and
their header signatures, descriptors built by the real libcudnn (no handle needed), argument checks
that name the parameter before anything runs, and a small fuzz of bad arguments.

Tensor views point at made-up device addresses. A call that passes validation goes on to ask for
a cuDNN handle, which raises NoDeviceError here; on a machine with a GPU those calls would reach
the made-up addresses, so the tests that make them skip there (test_ops_batchnorm_dropout_gpu.py
runs this module in a subprocess that sees no GPU).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pycudnn
from pycudnn import errors as E
from pycudnn.cudnn.descriptors import live_descriptor_count
from pycudnn.ffi import library as _lib
from pycudnn.ops import batchnorm as bn
from pycudnn.ops import dropout as dr
from pycudnn.runtime import memory as M
from pycudnn.runtime.tensor import contiguous_strides

GPU_VISIBLE = M.device_count() > 0
no_gpu_only = pytest.mark.skipif(
    GPU_VISIBLE, reason="a GPU is visible: made-up device addresses must never reach it (the "
                        "GPU test module runs this file with CUDA_VISIBLE_DEVICES='')")

BASE = 0x7F00_0000_0000
REGION = 1 << 36
_next = [0]


def T(shape, dtype="float32", strides=None, readonly=False):
    """A view of made-up device memory in its own region (so no two views overlap)."""
    _next[0] += 1
    return pycudnn.tensor_from_pointer(BASE + _next[0] * REGION, shape, dtype, strides=strides,
                                       readonly=readonly)


def args(shape=(4, 3, 5, 5), dtype="float32", pdtype=None, c=None):
    pdtype = pdtype or ("float64" if dtype == "float64" else "float32")
    c = shape[1] if c is None else c
    return T(shape, dtype), T((c,), pdtype), T((c,), pdtype), T((c,), pdtype), T((c,), pdtype)


# (their C rows are in the one table: tests/test_lib.py checks each against its signature)


# ---- descriptors, built by libcudnn --------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 7), (2, 3, 4, 5), (2, 3, 4, 5, 6)])
@pytest.mark.parametrize("mode", ["per_activation", "spatial", "spatial_persistent"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_parameter_descriptor_is_what_cudnn_derives(shape, mode, dtype):
    """pycudnn describes scale/bias/statistics itself; cudnnDeriveBNTensorDescriptor (no handle
    needed) must agree on dims and dtype."""
    x = T(shape, dtype)
    x4 = bn.arguments.as4d(x)
    _, p4 = bn.arguments.param_shape(x, bn.MODES[mode])
    ours = pycudnn.TensorDescriptor(p4, bn.arguments.param_dtype(x))
    xd = pycudnn.TensorDescriptor(x4.shape, x4.dtype, x4.strides)
    derived = pycudnn.TensorDescriptor(p4, "float32")  # overwritten by cuDNN below
    st = _lib.lib().cudnnDeriveBNTensorDescriptor(derived.handle, xd.handle, bn.MODES[mode])
    assert st == 0
    assert derived._query()[:2] == ours._query()[:2]
    # float32 scale/bias for half and bfloat16 input, double for double (cuDNN's rule)
    assert derived._query()[0] == (8 - 7 if dtype == "float64" else 0)


def test_dropout_descriptor_lifetime():
    before = live_descriptor_count()
    d = dr.DropoutDescriptor()
    assert live_descriptor_count() == before + 1
    assert d.handle and "DropoutDescriptor(" in repr(d)
    with pytest.raises(TypeError, match="cannot pickle"):
        __import__("pickle").dumps(d)
    d.close()
    d.close()
    assert d.closed and repr(d) == "DropoutDescriptor(<closed>)"
    with pytest.raises(ValueError, match="closed"):
        d.handle
    assert live_descriptor_count() == before


def test_dropout_reserve_size_from_cudnn():
    sizes = [dr.dropout_reserve_size((n,)) for n in (1, 100, 10_000, 1_000_000)]
    assert all(s > 0 for s in sizes) and sizes == sorted(sizes)
    assert sizes[-1] >= 1_000_000 // 8  # at least one bit of mask per element
    assert dr.dropout_reserve_size((0, 5)) == 0
    # the mask does not depend on the element type's size more than the count does
    assert dr.dropout_reserve_size((1000,), "float64") >= dr.dropout_reserve_size((1000,))


def test_descriptor_cache_is_bounded():
    bn.clear_cache()
    for n in range(bn.descriptors.CACHE_MAX + 10):
        x = T((2, 3, 1, n + 1))
        bn.descriptors.layout_of(x, 1, (1, 3, 1, 1), np.dtype("float32"))
    assert bn.descriptors.layout_count() == bn.descriptors.CACHE_MAX
    bn.clear_cache()
    assert bn.descriptors.layout_count() == 0


# ---- argument checks ------------------------------------------------------------------------------

def fwd(x, w, b, rm=None, rv=None, **kw):
    return bn.batch_norm_forward_training(x, w, b, rm, rv, **kw)


CASES = {
    "weight channels": (lambda: fwd(T((4, 3, 5, 5)), T((4,)), T((3,))), ValueError, "weight"),
    "bias channels": (lambda: fwd(T((4, 3, 5, 5)), T((3,)), T((2,))), ValueError, "bias"),
    "running_mean channels": (lambda: fwd(T((4, 3, 5, 5)), T((3,)), T((3,)), T((5,)), T((3,))),
                              ValueError, "running_mean"),
    "running_var channels": (lambda: fwd(T((4, 3, 5, 5)), T((3,)), T((3,)), T((3,)), T((1,))),
                             ValueError, "running_var"),
    "weight dtype half": (lambda: fwd(T((4, 3, 5, 5), "float16"), T((3,), "float16"),
                                      T((3,))), TypeError, "weight"),
    "bias dtype": (lambda: fwd(T((4, 3, 5, 5), "float64"), T((3,), "float64"), T((3,))),
                   TypeError, "bias"),
    "running_var dtype": (lambda: fwd(T((4, 3, 5, 5)), T((3,)), T((3,)), T((3,)),
                                      T((3,), "float64")), TypeError, "running_var"),
    "mode": (lambda: fwd(*args()[:3], mode="sptial"), ValueError, "mode"),
    "mode int": (lambda: fwd(*args()[:3], mode=7), ValueError, "mode"),
    "mode bool": (lambda: fwd(*args()[:3], mode=True), ValueError, "mode"),
    "momentum inf": (lambda: fwd(*args()[:3], momentum=float("inf")), ValueError,
                     "expected momentum to be a finite number"),
    "momentum nan": (lambda: fwd(*args()[:3], momentum=float("nan")), ValueError, "momentum"),
    "momentum str": (lambda: fwd(*args()[:3], momentum="0.1"), TypeError, "momentum"),
    "eps < 0": (lambda: fwd(*args()[:3], eps=-1e-5), ValueError, "eps"),
    "eps inf": (lambda: fwd(*args()[:3], eps=float("inf")), ValueError, "eps"),
    "eps bool": (lambda: fwd(*args()[:3], eps=True), TypeError, "eps"),
    "one running stat": (lambda: fwd(*args()[:4]), ValueError, "running_var"),
    "read-only out": (lambda: fwd(*args()[:3], out=T((4, 3, 5, 5), readonly=True)), ValueError,
                      "out"),
    "out shape": (lambda: fwd(*args()[:3], out=T((4, 3, 5, 4))), ValueError, "out"),
    "out dtype": (lambda: fwd(*args()[:3], out=T((4, 3, 5, 5), "float64")), TypeError, "out"),
    "read-only running_mean": (lambda: fwd(T((4, 3, 5, 5)), T((3,)), T((3,)),
                                           T((3,), readonly=True), T((3,))), ValueError,
                               "running_mean"),
    "read-only save_mean": (lambda: fwd(*args()[:3], save_mean=T((3,), readonly=True)),
                            ValueError, "save_mean"),
    "one value per channel": (lambda: fwd(T((1, 3, 1, 1)), T((3,)), T((3,))), ValueError,
                              "more than 1 value per channel"),
    "input rank": (lambda: fwd(T((2, 3, 2, 2, 2, 2)), T((3,)), T((3,))), ValueError, "input"),
    "input broadcast": (lambda: fwd(T((4, 3, 5, 5), strides=(75, 25, 0, 1)), T((3,)), T((3,))),
                        ValueError, "input"),
    # broadcast (stride-0) parameters: refused up front naming the parameter, before a handle is
    # taken or anything is staged
    "weight broadcast": (lambda: fwd(T((4, 3, 5, 5)), T((3,), strides=(0,)), T((3,))),
                         ValueError, "expected weight without broadcast dims"),
    "bias broadcast": (lambda: fwd(T((4, 3, 5, 5)), T((3,)), T((3,), strides=(0,))),
                       ValueError, "expected bias without broadcast dims"),
    "running_mean broadcast": (lambda: fwd(T((4, 3, 5, 5)), T((3,)), T((3,)),
                                           T((3,), strides=(0,)), T((3,))),
                               ValueError, "expected running_mean without broadcast dims"),
    "save_invstd broadcast": (lambda: fwd(*args()[:3], save_invstd=T((3,), strides=(0,))),
                              ValueError, "expected save_invstd without broadcast dims"),
    "inference running_var broadcast": (lambda: bn.batch_norm_forward_inference(
        T((4, 3, 5, 5)), T((3,)), T((3,)), T((3,)), T((3,), strides=(0,))), ValueError,
        "expected running_var without broadcast dims"),
    "backward save_mean broadcast": (lambda: bn.batch_norm_backward(
        T((4, 3, 5, 5)), T((4, 3, 5, 5)), T((3,)), T((3,), strides=(0,)), T((3,))), ValueError,
        "expected save_mean without broadcast dims"),
    "per_activation weight": (lambda: fwd(T((4, 3, 5, 5)), T((3,)), T((3,)),
                                          mode="per_activation"), ValueError, "weight"),
    "inference without stats": (lambda: bn.batch_norm_forward_inference(
        *args()[:3], None, None), ValueError, "running_mean"),
    "inference eps": (lambda: bn.batch_norm_forward_inference(*args(), eps=-1), ValueError,
                      "eps"),
    "backward grad_output shape": (lambda: bn.batch_norm_backward(
        T((4, 3, 5, 5)), T((4, 3, 5, 6)), T((3,)), T((3,)), T((3,))), ValueError, "grad_output"),
    "backward grad_output dtype": (lambda: bn.batch_norm_backward(
        T((4, 3, 5, 5)), T((4, 3, 5, 5), "float64"), T((3,)), T((3,)), T((3,))), TypeError,
        "grad_output"),
    "backward one saved stat": (lambda: bn.batch_norm_backward(
        T((4, 3, 5, 5)), T((4, 3, 5, 5)), T((3,)), T((3,)), None), ValueError, "save_invstd"),
    "backward reserve type": (lambda: bn.batch_norm_backward(
        T((4, 3, 5, 5)), T((4, 3, 5, 5)), T((3,)), T((3,)), T((3,)), reserve=b"x"), TypeError,
        "reserve"),
    "out overlaps input": (lambda: (lambda x: fwd(x, T((3,)), T((3,)), out=x))(T((4, 3, 5, 5))),
                           ValueError, "out"),
    "save_mean overlaps running_mean": (lambda: (lambda r: fwd(
        T((4, 3, 5, 5)), T((3,)), T((3,)), r, T((3,)), save_mean=r))(T((3,))), ValueError,
        "save_mean"),
    "add_relu z shape": (lambda: bn.batch_norm_add_relu_forward_training(
        T((4, 8, 5, 5), "float16"), T((4, 8, 5, 4), "float16"), T((8,)), T((8,))), ValueError,
        "z"),
    "add_relu z dtype": (lambda: bn.batch_norm_add_relu_forward_training(
        T((4, 8, 5, 5), "float16"), T((4, 8, 5, 5)), T((8,)), T((8,))), TypeError, "z"),
    "add_relu backward y": (lambda: bn.batch_norm_add_relu_backward(
        T((4, 8, 5, 5)), T((4, 8, 5, 4)), T((4, 8, 5, 5)), T((8,)), T((8,)), T((8,)), T((8,))),
        ValueError, "y"),
    "dropout p = 1": (lambda: dr.DropoutState(1.0), ValueError, "probability"),
    "dropout p < 0": (lambda: dr.DropoutState(-0.1), ValueError, "probability"),
    "dropout p nan": (lambda: dr.DropoutState(float("nan")), ValueError, "probability"),
    "dropout p str": (lambda: dr.DropoutState("0.5"), TypeError, "p"),
    "dropout seed < 0": (lambda: dr.DropoutState(0.5, -1), ValueError, "seed"),
    "dropout seed 2**64": (lambda: dr.DropoutState(0.5, 2**64), ValueError, "seed"),
    "dropout seed float": (lambda: dr.DropoutState(0.5, 1.5), TypeError, "seed"),
    "dropout state type": (lambda: dr.dropout_forward(T((4, 4)), object()), TypeError, "state"),
    "dropout backward reserve type": (lambda: dr.dropout_backward(T((4, 4)), _state(), b"x"),
                                      TypeError, "reserve"),
    "dropout out shape": (lambda: dr.dropout_forward(T((4, 4)), _state(), out=T((4, 5))),
                          ValueError, "out"),
    "dropout out dtype": (lambda: dr.dropout_forward(T((4, 4)), _state(), out=T((4, 4),
                                                                               "float16")),
                          TypeError, "out"),
    "dropout read-only out": (lambda: dr.dropout_forward(T((4, 4)), _state(),
                                                         out=T((4, 4), readonly=True)),
                              ValueError, "out"),
    "dropout out overlaps": (lambda: (lambda x: dr.dropout_forward(x, _state(), out=x))(
        T((4, 4))), ValueError, "out"),
    "dropout backward shape": (lambda: dr.dropout_backward(T((4, 5)), _state(), _reserve((4, 4))),
                               ValueError, "grad_output"),
    "dropout backward dtype": (lambda: dr.dropout_backward(T((4, 4), "float16"), _state(),
                                                           _reserve((4, 4))),
                               TypeError, "grad_output"),
    "dropout p setter": (lambda: setattr(_state(), "p", 1.0), ValueError, "probability"),
}


def _state(p=0.5, device=0):
    """A DropoutState shell for argument checks (the real one needs a GPU to initialise)."""
    s = object.__new__(dr.DropoutState)
    s._p, s.seed, s.device, s._lock = p, 0, device, threading.Lock()
    return s


def _reserve(shape, dtype="float32"):
    return dr.DropoutReserve(None, 16, shape, contiguous_strides(shape),
                             np.dtype(dtype), 0, 0.5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_argument_names_the_parameter(name):
    call, exc, word = CASES[name]
    with pytest.raises(exc) as info:
        call()
    assert word in str(info.value), str(info.value)


@no_gpu_only
@pytest.mark.parametrize("call", [
    lambda: fwd(*args()),
    lambda: fwd(*args((4, 3)), mode="per_activation"),
    lambda: fwd(*args((4, 6, 7), "float16")),
    lambda: fwd(*args((2, 3, 4, 5, 6), "float64"), momentum=1.0, eps=0.0),
    lambda: fwd(*args(), momentum=1.5),  # PyTorch's OpInfo samples: momentum outside [0, 1]
    lambda: fwd(*args(), momentum=-0.2),
    lambda: fwd(T((4, 3, 5, 5), "bfloat16"), T((3, 5, 5)), T((75,)), mode="per_activation"),
    lambda: fwd(*args(), mode="spatial_persistent", out=T((4, 3, 5, 5))),
    lambda: fwd(T((4, 3, 5, 5), strides=(75, 1, 15, 3)), T((3,), strides=(2,)), T((3,))),
    lambda: bn.batch_norm_forward_inference(*args()),
    lambda: bn.batch_norm_backward(T((4, 3, 5, 5)), T((4, 3, 5, 5)), T((3,)), None, None),
    lambda: bn.batch_norm_add_relu_forward_training(
        T((4, 8, 5, 5), "float16"), T((4, 8, 5, 5), "float16"), T((8,)), T((8,))),
    lambda: bn.batch_norm_add_relu_backward(
        T((4, 8, 5, 5)), T((4, 8, 5, 5)), T((4, 8, 5, 5)), T((8,)), T((8,)), T((8,)), T((8,))),
    lambda: dr.DropoutState(0.0, 2**64 - 1),
    lambda: dr.dropout_forward(T((3, 4, 5)), _state()),
    lambda: dr.dropout_backward(T((4, 4)), _state(), _reserve((4, 4))),
], ids=lambda f: "valid")
def test_valid_call_passes_validation_and_then_needs_a_device(call):
    with pytest.raises(E.NoDeviceError):
        call()


# ---- fuzz ------------------------------------------------------------------------------------------

DTYPES = ("float32", "float16", "bfloat16", "float64")


@st.composite
def bn_cases(draw):
    nd = draw(st.integers(1, 6))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd)))
    dtype = draw(st.sampled_from(DTYPES))
    mode = draw(st.sampled_from(["spatial", "per_activation", "spatial_persistent", "bogus", 3]))
    c = shape[1] if nd > 1 else 1
    wc = draw(st.sampled_from([c, c + 1, max(c - 1, 0)]))
    pdtype = draw(st.sampled_from(["auto", "float16", "float64", "float32"]))
    momentum = draw(st.sampled_from([0.1, 0.0, 1.0, -0.5, 2.0, float("nan")]))
    eps = draw(st.sampled_from([1e-5, 0.0, -1.0, float("inf")]))
    return shape, dtype, mode, wc, pdtype, momentum, eps


def _violations(shape, dtype, mode, wc, pdtype, momentum, eps):
    """Every rule the case breaks, by the parameter it names (written from the documented rules,
    not from the implementation)."""
    out = []
    if not 2 <= len(shape) <= 5:
        return ["input"]
    if mode not in ("spatial", "per_activation", "spatial_persistent"):
        out.append("mode")
        return out
    per_channel = shape[0] * (math.prod(shape[2:]) if mode != "per_activation" else 1)
    if per_channel <= 1:
        out.append("more than 1 value per channel")
    want_count = shape[1] if mode != "per_activation" else math.prod(shape[1:])
    want_dtype = "float64" if dtype == "float64" else "float32"
    wcount = wc if mode != "per_activation" else wc * math.prod(shape[2:])
    if wcount != want_count or (pdtype != "auto" and pdtype != want_dtype):
        out.append("weight")
    if not math.isfinite(momentum):  # any finite momentum, as PyTorch takes
        out.append("momentum")
    if not (eps >= 0 and math.isfinite(eps)):
        out.append("eps")
    return out


@no_gpu_only
@settings(max_examples=300, deadline=None, derandomize=True)
@given(bn_cases())
def test_fuzz_batch_norm_forward_training(case):
    shape, dtype, mode, wc, pdtype, momentum, eps = case
    bad = _violations(*case)
    want_dtype = "float64" if dtype == "float64" else "float32"
    pdt = want_dtype if pdtype == "auto" else pdtype
    c = shape[1] if len(shape) > 1 else 1
    pshape = (wc,) if mode != "per_activation" or len(shape) < 2 else (wc,) + shape[2:]
    x = T(shape, dtype)
    w, b = T(pshape, pdt) if wc else T((0,), pdt), T((c,) if mode != "per_activation"
                                                        else shape[1:] if len(shape) > 1 else (1,),
                                                        want_dtype)
    try:
        fwd(x, w, b, momentum=momentum, eps=eps, mode=mode)
    except E.NoDeviceError:
        assert not bad, f"accepted a case that breaks {bad}"
    except (ValueError, TypeError) as exc:
        assert bad, f"refused a valid case: {exc}"
        assert any(word in str(exc) for word in bad), f"{exc} names none of {bad}"
    else:
        pytest.fail("a call on made-up addresses returned")


@no_gpu_only
@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3),
                 st.booleans(), st.text(max_size=2)),
       st.one_of(st.integers(-2**65, 2**65), st.floats(), st.booleans()))
def test_fuzz_dropout_state(p, seed):
    p_ok = isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p < 1
    seed_ok = isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**64
    try:
        dr.DropoutState(p, seed)
    except E.NoDeviceError:
        assert p_ok and seed_ok
    except (ValueError, TypeError) as exc:
        assert not (p_ok and seed_ok), exc
        assert ("seed" in str(exc)) if p_ok else ("p" in str(exc)), exc


# ---- repeated calls: the plan, and the checks its key cannot make -----------------------------------

def _full_path_forbidden(monkeypatch):
    """Make the full checks fail loudly: what a call raises after this came from its plan."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the full path ran for a signature that has a plan")
    for module, name in ((bn.training, "training_full"), (bn.inference, "inference_full"),
                         (bn.backward, "backward_full")):
        monkeypatch.setattr(module, name, forbidden)
    for name in ("forward_full", "backward_full"):
        monkeypatch.setattr(dr, name, forbidden)


@no_gpu_only
def test_batch_norm_plans_are_made_once_per_signature():
    bn.clear_cache()
    x, w, b, rm, rv = args()
    before = live_descriptor_count()
    for _ in range(3):
        with pytest.raises(E.NoDeviceError):
            fwd(x, w, b, rm, rv)
    assert len(bn.plans.TRAIN) == 1
    with pytest.raises(E.NoDeviceError):  # new addresses, same signature: the same plan
        fwd(*args())
    assert len(bn.plans.TRAIN) == 1 and live_descriptor_count() - before == 2  # x's and the params'
    with pytest.raises(E.NoDeviceError):  # another momentum: another plan, same descriptors
        fwd(x, w, b, rm, rv, momentum=0.2)
    assert len(bn.plans.TRAIN) == 2 and live_descriptor_count() - before == 2
    # a call that copies (strided weight) keeps no plan: it takes the full checks every time
    with pytest.raises(E.NoDeviceError):
        fwd(x, T((3,), strides=(2,)), b, rm, rv)
    assert len(bn.plans.TRAIN) == 2
    bn.clear_cache()
    assert not bn.plans.TRAIN


@no_gpu_only
def test_planned_batch_norm_calls_still_check_addresses_and_read_only_outputs(monkeypatch):
    x, w, b, rm, rv = args()
    out, sm, si = T(x.shape), T((3,)), T((3,))
    dy = T(x.shape)
    for call in (lambda: fwd(x, w, b, rm, rv),
                 lambda: fwd(x, w, b, rm, rv, out=out, save_mean=sm, save_invstd=si),
                 lambda: bn.batch_norm_forward_inference(x, w, b, rm, rv, out=out),
                 lambda: bn.batch_norm_backward(x, dy, w, sm, si, out=out)):
        with pytest.raises(E.NoDeviceError):
            call()  # the full checks pass and leave a plan
    _full_path_forbidden(monkeypatch)
    with pytest.raises(E.NoDeviceError):
        fwd(x, w, b, rm, rv)  # the plan
    with pytest.raises(ValueError, match="running_mean: is read-only"):
        fwd(x, w, b, T((3,), readonly=True), rv)
    with pytest.raises(ValueError, match="running_var: is read-only"):
        fwd(x, w, b, rm, T((3,), readonly=True))
    shared = pycudnn.tensor_from_pointer(rm.ptr + 4, (3,), "float32")
    with pytest.raises(ValueError, match="running_mean and running_var overlap"):
        fwd(x, w, b, rm, shared)
    # updated in place, so never one of the inputs (one ``ones`` as weight and running_var)
    with pytest.raises(ValueError, match="running_var overlaps weight"):
        fwd(x, w, b, rm, pycudnn.tensor_from_pointer(w.ptr, (3,), "float32"))
    with pytest.raises(ValueError, match="running_mean overlaps bias"):
        fwd(x, w, b, pycudnn.tensor_from_pointer(b.ptr, (3,), "float32"), rv)
    on_x = pycudnn.tensor_from_pointer(x.ptr, x.shape, "float32")
    with pytest.raises(ValueError, match="out overlaps input"):
        fwd(x, w, b, rm, rv, out=on_x, save_mean=sm, save_invstd=si)
    with pytest.raises(ValueError, match="out: is read-only"):
        fwd(x, w, b, rm, rv, out=T(x.shape, readonly=True), save_mean=sm, save_invstd=si)
    with pytest.raises(ValueError, match="save_mean overlaps running_var"):
        fwd(x, w, b, rm, rv, out=out, save_mean=rv, save_invstd=si)
    with pytest.raises(ValueError, match="save_invstd: is read-only"):
        fwd(x, w, b, rm, rv, out=out, save_mean=sm, save_invstd=T((3,), readonly=True))
    with pytest.raises(ValueError, match="out overlaps weight"):
        bn.batch_norm_forward_inference(
            x, w, b, rm, rv, out=pycudnn.tensor_from_pointer(w.ptr, x.shape, "float32"))
    with pytest.raises(ValueError, match="out overlaps grad_output"):
        bn.batch_norm_backward(x, dy, w, sm, si,
                               out=pycudnn.tensor_from_pointer(dy.ptr, x.shape, "float32"))


@no_gpu_only
def test_planned_batch_norm_backward_hands_a_foreign_reserve_to_the_full_checks():
    x, dy, w = T((4, 3, 5, 5)), T((4, 3, 5, 5)), T((3,))
    with pytest.raises(E.NoDeviceError):
        bn.batch_norm_backward(x, dy, w, None, None)
    for reserve, exc, words in [
            (b"x", TypeError, "expected reserve to be the ReserveSpace"),
            (bn.ReserveSpace(None, 16, 1, False, ()), ValueError, "expected reserve on cuda:0")]:
        with pytest.raises(exc, match=words):
            bn.batch_norm_backward(x, dy, w, None, None, reserve=reserve)
    # a reserve of another call is refused by the checks, before any GPU work (here that would
    # be a NoDeviceError): another shape, another mode, the fused forward's
    key = ((4, 3, 5, 5), (75, 25, 5, 1), np.dtype("float32"), bn.MODES["spatial"], 0)
    for bad in (((2,) + key[0][1:],) + key[1:], key[:3] + (bn.MODES["spatial_persistent"], 0),
                key[:4] + (2,)):
        with pytest.raises(ValueError, match="reserve was made by a forward pass of another"):
            bn.batch_norm_backward(x, dy, w, None, None,
                                   reserve=bn.ReserveSpace(None, 16, 0, bad[4] == 2, bad))
    with pytest.raises(ValueError, match="reserve comes from a batch norm without the fused"):
        bn.batch_norm_add_relu_backward(x, x, dy, w, w, None, None,
                                        reserve=bn.ReserveSpace(None, 16, 0, False, key))


def test_dropout_p_that_rounds_to_one_in_float32_is_refused():
    with pytest.raises(ValueError, match="rounds to 1.0"):
        dr.DropoutState(1 - 1e-8, seed=0)
    with pytest.raises(ValueError, match=r"has to be in \[0, 1\)"):
        dr.DropoutState(10**400, seed=0)


@no_gpu_only
def test_planned_dropout_calls_still_check_state_reserve_and_addresses(monkeypatch):
    x, dy = T((3, 4, 5)), T((4, 4))
    for call in (lambda: dr.dropout_forward(x, _state(), out=T(x.shape)),
                 lambda: dr.dropout_backward(dy, _state(), _reserve((4, 4)), out=T(dy.shape))):
        with pytest.raises(E.NoDeviceError):
            call()
    assert min(dr.plan_counts()) >= 1
    monkeypatch.setattr(dr, "forward_full", lambda *a: pytest.fail("full path ran"))
    with pytest.raises(E.NoDeviceError):
        dr.dropout_forward(x, _state(), out=T(x.shape))  # the plan
    with pytest.raises(ValueError, match="out overlaps input"):
        dr.dropout_forward(x, _state(), out=pycudnn.tensor_from_pointer(x.ptr, x.shape, "float32"))
    with pytest.raises(ValueError, match="out: is read-only"):
        dr.dropout_forward(x, _state(), out=T(x.shape, readonly=True))
    monkeypatch.undo()
    # what the plan cannot vouch for goes to the full checks, which name it
    with pytest.raises(TypeError, match="state"):
        dr.dropout_forward(x, object(), out=T(x.shape))
    with pytest.raises(ValueError, match="cuda:1"):
        dr.dropout_forward(x, _state(device=1), out=T(x.shape))
    with pytest.raises(TypeError, match="reserve"):
        dr.dropout_backward(dy, _state(), b"x", out=T(dy.shape))
    with pytest.raises(ValueError, match="grad_output"):
        dr.dropout_backward(dy, _state(), _reserve((2, 8)), out=T(dy.shape))
    with pytest.raises(ValueError, match="out overlaps grad_output"):
        dr.dropout_backward(dy, _state(), _reserve((4, 4)),
                            out=pycudnn.tensor_from_pointer(dy.ptr, dy.shape, "float32"))
