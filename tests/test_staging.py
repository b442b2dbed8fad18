"""The staging steps of the operations without a GPU: what the calls copy (converted to float32
for the half-precision ELU backward and softmax passes; the hardtanh passes) is
described to the real libcudnn, which must take every descriptor, 0-d and 1-D tensors included
(cudnnTransformTensor takes 4 dims at least). The allocations, copies and launches are
recorders; the values are checked on a GPU (test_edge_values_gpu.py, test_parity_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

import pycudnn
from pycudnn.cudnn import descriptors
from pycudnn.cudnn.descriptors import TensorDescriptor
from pycudnn.cudnn.tensor_ops import tensor_descriptor
from pycudnn.ops import _common, activation, hardtanh, pooling, softmax

BASE = 0x7F00_0000_0000


class _Recorder:
    def __init__(self, monkeypatch):
        self.copies: list[tuple[tuple, str, tuple, str]] = []
        self.launches: list[str] = []
        self.next = BASE + (1 << 44)
        rec = self

        def new(shape, dtype="float32", memory_format="contiguous", device=None, stream=None):
            rec.next += 1 << 32
            return pycudnn.tensor_from_pointer(rec.next, shape, dtype)

        def output(nbytes, shape, strides, dtype, device, stream, ref):
            rec.next += 1 << 32
            return pycudnn.tensor_from_pointer(rec.next, shape, dtype, strides=strides)

        def transform(handle, src, dst):
            # the real libcudnn must take both descriptors, as cudnnTransformTensor would get them
            with tensor_descriptor(src), tensor_descriptor(dst):
                pass
            assert src.shape == dst.shape
            rec.copies.append((src.shape, src.dtype.name, dst.shape, dst.dtype.name))

        described: dict[object, TensorDescriptor] = {}

        class Described(TensorDescriptor):
            """A real descriptor, remembered by its handle for the recorded copies."""

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                described[self.handle] = self

        def cached_transform(handle, one, src, src_ptr, zero, dst, dst_ptr):
            # a copy through the descriptors a plan keeps (see _common.Staging)
            sd, dd = described[src], described[dst]
            assert sd.shape == dd.shape
            rec.copies.append((sd.shape, sd.dtype.name, dd.shape, dd.dtype.name))
            return 0

        def c_function(name):
            if name == "cudnnTransformTensor":
                return cached_transform
            return lambda *args: rec.launches.append(name) or 0

        monkeypatch.setattr(descriptors, "TensorDescriptor", Described)

        self.zeroed: list[tuple] = []

        for module in (_common, activation, softmax, hardtanh, pooling):
            for name, fn in (("empty", new), ("output", output), ("transform", transform),
                             ("c_function", c_function)):
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, fn)
            if hasattr(module, "get_handle"):
                monkeypatch.setattr(module, "get_handle", lambda *a, **k: 0)
        for module in (hardtanh, activation):
            monkeypatch.setattr(module, "from_numpy", lambda a, dtype=None, device=None,
                                stream=None: new(np.shape(a), dtype))
        monkeypatch.setattr(hardtanh, "op_tensor", lambda *a, **k: rec.launches.append("cudnnOpTensor"))
        activation.clear_plans()
        softmax.clear_plans()


def t(shape, dtype, region):
    return pycudnn.tensor_from_pointer(BASE + (region << 40), shape, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 3, 4), (2, 3, 4, 5)])
def test_half_elu_backward_runs_on_float32_copies(monkeypatch, dtype, shape):
    rec = _Recorder(monkeypatch)
    x, y, dy = t(shape, dtype, 0), t(shape, dtype, 1), t(shape, dtype, 2)
    dx = activation.activation_backward(y, dy, x, "elu", coef=1.0)
    assert dx.shape == shape and dx.dtype.name == dtype
    # y recomputed from x in float32 (the gradient reads y), then the gradient
    assert rec.launches == ["cudnnActivationForward", "cudnnActivationBackward"]
    # y, dy, x in as float32; dx back in its dtype
    assert [c[1:4:2] for c in rec.copies] == [(dtype, "float32")] * 3 + [("float32", dtype)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape,mode", [((1, 1, 5), "instance"), ((4, 100), "channel"),
                                        ((2, 3, 4, 5, 6), "channel")])
def test_half_softmax_backward_runs_on_float32_copies(monkeypatch, dtype, shape, mode):
    rec = _Recorder(monkeypatch)
    dx = softmax.softmax_backward(t(shape, dtype, 0), t(shape, dtype, 1), mode=mode)
    assert dx.shape == shape and dx.dtype.name == dtype
    assert rec.launches == ["cudnnSoftmaxBackward"]
    assert [c[1:4:2] for c in rec.copies] == [(dtype, "float32")] * 2 + [("float32", dtype)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(), (7,), (2, 3, 4, 5)])
def test_relu_backward_adds_its_edge_correction(monkeypatch, dtype, shape):
    rec = _Recorder(monkeypatch)
    x, y, dy = t(shape, dtype, 0), t(shape, dtype, 1), t(shape, dtype, 2)
    activation.activation_backward(y, dy, x, "relu")
    # y with NaN as +inf first (a minimum), then the gradient
    assert rec.launches == ["cudnnOpTensor", "cudnnActivationBackward"]
    if dtype != "float64":
        return  # tanh's and swish's gradients run a compiled graph (test_activation_modes)
    rec.launches.clear()
    for mode in ("swish", "tanh"):  # float64: the legacy kernel alone, no correction
        activation.activation_backward(y, dy, x, mode, coef=1.0)
    assert rec.launches == ["cudnnActivationBackward"] * 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape,mode", [((1, 1, 5), "instance"), ((1, 5), "channel"),
                                        ((4, 100), "channel"), ((2, 3, 4, 5, 6), "channel"),
                                        ((2, 3, 4, 5), "instance")])
@pytest.mark.parametrize("algorithm", ["accurate", "log"])
def test_half_softmax_forward_runs_on_float32_copies(monkeypatch, dtype, shape, mode, algorithm):
    """PyTorch computes a half softmax in float32 and rounds once: so does this call, so that
    its y is PyTorch's (the backward amplifies any other rounding of y)."""
    rec = _Recorder(monkeypatch)
    y = softmax.softmax_forward(t(shape, dtype, 0), mode=mode, algorithm=algorithm)
    assert y.shape == shape and y.dtype.name == dtype
    assert rec.launches == ["cudnnSoftmaxForward"]
    assert [c[1:4:2] for c in rec.copies] == [(dtype, "float32"), ("float32", dtype)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_full_precision_softmax_forward_runs_on_its_operands(monkeypatch, dtype):
    rec = _Recorder(monkeypatch)
    softmax.softmax_forward(t((2, 3, 4, 5), dtype, 0))
    assert rec.launches == ["cudnnSoftmaxForward"] and rec.copies == []


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(), (7,), (2, 3, 4, 5)])
def test_hardtanh_backward_stages_through_its_compute_dtype(monkeypatch, dtype, shape):
    rec = _Recorder(monkeypatch)
    dx = hardtanh.hardtanh_backward(t(shape, dtype, 1), t(shape, dtype, 0), -0.5, 2.0)
    assert dx.shape == shape and dx.dtype.name == dtype
    assert rec.launches.count("cudnnOpTensor") == 4  # two differences, two NaN guards
    assert rec.launches.count("cudnnActivationBackward") == 2  # the two ReLU masks
    wide = "float64" if dtype == "float64" else "float32"
    assert [c[3] for c in rec.copies[:2]] == [wide, wide]  # x and dy in the compute dtype
    if dtype != wide:
        assert rec.copies[-1][1:4:2] == (wide, dtype)


