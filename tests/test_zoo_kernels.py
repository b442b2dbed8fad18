"""benchmarks/zoo.py --parts kernels without a GPU and without torchvision: the convolution
signature collector on a handwritten model (CPU and meta device), conv_vs_torch's generalised
calls (rectangular kernels, dilation, groups) against float64 PyTorch, the cross-model
deduplication and the summaries on synthetic cells. The ``gpu`` test times one cell."""

from __future__ import annotations

import argparse
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import conv_vs_torch  # noqa: E402
import zoo  # noqa: E402

from pycudnn.cli.models import Layer  # noqa: E402

Sig = zoo.ConvSignature


class Net(torch.nn.Module):
    """A stem 7x7 stride 2, a depthwise 3x3, a grouped 3x3, a dilated 3x3, a 1x5 and a 5x5, and
    two identical 1x1 layers (one signature, two layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.grouped = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=4, bias=False)
        self.dilated = torch.nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.a = torch.nn.Conv2d(16, 16, 1)
        self.b = torch.nn.Conv2d(16, 16, 1)
        self.rect = torch.nn.Conv2d(16, 12, (1, 5), padding=(0, 2))
        self.five = torch.nn.Conv2d(12, 12, 5, stride=2, padding=2, groups=12)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.dw(x))
        x = self.dilated(self.grouped(x))
        x = self.b(self.a(x))
        return self.five(self.rect(x)).mean()


EXPECTED = [  # (signature, layers) for a (2, 3, 32, 30) input, worked out by hand
    (Sig(2, 3, 32, 30, 8, 7, 7, (2, 2), (3, 3)), ["stem"]),
    (Sig(2, 8, 16, 15, 8, 3, 3, (1, 1), (1, 1), groups=8), ["dw"]),
    (Sig(2, 8, 16, 15, 16, 3, 3, (2, 2), (1, 1), groups=4), ["grouped"]),
    (Sig(2, 16, 8, 8, 16, 3, 3, (1, 1), (2, 2), (2, 2)), ["dilated"]),
    (Sig(2, 16, 8, 8, 16, 1, 1), ["a", "b"]),
    (Sig(2, 16, 8, 8, 12, 1, 5, (1, 1), (0, 2)), ["rect"]),
    (Sig(2, 12, 8, 8, 12, 5, 5, (2, 2), (2, 2), groups=12), ["five"]),
]


def _outputs(model, x):
    """Each convolution's real output shape, from forward hooks (the reference for y_shape)."""
    shapes = {}

    def record(name):
        def hook(module, inputs, output):
            shapes[name] = tuple(output.shape)  # returns None: the output is left as it is
        return hook

    hooks = [m.register_forward_hook(record(n)) for n, m in model.named_modules()
             if isinstance(m, torch.nn.Conv2d)]
    model(x)
    for h in hooks:
        h.remove()
    return shapes


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_collector_finds_each_distinct_convolution_once(device):
    torch.manual_seed(0)
    with torch.device(device):
        model = Net().to(memory_format=torch.channels_last)
        x = torch.randn(2, 3, 32, 30).to(memory_format=torch.channels_last)
    found = zoo.collect_convolutions(model, x)
    assert [(c.signature, c.layers) for c in found] == EXPECTED
    assert [c.count for c in found] == [1, 1, 1, 1, 2, 1, 1]
    assert [c.calls for c in found] == [1, 1, 1, 1, 2, 1, 1]
    # the stem's input is the data (no gradient): training runs no backward data for it
    assert [c.input_grad for c in found] == [False] + [True] * 6
    assert zoo.kernel_directions(found[0]) == ["fwd", "wgrad"]
    assert zoo.kernel_directions(found[1]) == ["fwd", "dgrad", "wgrad"]
    # the hooks are gone, and each signature's output shape is what the layer really produced
    assert all(not m._forward_pre_hooks for m in model.modules())
    real = _outputs(model, x)
    for c in found:
        for name in c.layers:
            assert c.signature.y_shape == real[name], name
        w = dict(model.named_modules())[c.layers[0]].weight
        assert c.signature.w_shape == tuple(w.shape)


