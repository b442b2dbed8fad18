"""pycudnn.torch's convolutions beside conv2d, without a GPU: the drop-in Conv1d, Conv3d and
ConvTranspose1d/2d/3d keep torch.nn's parameters and state_dict and compute with PyTorch on the
CPU; convert/revert swap every class both ways; conversion_report and convert's log say what
was converted and what was left to PyTorch, and why; the functionals' wiring (unit-height views,
the transposed convolution's roles, bias, output_padding, odd 'same', unbatched input, only the
gradients asked for, double backward) checked in float64 against torch.nn.functional with
pycudnn's launches replaced by PyTorch's own convolutions; bad arguments refused in each
function's own terms."""

from __future__ import annotations

import copy
import ctypes
import logging

import pytest

torch = pytest.importorskip("torch")

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import calls, functional, functional_nd  # noqa: E402

nn = torch.nn
F = torch.nn.functional
D = torch.float64


# ---- the drop-in modules ------------------------------------------------------------------------

MODULES = [
    (nn.Conv1d, pt.Conv1d, dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1,
                                dilation=2, groups=2), (2, 4, 17)),
    (nn.Conv1d, pt.Conv1d, dict(in_channels=4, out_channels=4, kernel_size=4, padding="same",
                                padding_mode="reflect"), (2, 4, 11)),
    (nn.Conv1d, pt.Conv1d, dict(in_channels=3, out_channels=2, kernel_size=3, padding=2,
                                padding_mode="circular", bias=False), (3, 9)),  # unbatched
    (nn.Conv3d, pt.Conv3d, dict(in_channels=4, out_channels=6, kernel_size=(3, 2, 3),
                                stride=(1, 2, 1), padding=(1, 0, 2), groups=2), (2, 4, 5, 6, 7)),
    (nn.Conv3d, pt.Conv3d, dict(in_channels=2, out_channels=3, kernel_size=(2, 3, 4),
                                padding="same", padding_mode="replicate"), (1, 2, 5, 5, 6)),
    (nn.ConvTranspose1d, pt.ConvTranspose1d, dict(in_channels=4, out_channels=6, kernel_size=3,
                                                  stride=2, padding=1, output_padding=1, groups=2,
                                                  dilation=2), (2, 4, 9)),
    (nn.ConvTranspose2d, pt.ConvTranspose2d, dict(in_channels=4, out_channels=2, kernel_size=(3, 2),
                                                  stride=(2, 3), padding=(1, 0),
                                                  output_padding=(1, 2)), (2, 4, 5, 6)),
    (nn.ConvTranspose3d, pt.ConvTranspose3d, dict(in_channels=2, out_channels=4, kernel_size=2,
                                                  stride=2, groups=2, bias=False), (2, 4, 3, 5)),
]


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
@pytest.mark.parametrize("theirs,ours,kwargs,shape", MODULES, ids=range(len(MODULES)))
def test_modules_are_drop_ins_that_compute_with_pytorch_on_the_cpu(theirs, ours, kwargs, shape):
    torch.manual_seed(0)
    ref = theirs(**kwargs)
    mine = ours(**kwargs)
    assert isinstance(mine, theirs) and type(mine).__name__ == theirs.__name__
    assert repr(mine) == repr(ref)
    assert [(n, p.shape) for n, p in mine.named_parameters()] == \
        [(n, p.shape) for n, p in ref.named_parameters()]
    mine.load_state_dict(ref.state_dict())
    back = theirs(**kwargs)
    back.load_state_dict(mine.state_dict())  # and back again
    assert list(back.state_dict()) == list(ref.state_dict())
    for a, b in zip(ref.state_dict().values(), back.state_dict().values()):
        assert torch.equal(a, b)
    x = torch.randn(shape)
    assert torch.equal(mine(x), ref(x))  # PyTorch's own computation, padding modes included


def test_transposed_modules_take_output_size_on_the_cpu():
    torch.manual_seed(1)
    ref = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1)
    mine = copy.deepcopy(ref)
    pt.convert(mine)
    x = torch.randn(1, 3, 5, 5)
    for size in ([10, 9], [1, 2, 10, 10]):
        assert torch.equal(mine(x, output_size=size), ref(x, output_size=size))
    with pytest.raises(ValueError, match="requested an output size of"):
        mine(x, output_size=[12, 12])