@pytest.mark.parametrize("shape,k,s,p,d", [((2, 3, 9, 9), 3, 1, 1, 2), ((1, 2, 8, 11), 2, 2, 0, 3),
                                           ((1, 1, 7, 8, 9), 2, (1, 2, 3), 1, (3, 2, 1))])
def test_dilated_max_pooling_launches_plain_poolings_libcudnn_takes(monkeypatch, shape, k, s, p,
                                                                    d):
    """Every piece's pooling and tensor descriptors are built by the real libcudnn (views with
    strides times the dilation), one launch per piece forward and backward."""
    import math

    from pycudnn.cudnn import tensor_ops

    rec = _Recorder(monkeypatch)
    monkeypatch.setattr(tensor_ops, "fill_zero", lambda t, st, h=None: rec.zeroed.append(t.shape))
    x = t(shape, "float32", 0)
    y = pooling.pooling_forward(x, k, stride=s, padding=p, dilation=d)
    nd = len(shape) - 2
    ks, ss, ps, ds = (v if isinstance(v, tuple) else (v,) * nd for v in (k, s, p, d))
    ke = tuple(di * (ki - 1) + 1 for ki, di in zip(ks, ds))
    assert y.shape == shape[:2] + pooling.output_size(shape[2:], ke, ss, ps)
    pieces = math.prod(di // math.gcd(si, di) for si, di in zip(ss, ds))
    assert rec.launches == ["cudnnPoolingForward"] * pieces
    rec.launches.clear()
    dx = pooling.pooling_backward(y, t(y.shape, "float32", 2), x, k, stride=s, padding=p,
                                  dilation=d)
    assert dx.shape == shape and rec.zeroed == [shape]  # no window reads some residues
    assert rec.launches == ["cudnnPoolingBackward"] * pieces


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(4, 100), (2, 3, 4, 5, 6)])
def test_a_repeated_half_softmax_builds_no_descriptor(monkeypatch, dtype, shape):
    """The staging copies' descriptors are kept in the plan: a repeated call makes the same
    copies and builds none (each descriptor costs microseconds of host time)."""
    from pycudnn.cudnn import tensor_ops

    rec = _Recorder(monkeypatch)
    x, dy = t(shape, dtype, 0), t(shape, dtype, 1)
    softmax.softmax_forward(x)
    softmax.softmax_backward(x, dy)
    first = list(rec.copies)

    def refused(*args, **kwargs):
        raise AssertionError("a repeated call built a descriptor")

    for module in (descriptors, softmax, tensor_ops):
        monkeypatch.setattr(module, "TensorDescriptor", refused)
    rec.copies.clear()
    softmax.softmax_forward(x)
    softmax.softmax_backward(x, dy)
    assert rec.copies == first
    assert [c[1:4:2] for c in first] == [(dtype, "float32"), ("float32", dtype)] + \
        [(dtype, "float32")] * 2 + [("float32", dtype)]