def test_collector_counts_calls_of_a_shared_layer_and_grad_mode():
    conv = torch.nn.Conv2d(4, 4, 3, padding=1)
    model = torch.nn.Sequential(conv, torch.nn.ReLU(), conv)  # one layer, called twice
    x = torch.randn(1, 4, 6, 6)
    (c,) = zoo.collect_convolutions(model, x)
    assert (c.layers, c.calls, c.input_grad) == (["0"], 2, True)  # the second call's input needs it
    with torch.no_grad():
        (c,) = zoo.collect_convolutions(model, x)
    assert not c.input_grad


def test_signature_of_same_padding_and_reflect_padding():
    x = torch.randn(1, 2, 9, 9)
    same = torch.nn.Conv2d(2, 2, (3, 5), padding="same", dilation=(1, 2))
    assert zoo.conv_signature(same, x) == Sig(1, 2, 9, 9, 2, 3, 5, (1, 1), (1, 4), (1, 2))
    assert zoo.conv_signature(same, x).y_shape == tuple(same(x).shape)
    valid = torch.nn.Conv2d(2, 2, 3, padding="valid")
    assert zoo.conv_signature(valid, x).padding == (0, 0)
    # padding_mode="reflect": nn.Conv2d pads the input itself and convolves with no padding
    refl = torch.nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")
    assert zoo.conv_signature(refl, x) == Sig(1, 2, 11, 11, 3, 3, 3)
    odd = torch.nn.Conv2d(2, 2, 2, padding="same")
    with pytest.raises(ValueError, match=r"padding: 'same' with an odd total padding \[1, 1\]"):
        zoo.conv_signature(odd, x)
    with pytest.raises(ValueError, match=r"x: expected a 4-D \(N, C, H, W\) input"):
        zoo.conv_signature(refl, torch.randn(2, 9, 9))


def test_signature_geometry_agrees_with_the_cli_layer():
    sig = Sig(32, 64, 56, 56, 128, 3, 3, (2, 2), (1, 1), (1, 1), 2)
    layer = Layer("l", 32, 64, (56, 56), 128, (3, 3), stride=2, pad=1, groups=2)
    assert sig.shape_string() == layer.shape_string() == "32,64,56,56,128,3,3,2,1,1,2"
    assert (sig.x_shape, sig.w_shape, sig.y_shape, sig.flops) == (
        layer.x_shape, layer.w_shape, layer.y_shape, layer.flops)
    assert Sig(8, 16, 8, 8, 12, 1, 5, (1, 1), (0, 2)).shape_string() == "8,16,8,8,12,1,5,1x1,0x2"
    assert Sig(8, 3, 224, 224, 64, 7, 7, (2, 2), (3, 3)).shape_string() == "8,3,224,224,64,7,7,2,3"


class _FakePycudnn:
    """Records what conv_vs_torch's pycudnn closures pass (no GPU here)."""

    def __init__(self) -> None:
        self.calls: list = []

    def __getattr__(self, name):
        return lambda *a, **kw: self.calls.append((name, a, kw))