def test_transposed_modules_refuse_what_pytorch_refuses():
    with pytest.raises(ValueError, match='Only "zeros" padding mode is supported for ConvTranspose2d'):
        pt.ConvTranspose2d(3, 2, 3, padding_mode="reflect")


# ---- convert, revert, conversion_report ---------------------------------------------------------

class _Sub(nn.Conv3d):
    pass


def _every_kind():
    return nn.Sequential(nn.Conv1d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3), nn.Conv3d(3, 4, 1),
                         nn.ConvTranspose1d(4, 3, 2), nn.ConvTranspose2d(4, 3, 2, stride=2),
                         nn.ConvTranspose3d(4, 3, 1), _Sub(2, 2, 1), nn.LazyConv1d(4, 3),
                         nn.Sequential(nn.ConvTranspose2d(2, 2, 3, stride=1, dilation=2,
                                                          output_padding=1)))


def test_convert_and_revert_swap_every_class_in_place():
    torch.manual_seed(2)
    model = _every_kind()
    lazy = torch.nn.parameter.UninitializedParameter
    state = {k: v.clone() for k, v in model.state_dict().items() if not isinstance(v, lazy)}
    params = [id(p) for p in model.parameters()]
    x1, x2, x3 = torch.randn(2, 3, 8), torch.randn(2, 3, 6, 6), torch.randn(2, 3, 3, 4, 4)
    before = (model[0](x1), model[1](x2), model[2](x3))
    assert pt.convert(model) is model
    want = [pt.Conv1d, pt.Conv2d, pt.Conv3d, pt.ConvTranspose1d, pt.ConvTranspose2d,
            pt.ConvTranspose3d, _Sub, nn.LazyConv1d]
    assert [type(m) for m in list(model)[:8]] == want
    assert type(model[8][0]) is pt.ConvTranspose2d
    assert [id(p) for p in model.parameters()] == params  # the same objects, the same parameters
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    after = (model[0](x1), model[1](x2), model[2](x3))
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert pt.convert(model) is model and type(model[0]) is pt.Conv1d  # again: nothing changes
    assert pt.revert(model) is model
    assert [type(m) for m in list(model)[:8]] == [nn.Conv1d, nn.Conv2d, nn.Conv3d,
                                                  nn.ConvTranspose1d, nn.ConvTranspose2d,
                                                  nn.ConvTranspose3d, _Sub, nn.LazyConv1d]
    assert type(model[8][0]) is nn.ConvTranspose2d
    assert type(pt.convert(nn.ConvTranspose3d(1, 1, 1))) is pt.ConvTranspose3d  # the root itself


def test_a_converted_state_dict_loads_into_the_torch_model_and_back():
    torch.manual_seed(3)
    ref = _every_kind()[:6]
    ours = pt.convert(copy.deepcopy(ref))
    fresh = pt.convert(_every_kind()[:6])
    fresh.load_state_dict(ref.state_dict())
    plain = _every_kind()[:6]
    plain.load_state_dict(ours.state_dict())
    for a, b in zip(ref.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)
    assert list(fresh.state_dict()) == list(ref.state_dict())


def test_conversion_report_says_what_was_converted_and_what_was_left(caplog):
    model = _every_kind()
    model[5].weight.data = model[5].weight.data.to(torch.complex64)  # PyTorch's at call time
    rows = pt.conversion_report(model)
    assert all(not r["converted"] and r["reason"] for r in rows)
    assert rows[0]["reason"] == "not converted yet (call convert)"
    with caplog.at_level(logging.INFO, logger="pycudnn"):
        pt.convert(model)
    rows = {r["name"]: r for r in pt.conversion_report(model)}
    assert list(rows) == ["0", "1", "2", "3", "4", "5", "6", "7", "8.0"]
    assert [rows[n]["converted"] for n in rows] == [True] * 6 + [False, False, True]
    assert rows["6"]["reason"] == ("_Sub: a subclass of torch.nn.Conv3d (it may compute "
                                   "something else; convert takes the torch.nn classes "
                                   "themselves)")
    assert rows["7"]["reason"].startswith("LazyConv1d: a lazy module not initialized yet (run one "
                                          "forward pass")
    assert rows["8.0"]["note"] == ("output_padding=(1, 1) at least the stride (1, 1) (cuDNN has "
                                   "no such output size)")
    assert rows["5"]["note"].startswith("weight of dtype torch.complex64")
    assert rows["0"]["note"] == rows["0"]["reason"] == ""
    assert rows["3"]["type"] == "pycudnn.torch.modules.ConvTranspose1d"
    line = [r.getMessage() for r in caplog.records if "pycudnn.torch.convert" in r.getMessage()]
    assert len(line) == 1
    assert line[0].startswith(
        "pycudnn.torch.convert: 7 of 9 convolution modules run in pycudnn (1 Conv1d, 1 Conv2d, "
        "1 Conv3d, 1 ConvTranspose1d, 2 ConvTranspose2d, 1 ConvTranspose3d); 1 left to PyTorch: "
        "_Sub: a subclass of torch.nn.Conv3d")
    assert "; 1 left to PyTorch: LazyConv1d: a lazy module not initialized yet" in line[0]
    assert "; 1 converted but run in PyTorch: output_padding=(1, 1) at least the stride" in line[0]
    assert line[0].endswith("; per call, input off CUDA or of a dtype other than float32, "
                            "float16, bfloat16 and float64 runs PyTorch's convolution")


