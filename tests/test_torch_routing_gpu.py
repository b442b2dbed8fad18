"""pycudnn.torch's routing on a GPU: in benchmark mode a new call signature is timed against
PyTorch's own convolution and runs on the faster side. Whichever side runs it, results equal
PyTorch's native (non-cuDNN) float64 convolution; a layer whose forward and backward both went to
PyTorch skips pycudnn's autograd function."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # a CPU build of PyTorch on a GPU machine
    pytest.skip("PyTorch has no CUDA here", allow_module_level=True)

import pycudnn  # noqa: E402
import pycudnn.torch as pt  # noqa: E402
from pycudnn.tuning import routes as route_store  # noqa: E402
from pycudnn.torch import calls, routing  # noqa: E402

F = torch.nn.functional
DEV = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def _benchmark_mode(monkeypatch):
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    pt.set_routing("auto")
    pt.clear_cache()
    routing.clear_report()
    route_store.clear()  # each test decides afresh (decisions are kept on disk between processes)
    yield
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved
    pt.clear_cache()
    routing.clear_report()
    route_store.clear()


def _tensors(dtype, fmt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(4, 16, 12, 12, device=DEV, dtype=dtype, generator=g)
    w = torch.randn(24, 16, 3, 3, device=DEV, dtype=dtype, generator=g) / 12
    b = torch.randn(24, device=DEV, dtype=dtype, generator=g)
    x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)
    return [t.requires_grad_(True) for t in (x, w, b)]


def _reference(x, w, b, gy):
    xd, wd, bd = (t.detach().double().requires_grad_(True) for t in (x, w, b))
    with torch.backends.cudnn.flags(enabled=False):
        y = F.conv2d(xd, wd, bd, 1, 1)
        y.backward(gy.double())
    return y, xd.grad, wd.grad, bd.grad


def _err(got, ref):
    return float((got.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("forced", ["torch", "measured"])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_routed_convolutions_match_float64(forced, fmt, monkeypatch):
    if forced == "torch":
        monkeypatch.setattr(routing, "MARGIN", 1.0)  # pycudnn would need a GPU time of 0: never
    for step in range(3):
        x, w, b = _tensors(torch.float32, fmt, seed=step)
        y = pt.conv2d(x, w, b, 1, 1)
        gy = torch.randn_like(y)
        y.backward(gy)
        ref_y, gx, gw, gb = _reference(x, w, b, gy)
        for got, ref in ((y, ref_y), (x.grad, gx), (w.grad, gw), (b.grad, gb)):
            assert _err(got, ref) < 1e-4
    decisions = pt.routing_report()
    assert {d["direction"] for d in decisions} == {"forward", "backward data", "backward filter"}
    assert len(decisions) == 3  # one decision per signature, not one per call
    for d in decisions:
        assert d["winner"] in ("pycudnn", "torch") and d["reason"]
        assert d["pycudnn_gpu_us"] > 0 and d["torch_gpu_us"] > 0
        assert d["pycudnn_call_us"] > 0 and d["torch_call_us"] > 0
        assert "x[4, 16, 12, 12] w[24, 16, 3, 3] float32" in d["signature"]
    if forced == "torch":
        assert all(d["winner"] == "torch" for d in decisions)
        assert len(calls.torch_layers) == 1
        y = pt.conv2d(x, w, b, 1, 1)
        assert type(y.grad_fn).__name__ == "ConvolutionBackward0"  # PyTorch's node, not ours


def test_routing_off_keeps_every_signature_in_pycudnn(monkeypatch):
    monkeypatch.setattr(routing, "MARGIN", 1.0)
    pt.set_routing("pycudnn")
    x, w, b = _tensors(torch.float32, torch.channels_last, seed=7)
    y = pt.conv2d(x, w, b, 1, 1)
    y.backward(torch.ones_like(y))
    assert pt.routing_report() == []
    assert all(e[0] is not None for e in calls.remembered_signatures()["forward"].values())
    assert type(y.grad_fn).__name__ == "_Conv2dFunctionBackward"  # pycudnn's autograd function


def test_no_routing_without_benchmark_mode(monkeypatch):
    monkeypatch.setattr(routing, "MARGIN", 1.0)
    torch.backends.cudnn.benchmark = False
    x, w, b = _tensors(torch.float32, torch.channels_last, seed=8)
    pt.conv2d(x, w, b, 1, 1).sum().backward()
    assert pt.routing_report() == []


def test_pycudnn_determinism_is_kept(monkeypatch):
    """pycudnn's own deterministic=True, which PyTorch's flags do not ask for: never routed."""
    import pycudnn

    monkeypatch.setattr(routing, "MARGIN", 1.0)
    x, w, b = _tensors(torch.float32, torch.channels_last, seed=9)
    monkeypatch.setattr(pycudnn.config, "deterministic", True)  # global: the backward thread too
    pt.conv2d(x, w, b, 1, 1).sum().backward()
    assert pt.routing_report() == []


def _searched_shapes(direction):
    return {tuple(r["params"].input_shape) for r in pycudnn.benchmark_cache()
            if r["direction"] == direction}


def test_a_signature_pytorch_runs_faster_than_a_pycudnn_call_costs_is_not_searched(monkeypatch):
    """Once pycudnn's host cost per call is known (the least back-to-back time of a host-bound
    launch), a new signature whose PyTorch call runs back to back in less goes to PyTorch
    before pycudnn searches it; results still equal float64."""
    pycudnn.clear_caches()
    monkeypatch.setitem(routing._host_floor, "forward", float("inf"))
    x, w, b = _tensors(torch.float32, torch.channels_last, seed=11)
    with torch.no_grad():
        y = pt.conv2d(x, w, b, 1, 1)
    (d,) = pt.routing_report()
    assert d["winner"] == "torch" and "not searched" in d["reason"], d
    assert d["torch_call_us"] > 0 and d["pycudnn_gpu_us"] == 0
    assert tuple(x.shape) not in _searched_shapes("forward")
    ref = _reference(x, w, b, torch.ones_like(y))[0]
    assert _err(y, ref) < 1e-4
    # with no such bound the duel decides, after pycudnn's search
    pt.clear_cache()
    routing.clear_report()
    monkeypatch.setitem(routing._host_floor, "forward", 0.0)
    x, w, b = _tensors(torch.float32, torch.channels_last, seed=12)
    x = x[:3].detach()
    with torch.no_grad():
        pt.conv2d(x, w, b, 1, 1)
    (d,) = pt.routing_report()
    assert "not searched" not in d["reason"] and d["pycudnn_gpu_us"] > 0
    assert tuple(x.shape) in _searched_shapes("forward")


def test_a_later_process_takes_the_stored_decisions(monkeypatch):
    """Decisions are stored on disk; with this process's memory forgotten (what a later process
    sees) each signature keeps its side without timing, and a direction PyTorch won is not
    searched by pycudnn at all."""
    x, w, b = _tensors(torch.float32, torch.channels_last, seed=13)
    y = pt.conv2d(x, w, b, 1, 1)
    y.backward(torch.ones_like(y))
    first = {d["direction"]: d["winner"] for d in pt.routing_report()}
    assert len(first) == 3
    route_store.flush()
    pt.clear_cache()
    pycudnn.clear_caches()
    routing.clear_report()
    route_store.forget()
    x.grad = w.grad = b.grad = None
    y = pt.conv2d(x, w, b, 1, 1)
    gy = torch.randn_like(y)
    y.backward(gy)
    again = pt.routing_report()
    assert {d["direction"]: d["winner"] for d in again} == first
    assert all(d["reason"].startswith("stored: ") for d in again)
    names = {"forward": "forward", "backward data": "backward_data",
             "backward filter": "backward_filter"}
    for direction, winner in first.items():
        searched = tuple(x.shape) in _searched_shapes(names[direction])
        assert searched == (winner == "pycudnn"), (direction, winner)
    ref_y, gx, gw, gb = _reference(x, w, b, gy)
    for got, ref in ((y, ref_y), (x.grad, gx), (w.grad, gw), (b.grad, gb)):
        assert _err(got, ref) < 1e-4


def _fused_reference(x, w, b, z, alpha):
    with torch.backends.cudnn.flags(enabled=False):
        y = F.conv2d(x.double(), w.double(), b.double(), 1, 1)
    if z is not None:
        y = y + alpha * z.double()
    return torch.relu(y)


@pytest.mark.parametrize("forced", ["torch", "measured"])
@pytest.mark.parametrize("op", ["bias_relu", "add_relu"])
def test_fused_forward_calls_are_routed_and_match_float64(forced, op, monkeypatch):
    """A fused call's new signature is timed against PyTorch's convolution and epilogue and
    runs on the faster side; both sides compute relu(conv + b + alpha * z), and z is left as it
    was."""
    if forced == "torch":
        monkeypatch.setattr(routing, "MARGIN", 1.0)
    for step in range(3):
        x, w, b = (t.detach() for t in _tensors(torch.float32, torch.channels_last, seed=20 + step))
        z = torch.randn(4, 24, 12, 12, device=DEV).to(memory_format=torch.channels_last)
        z_before = z.clone()
        with torch.no_grad():
            if op == "bias_relu":
                y = pt.conv2d_bias_relu(x, w, b, 1, 1)
                ref = _fused_reference(x, w, b, None, 1.0)
            else:
                y = pt.conv2d_add_relu(x, w, z, b, 0.5, 1, 1)
                ref = _fused_reference(x, w, b, z, 0.5)
        assert y.is_contiguous(memory_format=torch.channels_last)
        assert _err(y, ref) < 1e-4
        assert torch.equal(z, z_before)
    (d,) = pt.routing_report()  # one decision for the signature, not one per call
    name = "conv2d_bias_relu" if op == "bias_relu" else "conv2d_add_relu"
    assert d["signature"].startswith(f"{name} x[4, 16, 12, 12] w[24, 16, 3, 3] float32"), d
    assert d["direction"] == "forward" and d["pycudnn_gpu_us"] > 0 and d["torch_gpu_us"] > 0
    entry = next(e for k, e in calls.remembered_signatures()["forward"].items() if k[0] == op)
    if forced == "torch":
        assert d["winner"] == "torch" and entry[:2] == (None, "torch")
    else:
        assert (entry[0] is None) == (d["winner"] == "torch")


def test_a_fused_inference_model_routed_to_pytorch_matches_float64(monkeypatch):
    """fuse_for_inference's blocks in benchmark mode, every signature sent to PyTorch: the
    model's output is still the unfused model's (float64), and the decisions name the fused
    calls."""
    monkeypatch.setattr(routing, "MARGIN", 1.0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(16)
            self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
            self.bn2 = torch.nn.BatchNorm2d(16)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + x)

    torch.manual_seed(3)
    model = Block().to(DEV)
    for bn in (model.bn1, model.bn2):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    model = model.eval().to(memory_format=torch.channels_last)
    fused = pt.fuse_for_inference(model)
    x = torch.randn(4, 16, 12, 12, device=DEV).to(memory_format=torch.channels_last)
    with torch.no_grad():
        got = [fused(x) for _ in range(2)]
        with torch.backends.cudnn.flags(enabled=False):
            ref = model.double()(x.double())
    for y in got:
        assert _err(y, ref) < 1e-4
    names = sorted(d["signature"].split(" ")[0] for d in pt.routing_report())
    assert names == ["conv2d_add_relu", "conv2d_bias_relu"], names
    assert all(d["winner"] == "torch" for d in pt.routing_report())