@pytest.mark.parametrize("direction", ["fwd", "dgrad", "wgrad"])
def test_conv_vs_torch_calls_carry_rectangular_kernels_dilation_and_groups(direction):
    sig = Sig(2, 6, 11, 10, 9, 3, 5, (2, 1), (1, 2), (2, 1), 3)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(sig.x_shape, generator=g)
    w = torch.randn(sig.w_shape, generator=g)
    dy = torch.randn(sig.y_shape, generator=g)
    fake = _FakePycudnn()
    flags = {"benchmark": True, "tuning_db": False}
    tfn, pfn = conv_vs_torch._calls(torch, F, fake, sig, direction, x, w, dy, flags, "stream")
    pfn()
    ((name, args, kw),) = fake.calls
    geometry = {"stride": [2, 1], "padding": [1, 2], "dilation": [2, 1], "groups": 3}
    assert kw == {"stream": "stream", **geometry, **flags}
    # PyTorch's side against float64 autograd of the convolution the signature names
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    yd = F.conv2d(xd, wd, None, (2, 1), (1, 2), (2, 1), 3)
    gx, gw = torch.autograd.grad(yd, (xd, wd), dy.double())
    if direction == "fwd":
        assert name == "convolution" and args == (x, w)
        got, want = tfn(), yd
    elif direction == "dgrad":
        assert name == "convolution_backward_data" and args == (dy, w, sig.x_shape)
        got, want = tfn()[0], gx
    else:
        assert name == "convolution_backward_filter" and args == (x, dy, sig.w_shape)
        got, want = tfn()[1], gw
    assert tuple(got.shape) == tuple(want.shape)
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-4, atol=1e-4)


def test_conv_vs_torch_calls_keep_the_resnet50_layers():
    layer = conv_vs_torch.resnet50_layers(2)[0]  # conv1: 7x7 stride 2 pad 3, ints
    x, w = torch.randn(layer.x_shape), torch.randn(layer.w_shape)
    fake = _FakePycudnn()
    tfn, pfn = conv_vs_torch._calls(torch, F, fake, layer, "fwd", x, w, None, {}, None)
    pfn()
    assert fake.calls[0][2] == {"stream": None, "stride": [2, 2], "padding": [3, 3],
                                "dilation": [1, 1], "groups": 1}
    torch.testing.assert_close(tfn(), F.conv2d(x, w, None, 2, 3))
    with pytest.raises(ValueError, match=r"direction: expected one of fwd, dgrad, wgrad, got 'bwd'"):
        conv_vs_torch._calls(torch, F, fake, layer, "bwd", x, w, None, {}, None)


def _conv(sig, layers, input_grad=True):
    return zoo.CollectedConv(sig, list(layers), len(layers), input_grad)


def test_cells_are_timed_once_per_run_and_reported_under_each_model():
    s1, s2, s3 = Sig(4, 3, 8, 8, 8, 7, 7, (2, 2), (3, 3)), Sig(4, 8, 4, 4, 8, 1, 1), Sig(4, 8, 4, 4, 8, 3, 3)
    measured = []

    def measure(sig, d):
        measured.append((sig.shape_string(), d))
        return {"config": "bf16-nhwc", "layer": sig.shape_string(), "shape": sig.shape_string(),
                "direction": d, "torch_us": 2.0, "pycudnn_us": 1.0, "ratio": 2.0}

    cache: dict = {}
    a = zoo.model_kernel_cells([_conv(s1, ["stem"], False), _conv(s2, ["x", "y"])], cache, measure)
    b = zoo.model_kernel_cells([_conv(s2, ["p", "q", "r"]), _conv(s3, ["z"])], cache, measure)
    assert measured == [(s1.shape_string(), "fwd"), (s1.shape_string(), "wgrad"),
                        (s2.shape_string(), "fwd"), (s2.shape_string(), "dgrad"),
                        (s2.shape_string(), "wgrad"), (s3.shape_string(), "fwd"),
                        (s3.shape_string(), "dgrad"), (s3.shape_string(), "wgrad")]
    assert [(c["direction"], c["layers"]) for c in a] == [("fwd", 1), ("wgrad", 1), ("fwd", 2),
                                                         ("dgrad", 2), ("wgrad", 2)]
    assert [c["layers"] for c in b] == [3, 3, 3, 1, 1, 1]
    assert b[0]["layer_names"] == ["p", "q", "r"] and a[2]["layer_names"] == ["x", "y"]
    assert "layers" not in cache[(s2.shape_string(), "fwd")]  # the shared cell is not the model's copy


