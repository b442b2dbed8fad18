"""CPU tests of the remembered calls' lean test of a torch ``out=`` (PreparedConvolution's
``_learn_torch_out`` / ``_lean_torch_out``): the first torch out= of the output's layout is read in
full and its layout remembered in torch's terms; a later one is taken through that layout only
when every part of it matches and it has no negative bit, otherwise it is read in full again
(and refused there when it must be). There is no GPU here: the prepared convolution's device is
set to -1, what a CPU torch tensor reports, so that real torch tensors exercise the comparisons;
the GPU twin (an actual convolution through the lean path) is in test_prepared_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from pycudnn.api import prepared as P
from pycudnn.runtime.tensor import tensor_from_pointer

torch = pytest.importorskip("torch")

F32 = np.dtype("float32")
Y_SHAPE, Y_STRIDES = (1, 16, 30, 30), (14400, 900, 30, 1)


class _Record:
    def describe(self) -> str:
        return "a recorded launch"


class _Engine:
    def launcher(self, params, record):
        return lambda handle, pointers, stream: None


def _prepared(device: int = 0) -> P.PreparedConvolution:
    from test_prepared import SHAPES, STRIDES, _params

    p = P.PreparedConvolution(_params(""), _Record(), _Engine(), F32, SHAPES, STRIDES, None,
                              out_size_bytes=16 * 30 * 30 * 4)
    p.device = device
    return p


def _view(device: int = 0, strides=Y_STRIDES):
    return tensor_from_pointer(0x50000000, Y_SHAPE, F32, strides, device=device)


def test_the_first_torch_out_of_the_output_layout_is_remembered_in_torch_terms():
    p = _prepared()
    out = torch.empty(Y_SHAPE)
    p._learn_torch_out(out, _view())
    assert p._torch_out_class is torch.Tensor
    assert p._torch_out_layout == (torch.Size(Y_SHAPE), Y_STRIDES, torch.float32, 0)


@pytest.mark.parametrize("why", ["not torch", "subclass", "other strides", "other device"])
def test_nothing_is_remembered_for_an_out_that_is_not_an_exact_torch_tensor_of_the_layout(why):
    p = _prepared()
    out, view = torch.empty(Y_SHAPE), _view()
    if why == "not torch":
        out = view
    elif why == "subclass":
        out = torch.nn.Parameter(out)
    elif why == "other strides":
        view = _view(strides=(14400, 1, 480, 16))
    else:
        view = _view(device=1)
    p._learn_torch_out(out, view)
    assert p._torch_out_class is None and p._torch_out_layout is None


def test_a_remembered_layout_is_learnt_once():
    p = _prepared()
    first = torch.empty(Y_SHAPE)
    p._learn_torch_out(first, _view())
    layout = p._torch_out_layout
    p._learn_torch_out(torch.empty(Y_SHAPE), _view())
    assert p._torch_out_layout is layout


def _remembered() -> P.PreparedConvolution:
    """A prepared convolution on "device -1" (a CPU tensor's get_device()) with the torch layout
    of a dense float32 output remembered, as `_learn_torch_out` records it."""
    p = _prepared(device=-1)
    p._torch_out_layout = (torch.Size(Y_SHAPE), Y_STRIDES, torch.float32, -1)
    p._torch_out_class = torch.Tensor
    return p


def test_a_matching_torch_out_becomes_a_view_of_its_memory():
    p = _remembered()
    out = torch.empty(Y_SHAPE)
    t = p._lean_torch_out(out)
    assert t is not None
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device, t.owner, t.readonly) == (
        out.data_ptr(), Y_SHAPE, Y_STRIDES, F32, -1, out, False)
    assert type(t.shape) is tuple  # the plain tuple of the layout, not a torch.Size


def test_no_layout_remembered_means_no_lean_view():
    assert _prepared(device=-1)._lean_torch_out(torch.empty(Y_SHAPE)) is None


@pytest.mark.parametrize("make", [
    lambda: torch.empty(Y_SHAPE, dtype=torch.float64),                          # dtype
    lambda: torch.empty((1, 16, 30, 31))[..., :30],                             # strides
    lambda: torch.empty((2, 16, 30, 30)),                                       # shape
    lambda: torch.empty(Y_SHAPE).to(memory_format=torch.channels_last),         # strides
    lambda: torch.empty(Y_SHAPE)._neg_view(),                                   # negative bit
    lambda: torch.empty(Y_SHAPE, device="meta"),                                # no memory
], ids=["dtype", "strides", "shape", "channels_last", "negative bit", "meta"])
def test_any_difference_from_the_remembered_layout_reads_the_out_in_full(make):
    p = _remembered()
    out = make()
    if str(out.device) == "meta":
        p.device = 0  # a meta tensor reports -1 too: the remembered device of a real call is >= 0
        p._torch_out_layout = p._torch_out_layout[:3] + (0,)
    assert p._lean_torch_out(out) is None


def test_a_sparse_out_is_read_in_full_not_raised_on():
    p = _remembered()
    sparse = torch.zeros(Y_SHAPE).to_sparse()
    assert p._lean_torch_out(sparse) is None
