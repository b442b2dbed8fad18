"""pycudnn.torch without a GPU: it stays optional (``import pycudnn`` never imports torch, a
clear ImportError without it), its modules keep ``torch.nn.Conv2d``'s parameters and state_dict,
``convert`` swaps classes in place, ``fuse_for_inference`` folds BatchNorm and fuses the
patterns it documents (checked against the unfused model, computed by PyTorch on the CPU), and
bad arguments get PyTorch-style errors before anything runs."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def test_import_pycudnn_does_not_import_torch():
    proc = _python("import sys, pycudnn, pycudnn.api.conv, pycudnn.api.prepared; pycudnn.convolution; "
                   "pycudnn.current_stream; print('torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_import_without_torch_says_what_is_missing():
    # sys.modules["torch"] = None makes "import torch" raise ImportError, as when it is missing
    proc = _python("import sys; sys.modules['torch'] = None\n"
                   "import pycudnn\n"
                   "try:\n    import pycudnn.torch\n"
                   "except ImportError as e:\n    print('ImportError:', e)\n")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("ImportError: pycudnn.torch needs PyTorch, which is not installed"), out
    assert "The rest of pycudnn works without it" in out


try:
    import torch
except ImportError:  # the tests below need it; the two above run without it
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="could not import 'torch' (not installed)")
if torch is not None:
    import pycudnn.torch as pt
    from pycudnn.torch import calls
    from torch_models import SmallResNet, randomize_batchnorm

    nn = torch.nn
    F = torch.nn.functional


# ---- Conv2d and convert -----------------------------------------------------------------------------

CONV_ARGS = [
    dict(in_channels=4, out_channels=6, kernel_size=3),
    dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0),
         dilation=(1, 2), groups=2, bias=False),
    dict(in_channels=4, out_channels=8, kernel_size=3, padding="same", padding_mode="reflect"),
    dict(in_channels=4, out_channels=4, kernel_size=4, padding="same", dilation=1),
    dict(in_channels=4, out_channels=4, kernel_size=3, padding="valid", padding_mode="circular"),
]


@needs_torch
@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
@pytest.mark.parametrize("kwargs", CONV_ARGS, ids=range(len(CONV_ARGS)))
def test_conv2d_module_is_a_drop_in(kwargs):
    torch.manual_seed(0)
    ref = nn.Conv2d(**kwargs)
    ours = pt.Conv2d(**kwargs)
    assert isinstance(ours, nn.Conv2d)
    assert repr(ours).split("(", 1)[1] == repr(ref).split("(", 1)[1]
    assert [(n, p.shape) for n, p in ours.named_parameters()] == \
        [(n, p.shape) for n, p in ref.named_parameters()]
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())  # and back again
    back = nn.Conv2d(**kwargs)
    back.load_state_dict(ours.state_dict())
    for a, b in zip(ref.state_dict().values(), back.state_dict().values()):
        assert torch.equal(a, b)
    # on the CPU the module computes with PyTorch: equal to the reference, padding modes included
    x = torch.randn(2, 4, 9, 8)
    assert torch.equal(ours(x), ref(x))


@needs_torch
def test_convert_swaps_classes_in_place_and_keeps_parameters():
    class Custom(nn.Conv2d):
        pass

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(),
                          nn.Sequential(nn.Conv2d(4, 4, 1), Custom(4, 4, 1)),
                          nn.ConvTranspose2d(4, 2, 2))
    params = [id(p) for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    model[0].register_forward_hook(lambda *a: calls.append(1))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert pt.convert(model) is model
    assert type(model[0]) is pt.Conv2d and type(model[2][0]) is pt.Conv2d
    assert type(model[2][1]) is Custom  # subclasses may compute something else: untouched
    assert type(model[3]) is pt.ConvTranspose2d
    assert [id(p) for p in model.parameters()] == params
    assert [id(p) for p in opt.param_groups[0]["params"]] == params
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    model(torch.randn(1, 3, 8, 8))
    assert calls == [1]  # hooks stay
    root = nn.Conv2d(1, 1, 1)
    assert type(pt.convert(root)) is pt.Conv2d
    with pytest.raises(TypeError, match="convert: expected a torch.nn.Module, got int"):
        pt.convert(3)


# ---- BatchNorm folding and inference fusion ---------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("bias,affine", [(False, True), (True, True), (True, False)])
def test_fold_batchnorm_equals_conv_then_bn(bias, affine):
    torch.manual_seed(1)
    conv = nn.Conv2d(4, 6, 3, padding=1, bias=bias).double()
    bn = randomize_batchnorm(nn.BatchNorm2d(6, affine=affine).double()) if affine else \
        nn.BatchNorm2d(6, affine=False).double()
    if not affine:
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    bn.eval()
    w, b = pt.fold_batchnorm(conv, bn)
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    torch.testing.assert_close(F.conv2d(x, w, b, padding=1), bn(conv(x)), rtol=1e-12, atol=1e-12)


@needs_torch
def test_fold_batchnorm_keeps_dtype_and_memory_format():
    conv = nn.Conv2d(4, 6, 3).to(memory_format=torch.channels_last)
    w, b = pt.fold_batchnorm(conv, randomize_batchnorm(nn.BatchNorm2d(6)).eval())
    assert w.dtype == torch.float32 and b.dtype == torch.float32
    assert w.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="track_running_stats=False"):
        pt.fold_batchnorm(conv, nn.BatchNorm2d(6, track_running_stats=False))


def _fused_modules(model):
    return [m for m in model.modules() if isinstance(m, pt.FusedConv2d)]


@needs_torch
def test_fuse_for_inference_matches_the_model_and_fuses_what_it_documents():
    torch.manual_seed(0)
    model = randomize_batchnorm(SmallResNet()).double().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = model(x)
        fused = pt.fuse_for_inference(model)
        got = fused(x)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    # the original model is untouched
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 13
    # every BatchNorm folded; 3 blocks end in conv + add + relu; each bottleneck's first two
    # convolutions, the stem and the functional block's first conv are conv + bias + relu;
    # the two shortcut convolutions are conv + bias
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.Conv2d)) for m in fused.modules())
    kinds = sorted((m.relu, m.residual) for m in _fused_modules(fused))
    assert kinds == sorted([(True, True)] * 4 + [(True, False)] * 8 + [(False, False)] * 2)
    assert all(m.bias is not None for m in _fused_modules(fused))


@needs_torch
def test_fuse_leaves_what_it_cannot_prove():
    class Shared(nn.Module):  # the conv's output is used twice: its ReLU cannot be fused
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.pad = nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect")

        def forward(self, x):
            y = self.conv(x)
            return torch.relu(y) + y + torch.relu(self.pad(x))

    model = Shared().double().eval()
    fused = pt.fuse_for_inference(model)
    assert fused is model  # nothing matched: the model itself
    x = torch.randn(1, 3, 6, 6, dtype=torch.float64)
    torch.testing.assert_close(fused(x), model(x))


@needs_torch
def test_fuse_searches_inside_what_fx_cannot_trace():
    class Dynamic(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
            self.other = nn.Conv2d(4, 4, 1)

        def forward(self, x):
            y = self.block(x)
            if float(y.detach().sum()) > 0:  # data-dependent control flow: fx cannot trace it
                y = y * 2
            return self.other(y)

    torch.manual_seed(0)
    model = randomize_batchnorm(Dynamic()).double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    expected = model(x)
    fused = pt.fuse_for_inference(model)
    assert type(fused) is Dynamic and isinstance(fused.block, torch.fx.GraphModule)
    assert [m.relu for m in _fused_modules(fused.block)] == [True]
    torch.testing.assert_close(fused(x), expected, rtol=1e-10, atol=1e-10)
    # the original is untouched and shares no parameter with the copy (it may go on training)
    assert type(model.block) is nn.Sequential and len(model.block) == 3
    assert not {p.data_ptr() for p in model.parameters()} & {
        p.data_ptr() for p in fused.parameters()}


@needs_torch
def test_fuse_fuses_each_call_of_a_shared_convolution_separately():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn1, self.bn2 = nn.BatchNorm2d(4), nn.BatchNorm2d(4)

        def forward(self, x):
            return F.relu(self.bn1(self.conv(x))), self.bn2(self.conv(x))

    torch.manual_seed(1)
    model = randomize_batchnorm(Shared()).double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    expected = model(x)
    fused = pt.fuse_for_inference(model)
    assert sorted(m.relu for m in _fused_modules(fused)) == [False, True]
    for got, want in zip(fused(x), expected):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@needs_torch
def test_fuse_takes_a_converted_model():
    torch.manual_seed(2)
    model = pt.convert(randomize_batchnorm(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())).double().eval())
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    fused = pt.fuse_for_inference(model)
    assert [m.relu for m in _fused_modules(fused)] == [True]
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
    torch.testing.assert_close(fused(x), model(x), rtol=1e-10, atol=1e-10)


@needs_torch
def test_revert_undoes_convert():
    model = pt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()))
    assert type(model[0]) is pt.Conv2d
    assert pt.revert(model) is model and type(model[0]) is nn.Conv2d
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        pt.revert(3)


@needs_torch
def test_fuse_for_inference_refuses_training_mode():
    with pytest.raises(ValueError, match=r"training mode; call model.eval\(\) first"):
        pt.fuse_for_inference(SmallResNet())
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        pt.fuse_for_inference(lambda x: x)


@needs_torch
def test_fused_module_refuses_residual_without_relu():
    with pytest.raises(ValueError, match="residual=True needs relu=True"):
        pt.FusedConv2d(torch.zeros(2, 2, 1, 1), None, residual=True)


# ---- errors before anything runs --------------------------------------------------------------------

@needs_torch
def test_cpu_tensors_are_refused_with_a_clear_message():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with pytest.raises(TypeError, match=r"conv2d: expected input on a CUDA device, but got input "
                                        r"on cpu \(pycudnn runs on NVIDIA GPUs; move it with "
                                        r"\.cuda\(\)\)"):
        pt.conv2d(x, w)
    with pytest.raises(TypeError, match="conv2d_bias_relu: expected input on a CUDA device"):
        pt.conv2d_bias_relu(x, w, torch.zeros(3))
    with pytest.raises(TypeError, match="conv2d_add_relu: expected input on a CUDA device"):
        pt.conv2d_add_relu(x, w, torch.zeros(1, 3, 3, 3))
    with pytest.raises(TypeError, match="conv2d: expected input to be a torch.Tensor, got list"):
        pt.conv2d([1.0], w)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(stride=0), ValueError, r"non-positive stride is not supported, but got stride=\[0, 0\]"),
    (dict(stride=(1, 1, 1)), ValueError, r"expected stride to be a single integer value or a list "
                                         r"of 2 values to match the convolution dimensions, but "
                                         r"got stride=\[1, 1, 1\]"),
    (dict(padding=-1), ValueError, r"negative padding is not supported, but got padding=\[-1, -1\]"),
    (dict(dilation=(1, 0)), ValueError, r"dilation should be greater than zero, but got "
                                        r"dilation=\[1, 0\]"),
    (dict(groups=0), ValueError, "non-positive groups is not supported, but got groups=0"),
    (dict(groups=1.5), TypeError, "expected groups to be an int, got 1.5"),
    (dict(padding="full"), ValueError, r"Invalid padding string 'full', should be one of "
                                       r"\['valid', 'same'\]"),
    (dict(padding="same", stride=2), ValueError, "padding='same' is not supported for strided "
                                                 "convolutions"),
    (dict(stride=1.0), TypeError, "expected stride to be an int or a tuple of 2 ints, got float"),
])
@needs_torch
def test_bad_geometry_is_refused_like_pytorch(kwargs, error, message):
    with pytest.raises(error, match=message):
        pt.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), **kwargs)
    # PyTorch refuses the same arguments too (its wording for the shared cases)
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        F.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), **kwargs)


@needs_torch
def test_alpha_must_be_a_number():
    with pytest.raises(TypeError, match="expected alpha to be a real number, got 'x'"):
        pt.conv2d_add_relu(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3),
                           torch.randn(1, 3, 3, 3), alpha="x")


@needs_torch
def test_cache_is_bounded_and_clearable():
    assert pt.CACHE_MAX >= 1024
    pt.clear_cache()
    remembered = calls.remembered_signatures()
    assert not remembered["forward"] and not remembered["backward"]


@needs_torch
def test_channels_last_rule_is_pytorchs():
    """The memory format follows c10's is_channels_last_strides_2d (suggest_memory_format)."""
    cases = [torch.empty(2, 3, 4, 5), torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),
             torch.empty(2, 1, 4, 5), torch.empty(2, 3, 1, 1),
             torch.empty(2, 3, 1, 1).to(memory_format=torch.channels_last),
             torch.empty(2, 3, 4, 5).permute(0, 1, 3, 2), torch.empty(4, 5, 2, 3).permute(2, 3, 0, 1)]
    prims = pytest.importorskip("torch._prims_common")
    if not hasattr(prims, "suggest_memory_format"):
        pytest.skip("this PyTorch has no Python suggest_memory_format to compare with")
    for t in cases:
        expected = prims.suggest_memory_format(t) == torch.channels_last
        assert (calls.memory_format(t, t) is torch.channels_last) == expected, (t.shape, t.stride())