def _cell(shape, d, torch_us=None, pycudnn_us=None, layers=1, **kw):
    row = {"config": "bf16-nhwc", "layer": shape, "shape": shape, "direction": d,
           "torch_us": torch_us, "pycudnn_us": pycudnn_us, "layers": layers}
    if torch_us and pycudnn_us:
        row["ratio"] = torch_us / pycudnn_us
    row.update(kw)
    return row


def test_model_summary_geomean_cells_below_and_time_ratio():
    cells = [_cell("A", "fwd", 10.0, 10.0, layers=3), _cell("A", "wgrad", 8.5, 10.0, layers=3),
             _cell("B", "fwd", 30.0, 20.0), _cell("B", "dgrad", 12.0, 10.0)]
    s = zoo.kernel_summary(cells)
    assert s["geomean"] == pytest.approx((1.0 * 0.85 * 1.5 * 1.2) ** 0.25)
    assert s["below"] == ["bf16-nhwc A wgrad 0.850"]
    assert s["min"] == {"ratio": pytest.approx(0.85), "cell": "bf16-nhwc A wgrad"}
    # summed time, each cell weighted by its layers: (30 + 25.5 + 30 + 12) / (30 + 30 + 20 + 10)
    assert s["time_ratio"] == pytest.approx(97.5 / 90.0)
    assert (s["cells"], s["timed"], s["meets_target"]) == (4, 4, False)
    text = zoo.format_kernel_summary("net", s)
    assert "net: geomean torch/pycudnn 1.112 over 4 of 4 cells, time ratio 1.083" in text
    assert "below 0.90: 1 (bf16-nhwc A wgrad 0.850)" in text and text.endswith("not met")

    good = zoo.kernel_summary([_cell("A", "fwd", 11.0, 10.0), _cell("A", "wgrad", 9.5, 10.0)])
    assert good["geomean"] == pytest.approx(math.sqrt(1.1 * 0.95)) and good["below"] == []
    assert good["meets_target"]  # geomean 1.022 >= 1.02 and no cell below 0.90
    low = zoo.kernel_summary([_cell("A", "fwd", 10.1, 10.0), _cell("A", "wgrad", 10.0, 10.0)])
    assert not low["meets_target"] and low["below"] == []  # geomean 1.005 < 1.02
    failed = zoo.kernel_summary([_cell("A", "fwd", 20.0, 10.0), _cell("A", "dgrad", error="E: boom")])
    assert failed["errors"] == ["bf16-nhwc A dgrad: E: boom"] and not failed["meets_target"]
    assert failed["timed"] == 1 and failed["cells"] == 2
    none = zoo.kernel_summary([])
    assert math.isnan(none["geomean"]) and math.isnan(none["time_ratio"]) and not none["meets_target"]


def test_overall_summary_counts_a_shared_cell_once():
    m1 = [_cell("A", "fwd", 10.0, 5.0, layers=2), _cell("B", "fwd", 8.0, 10.0)]
    m2 = [_cell("A", "fwd", 10.0, 5.0, layers=4), _cell("C", "wgrad", 10.0, 10.0)]
    s = zoo.overall_kernel_summary({"m1": m1, "m2": m2})
    assert (s["cells"], s["timed"]) == (3, 3)
    assert s["geomean"] == pytest.approx((2.0 * 0.8 * 1.0) ** (1 / 3))
    assert s["below"] == ["bf16-nhwc B fwd 0.800"]
    assert s["time_ratio"] == pytest.approx((60 + 8 + 10) / (30 + 10 + 10))  # A: 2 + 4 layers
    assert s["models"] == ["m1", "m2"]
    assert m1[0]["layers"] == 2  # the models' cells are left as they were