def test_a_lazy_module_converts_once_initialized():
    model = nn.Sequential(nn.LazyConv2d(4, 3))
    model(torch.randn(1, 3, 6, 6))  # the first forward makes it a torch.nn.Conv2d
    pt.convert(model)
    assert type(model[0]) is pt.Conv2d


def test_fx_traces_converted_modules_as_leaves():
    model = pt.convert(nn.Sequential(nn.Conv1d(2, 2, 1), nn.ConvTranspose2d(2, 2, 1)))
    fused = pt.fuse_for_inference(nn.Sequential(nn.Conv2d(2, 2, 1), nn.ReLU(), model).eval())
    assert any(isinstance(m, pt.ConvTranspose2d) for m in fused.modules())


# ---- the functionals' wiring, with PyTorch's convolutions in place of pycudnn's launches ----------

_TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_INPUT_GRAD = {1: torch.nn.grad.conv1d_input, 2: torch.nn.grad.conv2d_input,
               3: torch.nn.grad.conv3d_input}
_WEIGHT_GRAD = {1: torch.nn.grad.conv1d_weight, 2: torch.nn.grad.conv2d_weight,
                3: torch.nn.grad.conv3d_weight}


@pytest.fixture
def any_device(monkeypatch):
    """calls' checks with the device check lifted (and the rank check worded here): they pass
    CPU tensors on to what follows them."""
    real = calls.check_tensor

    def on_any_device(fn, name, t, dims=None):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            if dims is not None and t.dim() not in dims:
                raise calls.ConvolutionValueError(f"{fn}: rank {t.dim()} {name}")
            return
        real(fn, name, t, dims)

    monkeypatch.setattr(calls, "check_tensor", on_any_device)
    calls.clear_cache()
    yield
    calls.clear_cache()


@pytest.fixture
def launches(monkeypatch, any_device):
    """calls' forward, backward data and backward filter computed by PyTorch on the CPU, with
    every call counted."""
    counts = {"forward": 0, "data": 0, "filter": 0}

    def forward(op, x, w, b, z, alpha, geom):
        assert op == "conv" and z is None
        counts["forward"] += 1
        return _TORCH_CONV[len(geom[0])](x, w, b, *geom), x, w, torch.contiguous_format, None

    def data(gy, w, x, fmt, geom):
        counts["data"] += 1
        st, pad, dil, g = geom
        return _INPUT_GRAD[len(st)](tuple(x.shape), w, gy, st, pad, dil, g), False

    def filt(x, gy, w, fmt, geom):
        counts["filter"] += 1
        st, pad, dil, g = geom
        return _WEIGHT_GRAD[len(st)](x, tuple(w.shape), gy, st, pad, dil, g), False

    def both(gy, x, w, fmt, geom, need_x, need_w):  # calls.run_backward's contract
        gx = data(gy, w, x, fmt, geom)[0] if need_x else None
        gw = filt(x, gy, w, fmt, geom)[0] if need_w else None
        return gx, gw, False

    monkeypatch.setattr(functional, "run_forward", forward)
    monkeypatch.setattr(functional, "run_backward", both)
    monkeypatch.setattr(functional_nd, "run_forward", forward)
    monkeypatch.setattr(functional_nd, "run_backward_data", data)
    monkeypatch.setattr(functional_nd, "run_backward_filter", filt)
    return counts