@needs_torch
def test_set_routing_refuses_unknown_modes():
    with pytest.raises(ValueError, match=r"expected mode to be one of \['auto', 'pycudnn'\], got 'fast'"):
        pt.set_routing("fast")
    assert pt.routing.routing() in ("auto", "pycudnn")


@needs_torch
@pytest.mark.parametrize("ours_us, allowance, winner", [
    (60.0, 0.0, "pycudnn"), (170.0, 0.0, "torch"),
    (160.0, 0.0, "pycudnn"), (160.0, 15.0, "torch"), (150.0, 15.0, "pycudnn")])
def test_a_duel_gives_each_side_the_figures_of_its_own_runs(monkeypatch, ours_us, allowance,
                                                            winner):
    """Each side is timed twice (ours, theirs, theirs, ours); a side's figure is the least of
    its own two runs, never one of the other side's. With an allowance, a GPU saving smaller
    than it goes to PyTorch (7% is above the margin, 12 us below a 15 us allowance)."""
    from pycudnn.torch import routing

    def ours():
        pass

    def theirs():
        pass
    runs = {ours: [(ours_us, ours_us + 2), (ours_us + 1, ours_us + 3)],
            theirs: [(172.0, 175.0), (173.0, 174.0)]}
    order = []
    monkeypatch.setattr(routing, "time_call", lambda fn, device, stream, launches=4: (
        order.append(fn), runs[fn].pop(0))[1])
    routing.clear_report()
    try:
        assert routing.pycudnn_wins("sig", "forward", ours, theirs, 0, 0,
                                    allowance_us=allowance) is (winner == "pycudnn")
        (d,) = routing.report()
    finally:
        routing.clear_report()
    assert order == [ours, theirs, theirs, ours]
    assert (d["winner"], d["pycudnn_gpu_us"], d["torch_gpu_us"]) == (winner, ours_us, 172.0)
    assert (d["pycudnn_call_us"], d["torch_call_us"]) == (ours_us + 2, 174.0)
    if allowance and winner == "torch":
        assert "less than the 15 us its autograd node costs the host" in d["reason"], d