def test_kernel_table_marks_cells_below_and_the_skipped_backward_data():
    stem, dw = Sig(2, 3, 8, 8, 4, 7, 7, (2, 2), (3, 3)), Sig(2, 4, 4, 4, 4, 3, 3, (1, 1), (1, 1), groups=4)
    convs = [_conv(stem, ["conv1"], False), _conv(dw, ["a", "b"])]
    cells = [_cell(stem.shape_string(), "fwd", 10.0, 10.0), _cell(stem.shape_string(), "wgrad", 8.0, 10.0),
             _cell(dw.shape_string(), "fwd", 5.0, 4.0, layers=2),
             _cell(dw.shape_string(), "dgrad", error="RuntimeError: x", layers=2)]
    lines = zoo.format_kernel_table("net", convs, cells).splitlines()
    assert lines[0] == "net: 2 distinct convolutions (3 layers), bf16-nhwc"
    assert lines[3] == "| 2,3,8,8,4,7,7,2,3 | 1 | fwd | 10.00 | 10.00 | 1.000 |"
    assert lines[4] == "| 2,3,8,8,4,7,7,2,3 | 1 | wgrad | 8.00 | 10.00 | 0.800 **<0.90** |"
    assert lines[5] == "| 2,3,8,8,4,7,7,2,3 | 1 | dgrad | - | - | not run in training |"
    assert lines[6] == "| 2,4,4,4,4,3,3,1,1,1,4 | 2 | fwd | 5.00 | 4.00 | 1.250 |"
    assert lines[7] == "| 2,4,4,4,4,3,3,1,1,1,4 | 2 | dgrad | - | - | - (RuntimeError: x) |"


def test_kernels_part_records_each_model_and_times_a_shared_cell_once(monkeypatch, capsys):
    """part_kernels' wiring with the GPU parts replaced: the model, its data, the timing."""
    measured = []

    def fake_measure(sig, d, state):
        measured.append((sig, d))
        return {"config": "bf16-nhwc", "layer": sig.shape_string(), "shape": sig.shape_string(),
                "direction": d, "torch_us": 3.0, "pycudnn_us": 2.0, "ratio": 1.5}

    class Gate:
        def describe(self):
            return {"mode": "fake"}

    monkeypatch.setattr(zoo, "make", lambda name, dtype: Net())
    monkeypatch.setattr(zoo, "data", lambda batch, dtype, count: [(torch.randn(batch, 3, 32, 30), None)])
    monkeypatch.setattr(zoo, "_kernel_timing", lambda args: {"dtype": torch.float32, "tensors": {},
                                                             "gate": Gate()})
    monkeypatch.setattr(zoo, "_measure_signature", fake_measure)
    args = zoo.build_parser().parse_args(["--parts", "kernels", "--batch", "2"])
    args.batch, args.kernel_cells, args.kernel_state = [2], {}, None
    one = zoo.part_kernels("net", args)
    two = zoo.part_kernels("net_again", args)
    assert len(measured) == 20  # 7 signatures x 3 directions, less the stem's backward data
    assert one["cells"] == two["cells"] and len(one["cells"]) == 20
    assert (one["config"], one["batch"], one["reps"], one["batches"]) == ("bf16-nhwc", 2, 40, 4)
    sigs = one["signatures"]
    assert [s["layers"] for s in sigs] == [1, 1, 1, 1, 2, 1, 1] and sigs[4]["layer_names"] == ["a", "b"]
    assert sigs[0]["dgrad_in_training"] is False and sigs[0]["shape"] == "2,3,32,30,8,7,7,2,3"
    assert one["summary"]["geomean"] == pytest.approx(1.5) and one["summary"]["below"] == []
    assert one["summary"]["time_ratio"] == pytest.approx(1.5)
    out = capsys.readouterr().out
    assert "net: 7 distinct convolutions (8 layers), bf16-nhwc" in out
    assert "net_again: geomean torch/pycudnn 1.500 over 20 of 20 cells" in out