CASES = [
    ("conv1d", pt.conv1d, F.conv1d, (2, 4, 11), (6, 2, 3), dict(stride=2, padding=1, dilation=2,
                                                                   groups=2)),
    ("conv1d same odd", pt.conv1d, F.conv1d, (2, 3, 9), (4, 3, 4), dict(padding="same",
                                                                          dilation=1)),
    ("conv1d unbatched", pt.conv1d, F.conv1d, (3, 9), (4, 3, 3), dict(padding="valid")),
    ("conv3d", pt.conv3d, F.conv3d, (2, 4, 5, 6, 7), (6, 2, 3, 2, 3),
     dict(stride=(1, 2, 1), padding=(1, 0, 2), dilation=(2, 1, 1), groups=2)),
    ("conv3d same odd", pt.conv3d, F.conv3d, (1, 2, 5, 6, 5), (3, 2, 2, 3, 4),
     dict(padding="same", dilation=(1, 2, 1))),
    ("conv3d unbatched", pt.conv3d, F.conv3d, (2, 4, 4, 4), (3, 2, 3, 3, 3), dict(padding=1)),
    ("conv_transpose1d", pt.conv_transpose1d, F.conv_transpose1d, (2, 4, 7), (4, 3, 3),
     dict(stride=3, padding=1, output_padding=2, groups=2, dilation=2)),
    ("conv_transpose1d unbatched", pt.conv_transpose1d, F.conv_transpose1d, (4, 7), (4, 3, 2),
     dict(stride=2)),
    ("conv_transpose2d", pt.conv_transpose2d, F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 3, 2),
     dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2, dilation=(1, 2))),
    ("conv_transpose2d unbatched", pt.conv_transpose2d, F.conv_transpose2d, (4, 3, 3), (4, 2, 2, 2),
     dict()),
    ("conv_transpose3d", pt.conv_transpose3d, F.conv_transpose3d, (2, 2, 3, 4, 3), (2, 2, 2, 3, 2),
     dict(stride=2, padding=(0, 1, 0), output_padding=(1, 0, 1), groups=2)),
    ("conv_transpose (output_padding past the stride)", pt.conv_transpose2d, F.conv_transpose2d,
     (1, 2, 5, 5), (2, 3, 3, 3), dict(stride=1, dilation=2, output_padding=1)),
]


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
@pytest.mark.parametrize("name,ours,theirs,x_shape,w_shape,kwargs", CASES,
                         ids=[c[0] for c in CASES])
def test_functionals_compute_what_torch_nn_functional_computes(launches, name, ours, theirs,
                                                               x_shape, w_shape, kwargs):
    torch.manual_seed(4)
    transposed = "transpose" in name
    k = w_shape[1] * kwargs.get("groups", 1) if transposed else w_shape[0]
    x = torch.randn(x_shape, dtype=D, requires_grad=True)
    w = torch.randn(w_shape, dtype=D, requires_grad=True)
    b = torch.randn(k, dtype=D, requires_grad=True)
    y = ours(x, w, b, **kwargs)
    ref = theirs(x, w, b, **kwargs)
    assert y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(ref)
    got = torch.autograd.grad(y, (x, w, b), gy)
    want = torch.autograd.grad(ref, (x, w, b), gy)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the no-grad path
        torch.testing.assert_close(ours(x, w, b, **kwargs), ref, rtol=1e-12, atol=1e-12)
    if "past the stride" in name:  # PyTorch's own transposed convolution ran it
        assert launches == {"forward": 0, "data": 0, "filter": 0}
    elif transposed:  # forward: backward data; grads: a forward and a backward filter
        assert launches == {"forward": 1, "data": 2, "filter": 1}
    else:
        assert launches == {"forward": 2, "data": 1, "filter": 1}