@needs_torch
@pytest.mark.parametrize("op", ["conv", "bias_relu", "add_relu"])
def test_the_pytorch_side_of_a_routed_forward_op_computes_the_op(op):
    """What a fused call routed to PyTorch runs (on the CPU here): the convolution with its
    bias, then ``relu(y + alpha * z)`` in place on that output; z is not written."""
    from pycudnn.torch import calls

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float64)
    w = torch.randn(5, 4, 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(5, generator=g, dtype=torch.float64)
    z = torch.randn(2, 5, 3, 3, generator=g, dtype=torch.float64)
    z_before = z.clone()
    geom = ((2, 2), (1, 1), (1, 1), 1)
    got = calls.torch_forward(op, x, w, b, z if op == "add_relu" else None, -0.5, geom)
    want = torch.nn.functional.conv2d(x, w, b, 2, 1)
    if op == "add_relu":
        want = want - 0.5 * z
    if op != "conv":
        want = torch.relu(want)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert torch.equal(z, z_before)
    if op != "conv":
        assert (got >= 0).all() and (got == 0).any()


@needs_torch
def test_conversion_report_says_what_was_left_to_pytorch_and_why(caplog):
    class MyConv(nn.Conv2d):
        pass

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv1d(3, 4, 3), nn.ConvTranspose2d(4, 3, 2),
                          MyConv(4, 4, 1), nn.Sequential(nn.Conv2d(4, 4, 1), nn.Linear(2, 2)))
    before = pt.conversion_report(model)
    assert [r["converted"] for r in before] == [False] * 5
    assert before[0]["reason"] == "not converted yet (call convert)"
    with caplog.at_level("INFO", logger="pycudnn"):
        assert pt.convert(model) is model
    rows = {r["name"]: r for r in pt.conversion_report(model)}
    assert list(rows) == ["0", "1", "2", "3", "4.0"]
    assert rows["0"]["converted"] and rows["4.0"]["converted"] and rows["0"]["reason"] == ""
    assert rows["0"]["type"] == "pycudnn.torch.modules.Conv2d"
    assert rows["1"]["type"] == "pycudnn.torch.modules.Conv1d" and rows["1"]["converted"]
    assert rows["2"]["type"] == "pycudnn.torch.modules.ConvTranspose2d" and rows["2"]["converted"]
    assert rows["3"]["reason"] == ("MyConv: a subclass of torch.nn.Conv2d (it may compute something "
                                   "else; convert takes the torch.nn classes themselves)")
    assert ("pycudnn.torch.convert: 4 of 5 convolution modules run in pycudnn (2 Conv2d, 1 Conv1d, "
            "1 ConvTranspose2d); 1 left to PyTorch: MyConv: a subclass of torch.nn.Conv2d") \
        in caplog.text
    with pytest.raises(TypeError, match="conversion_report: expected a torch.nn.Module, got int"):
        pt.conversion_report(3)