@pytest.mark.parametrize("argv, message", [
    (["--parts", "kernel"], "--parts: unknown part 'kernel'; expected a comma-separated list of train,"),
    (["--parts", "kernels", "--kernel-reps", "0"], "--kernel-reps: expected an int >= 1, got 0"),
    (["--parts", "kernels", "--kernel-batches", "-2"], "--kernel-batches: expected an int >= 1, got -2"),
])
def test_zoo_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        zoo.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_kernels_part_is_listed_but_not_default():
    assert zoo.PARTS["kernels"] is zoo.part_kernels
    assert "``kernels``" in zoo.__doc__ and "--parts kernels" in zoo.__doc__
    defaults = zoo.build_parser().parse_args([])
    assert "kernels" not in defaults.parts.split(",") and set(defaults.parts.split(",")) <= set(zoo.PARTS)
    assert (defaults.kernel_reps, defaults.kernel_batches, defaults.kernel_names) == (40, 4, False)


@pytest.mark.gpu
def test_one_depthwise_cell_is_timed_on_the_gpu():
    args = argparse.Namespace(kernel_reps=5, kernel_batches=2, kernel_names=False)
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.benchmark = True
    try:
        state = zoo._kernel_timing(args)
        sig = Sig(8, 32, 28, 28, 32, 5, 5, (1, 1), (2, 2), groups=32)
        for d in ("fwd", "dgrad", "wgrad"):
            row = zoo._measure_signature(sig, d, state)
            assert "error" not in row, row.get("error")
            assert row["torch_us"] > 0 and row["pycudnn_us"] > 0 and len(row["torch_samples_us"]) == 2
            assert row["ratio"] == pytest.approx(row["torch_us"] / row["pycudnn_us"])
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved


def test_compiled_sides_get_their_mode_and_reduce_overhead_marks_each_step(monkeypatch):
    assert [zoo._compile_mode(s) for s in zoo.TRAIN_SIDES] == [
        None, None, None, None, "default", "default", "reduce-overhead", "reduce-overhead"]
    marks, ran = [], []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(zoo, "step", lambda *a: ran.append(a))
    zoo.side_step("fused")(1, 2, 3, 4)
    assert (marks, len(ran)) == ([], 1)
    zoo.side_step("fused_compile_ro")(1, 2, 3, 4)
    assert (marks, ran[-1]) == ([1], (1, 2, 3, 4))
    with pytest.raises(ValueError, match="--train-sides: expected each of torch, pycudnn"):
        zoo.training_side("eager", torch.nn.Linear(2, 2))


def test_an_unknown_inference_side_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        zoo.main(["--infer-sides", "torch,tensorrt"])
    assert "--infer-sides: unknown side 'tensorrt'" in capsys.readouterr().err


def test_training_geomeans_cover_the_sides_each_run_measured():
    """A run without the convert side (only compiled sides) still sums up, by side."""
    models = {"a": {"train": {"batch64": {"compile_over_torch": 0.5, "fused_compile_over_torch": 2.0,
                                          "fused_compile_over_compile": 4.0, "kept": []}}},
              "b": {"train": {"batch64": {"compile_over_torch": 2.0, "pycudnn_over_torch": 1.5}}},
              "c": {"infer": {"fused_over_torch": 3.0}}}
    got = zoo.train_geomeans(models, "batch64")
    assert got == pytest.approx({"train_compile_geomean": 1.0, "train_fused_compile_geomean": 2.0,
                                 "train_geomean": 1.5})
    assert zoo.train_geomeans(models, "batch256") == {}


def test_the_chains_side_fuses_batch_norms_into_the_convolutions():
    from torch_models import SmallResNet

    model = zoo.training_side("chains", SmallResNet())
    names = {type(m).__name__ for m in model.modules()}
    assert {"ConvStats2d", "BnReLUConv2d", "ConvBn2d"} <= names
    assert "ConvStats2d" not in {type(m).__name__ for m in zoo.training_side("fused",
                                                                           SmallResNet()).modules()}