@pytest.mark.parametrize("fn,theirs,x_shape,w_shape,kwargs", [
    (pt.conv1d, F.conv1d, (2, 4, 9), (4, 2, 3), dict(groups=2, padding=1)),
    (pt.conv3d, F.conv3d, (1, 2, 4, 4, 4), (3, 2, 3, 3, 3), dict(padding=1)),
    (pt.conv_transpose1d, F.conv_transpose1d, (2, 4, 5), (4, 2, 3), dict(stride=2, output_padding=1)),
    (pt.conv_transpose2d, F.conv_transpose2d, (2, 4, 5, 4), (4, 2, 3, 3), dict(stride=2, groups=2)),
    (pt.conv_transpose3d, F.conv_transpose3d, (1, 2, 3, 3, 3), (2, 3, 2, 2, 2), dict(stride=2)),
], ids=["conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"])
def test_only_the_gradients_asked_for_and_double_backward(launches, fn, theirs, x_shape, w_shape,
                                                          kwargs):
    torch.manual_seed(5)
    x = torch.randn(x_shape, dtype=D, requires_grad=True)
    w = torch.randn(w_shape, dtype=D)
    y = fn(x, w, None, **kwargs)
    before = dict(launches)
    y.backward(torch.ones_like(y))
    assert w.grad is None
    done = {k: launches[k] - before[k] for k in launches}
    assert done["filter"] == 0 and done["forward"] + done["data"] == 1  # the input's gradient only
    torch.testing.assert_close(x.grad, torch.autograd.grad(theirs(x, w, None, **kwargs).sum(), x)[0])

    # a gradient penalty: the backward recorded (create_graph) and differentiated again
    w.requires_grad_(True)

    def penalty(conv):
        out = conv(x, w, None, **kwargs)
        (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), (x, w))

    for g, r in zip(penalty(fn), penalty(theirs)):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


# torch's own forward-AD decompositions call torch.jit.script when a process first makes a dual
# tensor; the test itself uses no TorchScript
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_forward_ad_and_torch_func_run_pytorchs_convolution():
    # no launch replaced: these calls must never reach pycudnn (the CPU tensors would be refused)
    import torch.autograd.forward_ad as fwad

    x, w, t = torch.randn(1, 2, 5, 5, dtype=D), torch.randn(2, 3, 3, 3, dtype=D), torch.randn(1, 2, 5, 5, dtype=D)
    with fwad.dual_level():
        y = pt.conv_transpose2d(fwad.make_dual(x, t), w, stride=2)
        tangent = fwad.unpack_dual(y).tangent
    torch.testing.assert_close(tangent, F.conv_transpose2d(t, w, stride=2))
    w3, x3 = torch.randn(3, 2, 1, 3, 3, dtype=D), x.unsqueeze(2)
    g = torch.func.grad(lambda v: pt.conv3d(v, w3).sum())(x3)
    torch.testing.assert_close(g, torch.func.grad(lambda v: F.conv3d(v, w3).sum())(x3))


# torch.jit.trace is deprecated, but programs still trace models: pycudnn must hand a traced call
# to PyTorch's convolution, or the traced graph would lack it (torch.export has its own tests)
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_jit_trace_records_pytorchs_convolution():
    x, w = torch.randn(1, 2, 5, dtype=D), torch.randn(3, 2, 3, dtype=D)
    traced = torch.jit.trace(lambda a: pt.conv1d(a, w), (x,), check_trace=False)
    assert "aten::_convolution" in str(traced.graph) or "aten::conv1d" in str(traced.graph)
    x2 = torch.randn(1, 2, 5, dtype=D)
    torch.testing.assert_close(traced(x2), F.conv1d(x2, w))


# ---- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn,x_shape,w_shape", [
    (pt.conv1d, (1, 2, 5), (3, 2, 3)), (pt.conv3d, (1, 2, 5, 5, 5), (3, 2, 3, 3, 3)),
    (pt.conv_transpose1d, (1, 2, 5), (2, 3, 3)), (pt.conv_transpose2d, (1, 2, 5, 5), (2, 3, 3, 3)),
    (pt.conv_transpose3d, (1, 2, 5, 5, 5), (2, 3, 3, 3, 3)),
], ids=lambda v: getattr(v, "__name__", None))
def test_cpu_tensors_are_refused_in_each_functions_terms(fn, x_shape, w_shape):
    name = fn.__name__
    with pytest.raises(TypeError, match=rf"^{name}: expected input on a CUDA device, but got "
                                        r"input on cpu"):
        fn(torch.randn(x_shape), torch.randn(w_shape))
    with pytest.raises(RuntimeError, match=rf"^{name}: expected input to be a torch.Tensor, got list"):
        fn([1.0], torch.randn(w_shape))


@pytest.mark.parametrize("fn,kwargs,error,message", [
    (pt.conv1d, dict(stride=(1, 2)), ValueError, r"a list of 1 values to match the convolution "
                                                 r"dimensions, but got stride=\[1, 2\]"),
    (pt.conv3d, dict(padding=(1, 1)), ValueError, r"a list of 3 values .* padding=\[1, 1\]"),
    (pt.conv3d, dict(stride=1.5), TypeError, r"conv3d: expected stride to be an int or a tuple of 3 "
                                             r"ints, got float 1.5"),
    (pt.conv1d, dict(padding="same", stride=2), ValueError, "padding='same' is not supported for "
                                                            "strided convolutions"),
    (pt.conv_transpose2d, dict(padding="same"), TypeError, r"conv_transpose2d: expected padding to "
                                                          r"be an int or a tuple of 2 ints, got str"),
    (pt.conv_transpose3d, dict(output_padding=-1), ValueError, r"negative output_padding is not "
                                                               r"supported, but got "
                                                               r"output_padding=\[-1, -1, -1\]"),
    (pt.conv_transpose1d, dict(dilation=0), ValueError, r"dilation should be greater than zero"),
    (pt.conv_transpose2d, dict(groups=0), ValueError, "non-positive groups is not supported"),
])
def test_bad_geometry_is_refused_like_pytorch(fn, kwargs, error, message):
    nd = {"conv1d": 1, "conv_transpose1d": 1, "conv_transpose2d": 2}.get(fn.__name__, 3)
    x, w = torch.randn((1, 2) + (5,) * nd), torch.randn((2, 2) + (3,) * nd)
    with pytest.raises(error, match=message):
        fn(x, w, **kwargs)
    theirs = getattr(F, fn.__name__)
    with pytest.raises((RuntimeError, ValueError, TypeError)):  # PyTorch refuses them too
        theirs(x, w, **kwargs)


@pytest.mark.parametrize("call,message", [
    (lambda: pt.conv1d(torch.randn(1, 5, 8), torch.randn(4, 3, 3)),
     r"^conv1d: given groups=1, weight of size \[4, 3, 3\], expected input\[1, 5, 8\] to have 3 "
     r"channels, but got 5 channels instead"),
    (lambda: pt.conv3d(torch.randn(1, 5, 4, 4, 4), torch.randn(4, 3, 3, 3, 3)),
     r"^conv3d: given groups=1, weight of size \[4, 3, 3, 3, 3\], expected input\[1, 5, 4, 4, 4\]"),
    (lambda: pt.conv3d(torch.randn(1, 3, 2, 4, 4), torch.randn(4, 3, 3, 3, 3)),
     r"^conv3d: calculated padded input size per channel: \(2 x 4 x 4\). Kernel size: \(3 x 3 x 3\)"),
    (lambda: pt.conv_transpose2d(torch.randn(1, 5, 8, 8), torch.randn(4, 3, 3, 3)),
     r"^conv_transpose2d: given transposed=1, weight of size \[4, 3, 3, 3\], expected input\[1, 5, "
     r"8, 8\] to have 4 channels, but got 5 channels instead"),
    (lambda: pt.conv_transpose1d(torch.randn(1, 5, 8), torch.randn(4, 3, 3)),
     r"^conv_transpose1d: given transposed=1, weight of size \[4, 3, 3\], expected input\[1, 5, 8\]"),
    (lambda: pt.conv_transpose2d(torch.randn(1, 4, 8, 8), torch.randn(4, 3, 3, 3), stride=2,
                                 output_padding=2),
     r"^conv_transpose2d: output padding must be smaller than either stride or dilation, but got "
     r"output_padding=\[2, 2\], stride=\[2, 2\], dilation=\[1, 1\]"),
    (lambda: pt.conv_transpose3d(torch.randn(1, 4, 2, 2, 2), torch.randn(4, 3, 3, 3, 3), groups=3),
     r"^conv_transpose3d: given groups=3, expected weight to be divisible by 3 at dimension 0"),
    (lambda: pt.conv_transpose2d(torch.randn(1, 4, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)),
     r"^conv_transpose2d: given transposed=1, weight of size \[4, 3, 3, 3\], expected bias to be "
     r"1-dimensional with 3 elements, but got bias of size \[4\] instead"),
    (lambda: pt.conv_transpose2d(torch.randn(1, 4, 1, 1), torch.randn(4, 3, 3, 3), padding=3),
     r"^conv_transpose2d: given input size per channel: \(1 x 1\). Calculated output size per "
     r"channel: \(-3 x -3\). Output size is too small"),
    (lambda: pt.conv1d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3)), r"^conv1d: rank 4 input"),
    (lambda: pt.conv_transpose1d(torch.randn(1, 4, 8), torch.randn(4, 3)),
     r"^conv_transpose1d: rank 2 weight"),
])
def test_bad_shapes_are_refused_in_each_functions_terms(any_device, call, message):
    """The shape checks (the device check lifted by the fixture, which words the rank check
    itself; the GPU tests see PyTorch's rank wording), which come before anything is launched:
    1-D calls that ran as 2-D ones are refused with their own shapes."""
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert isinstance(info.value, RuntimeError)


# ---- the remembered launches on 5-D and transposed signatures, simulated on the CPU -------------

def _tensor_at(ptr, shape, strides, dtype):
    """A CPU tensor over the memory at ``ptr`` (what a launch is given: pointers alone)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    buf = (ctypes.c_char * (span * itemsize)).from_address(ptr)
    return torch.frombuffer(buf, dtype=dtype).as_strided(shape, strides)


class _Prepared:
    def __init__(self, launcher):
        self.launcher = launcher


@pytest.fixture
def simulated(monkeypatch, any_device):
    """calls' public-function steps computed by PyTorch on the CPU: each prepares a launcher
    that finds its tensors from the pointers it is given (the shapes and strides the signature
    fixed), as the prepared convolution does. ``ran`` lists what ran: "public ..." for a first
    call, "launch ..." for a remembered one."""
    ran = []

    def layout(*tensors):
        return [(tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors]

    def forward_public(op, x, w, b, z, alpha, geom, y, fkey, want_prepared=False):
        assert op == "conv" and z is None
        conv = _TORCH_CONV[len(geom[0])]
        y.copy_(conv(x, w, b, *geom))
        ran.append("public forward")
        if not want_prepared:
            return y
        lay = layout(x, w, y) + (layout(b) if b is not None else [])

        def launch(handle, ptrs, stream):
            t = [_tensor_at(p, *lt) for p, lt in zip(ptrs, lay)]
            t[2].copy_(conv(t[0], t[1], t[3] if len(t) > 3 else None, *geom))
            ran.append("launch forward")
        return _Prepared(launch)

    def backward_public(direction, a, b, out, geom, fkey, want_prepared=False):
        nd = len(geom[0])
        st, pad, dil, g = geom

        def compute(a_, b_, out_):
            if direction == "data":  # a, b = gy, w; forward roles (x, w, y) = (out, b, a)
                out_.copy_(_INPUT_GRAD[nd](tuple(out_.shape), b_, a_, st, pad, dil, g))
            else:  # a, b = x, gy; forward roles (x, w, y) = (a, out, b)
                out_.copy_(_WEIGHT_GRAD[nd](a_, tuple(out_.shape), b_, st, pad, dil, g))

        compute(a, b, out)
        ran.append(f"public {direction}")
        if not want_prepared:
            return out
        if direction == "data":
            lay = layout(out, b, a)

            def launch(handle, ptrs, stream):
                dx, w, gy = (_tensor_at(p, *lt) for p, lt in zip(ptrs, lay))
                compute(gy, w, dx)
                ran.append("launch data")
        else:
            lay = layout(a, out, b)

            def launch(handle, ptrs, stream):
                x, dw, gy = (_tensor_at(p, *lt) for p, lt in zip(ptrs, lay))
                compute(x, gy, dw)
                ran.append("launch filter")
        return _Prepared(launch)

    monkeypatch.setattr(calls, "forward_public", forward_public)
    monkeypatch.setattr(calls, "backward_public", backward_public)
    monkeypatch.setattr(calls, "caller_stream", lambda device: 0)
    monkeypatch.setattr(calls, "get_handle", lambda device, stream: 0)
    return ran


@pytest.mark.parametrize("fn,theirs,x_shape,w_shape,kwargs,fmt", [
    (pt.conv3d, F.conv3d, (2, 4, 5, 6, 5), (6, 2, 3, 2, 3), dict(stride=(1, 2, 1), padding=1,
                                                                dilation=(2, 1, 1), groups=2),
     torch.contiguous_format),
    (pt.conv3d, F.conv3d, (2, 4, 5, 6, 5), (6, 4, 3, 3, 3), dict(padding="same"),
     torch.channels_last_3d),
    (pt.conv_transpose2d, F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 3, 2),
     dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2, dilation=(1, 2)),
     torch.contiguous_format),
    (pt.conv_transpose2d, F.conv_transpose2d, (2, 4, 5, 6), (4, 6, 3, 3), dict(stride=2, padding=1),
     torch.channels_last),
    (pt.conv_transpose3d, F.conv_transpose3d, (2, 2, 3, 4, 3), (2, 2, 2, 3, 2),
     dict(stride=2, padding=(0, 1, 0), output_padding=(1, 0, 1)), torch.contiguous_format),
    (pt.conv1d, F.conv1d, (2, 4, 11), (6, 2, 3), dict(stride=2, padding=1, groups=2),
     torch.contiguous_format),
    (pt.conv_transpose1d, F.conv_transpose1d, (2, 4, 7), (4, 3, 3), dict(stride=3, output_padding=2),
     torch.contiguous_format),
], ids=["conv3d", "conv3d-channels_last_3d-same", "conv_transpose2d",
        "conv_transpose2d-channels_last", "conv_transpose3d", "conv1d", "conv_transpose1d"])
def test_remembered_launches_replay_every_rank_and_the_transposed_roles(
        simulated, fn, theirs, x_shape, w_shape, kwargs, fmt):
    torch.manual_seed(6)
    transposed = "transpose" in fn.__name__
    k = w_shape[1] * kwargs.get("groups", 1) if transposed else w_shape[0]
    # float64 always computes contiguous (PyTorch's rule): channels_last cases in float32
    dtype, tol = (D, 1e-12) if fmt is torch.contiguous_format else (torch.float32, 1e-5)
    x = torch.randn(x_shape, dtype=dtype).to(memory_format=fmt).requires_grad_(True)
    w = torch.randn(w_shape, dtype=dtype).to(memory_format=fmt).requires_grad_(True)
    b = torch.randn(k, dtype=dtype, requires_grad=True)
    ref = theirs(x, w, b, **kwargs)
    gy = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (x, w, b), gy)
    for attempt in ("first call", "remembered"):
        simulated.clear()
        y = fn(x, w, b, **kwargs)
        got = torch.autograd.grad(y, (x, w, b), gy)
        torch.testing.assert_close(y, ref, rtol=tol, atol=tol)
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, rtol=tol, atol=tol)
        if fmt is not torch.contiguous_format:  # PyTorch's memory format rule, gradients too
            assert y.is_contiguous(memory_format=fmt) and got[0].is_contiguous(memory_format=fmt)
        kind = "public" if attempt == "first call" else "launch"
        if transposed:
            assert simulated == [f"{kind} data", f"{kind} forward", f"{kind} filter"], attempt
        else:
            assert simulated == [f"{kind} forward", f"{kind} data", f"{kind} filter"], attempt
    calls.clear_cache()
    remembered = calls.remembered_signatures()
    assert not remembered["transposed"] and not remembered["forward"]


@pytest.mark.parametrize("fn,theirs,x_shape,w_shape,kwargs", [
    (pt.conv3d, F.conv3d, (2, 4, 5, 6, 5), (6, 2, 3, 2, 3), dict(padding=1, groups=2)),
    (pt.conv_transpose2d, F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 3, 2),
     dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2, dilation=(1, 2))),
    (pt.conv_transpose3d, F.conv_transpose3d, (2, 2, 3, 4, 3), (2, 2, 2, 3, 2),
     dict(stride=2, output_padding=(1, 0, 1))),
], ids=["conv3d", "conv_transpose2d", "conv_transpose3d"])
def test_signatures_routed_to_pytorch_compute_the_same(simulated, monkeypatch, fn, theirs,
                                                       x_shape, w_shape, kwargs):
    """Routing's decision forced to PyTorch for every signature: the routed calls run
    PyTorch's own convolutions (F.conv3d, and convolution_backward given the transposed
    forward's stand-in for the input, which has the output's shape and one element)."""
    monkeypatch.setattr(calls.routing, "should_measure", lambda *flags: True)
    monkeypatch.setattr(calls.routing, "pycudnn_wins", lambda *args: False)
    torch.manual_seed(7)
    transposed = "transpose" in fn.__name__
    k = w_shape[1] * kwargs.get("groups", 1) if transposed else w_shape[0]
    x = torch.randn(x_shape, dtype=D, requires_grad=True)
    w = torch.randn(w_shape, dtype=D, requires_grad=True)
    b = torch.randn(k, dtype=D, requires_grad=True)
    ref = theirs(x, w, b, **kwargs)
    gy = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (x, w, b), gy)
    for step in range(3):  # the first call decides, the next ones run on PyTorch's side
        simulated.clear()
        y = fn(x, w, b, **kwargs)
        got = torch.autograd.grad(y, (x, w, b), gy)
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
        if step:
            assert simulated == []  # nothing of pycudnn's ran
    if not transposed:  # forward and both backward directions on PyTorch's: the whole layer
        assert len(calls.torch_layers) == 1
