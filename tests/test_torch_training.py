"""pycudnn.torch.fuse_for_training without a GPU: which chains the fx rewrite fuses, that the
fused model keeps the original's parameters, buffers and state_dict keys, that a call that does
not fit the fused kernels (here: CPU tensors) runs the original modules, and revert."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import calls, training  # noqa: E402
from torch_models import Bottleneck, SmallResNet, randomize_batchnorm  # noqa: E402

nn = torch.nn
F = torch.nn.functional


def _blocks(model):
    return [type(m).__name__ for m in model.modules() if isinstance(m, training.BLOCKS)]


def test_chains_of_a_resnet_become_blocks():
    model = SmallResNet()
    fused = pt.fuse_for_training(model)
    kinds = _blocks(fused)
    # stem conv-bn-relu; each bottleneck: two conv-bn-relu, conv3-bn3 + add + relu, the
    # shortcut's conv-bn; FunctionalBlock: its bias conv has no batch norm, conv-bn + add + relu
    assert kinds.count("ConvBnReLU2d") == 1 + 3 * 2
    assert kinds.count("ConvBnAddReLU2d") == 3 + 1
    assert kinds.count("ConvBn2d") == 2
    assert fused is model and isinstance(fused, SmallResNet)  # fused in place


def test_fused_model_keeps_parameters_and_state_dict_keys():
    model = randomize_batchnorm(SmallResNet())
    params = {id(p) for p in model.parameters()}
    keys = list(model.state_dict())
    fused = pt.fuse_for_training(model)
    assert {id(p) for p in fused.parameters()} == params
    assert sorted(fused.state_dict()) == sorted(keys)
    # loads both ways
    other = SmallResNet()
    other.load_state_dict(fused.state_dict())
    fused.load_state_dict(other.state_dict())
    for k, v in other.state_dict().items():
        assert torch.equal(v, fused.state_dict()[k]), k


@pytest.mark.parametrize("train", [True, False])
def test_cpu_calls_run_the_original_modules(train):
    torch.manual_seed(0)
    model = randomize_batchnorm(SmallResNet()).train(train)
    ref = copy.deepcopy(model)
    fused = pt.fuse_for_training(model)
    x = torch.randn(2, 3, 16, 16)
    y, y_ref = fused(x), ref(x)
    assert torch.equal(y, y_ref)
    y.sum().backward()
    y_ref.sum().backward()
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.grad, p_ref.grad), name
    for (name, b), b_ref in zip(model.named_buffers(), ref.buffers()):
        assert torch.equal(b, b_ref), name  # running statistics updated once, as the original's


def test_half_batchnorm_parameters_become_float32_in_place():
    model = Bottleneck(8, 4, downsample=True).to(torch.bfloat16)
    weight = model.bn1.weight
    pt.fuse_for_training(model)
    assert model.bn1.weight is weight and weight.dtype is torch.float32
    assert model.bn1.running_mean.dtype is torch.float32
    assert model.conv1.weight.dtype is torch.bfloat16  # the convolutions keep theirs


def test_revert_gives_the_plain_graph_back():
    torch.manual_seed(0)
    model = randomize_batchnorm(SmallResNet())
    ref = copy.deepcopy(model)
    fused = pt.fuse_for_training(model)
    pt.revert(fused)
    assert _blocks(fused) == []
    assert sorted(fused.state_dict()) == sorted(ref.state_dict())
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(fused(x), ref(x))


def test_deepcopy_of_a_fused_model_trains_its_own_parameters():
    fused = pt.fuse_for_training(SmallResNet())
    twin = copy.deepcopy(fused)
    block = next(m for m in twin.modules() if isinstance(m, pt.ConvBnReLU2d))
    registered = {id(m) for m in twin.modules()}
    assert id(block.conv) in registered and id(block.bn) in registered
    assert not {id(p) for p in twin.parameters()} & {id(p) for p in fused.parameters()}


def test_untraceable_model_is_fused_child_by_child():
    class Dynamic(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4),
                                   nn.ReLU())

        def forward(self, x):
            if x.sum() > 0:  # data-dependent: fx cannot trace it
                return self.a(x)
            return -self.a(x)

    model = Dynamic()
    fused = pt.fuse_for_training(model)
    assert fused is model and _blocks(model) == ["ConvBnReLU2d"]
    x = torch.randn(1, 3, 5, 5)
    assert torch.equal(fused(x), copy.deepcopy(model)(x))


def test_what_it_cannot_fuse_stays():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), nn.BatchNorm2d(4),
                          nn.ReLU(), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4, affine=False))
    fused = pt.fuse_for_training(model)
    assert fused is model and _blocks(model) == []


def test_fusing_twice_changes_nothing_more():
    fused = pt.fuse_for_training(SmallResNet())
    again = pt.fuse_for_training(fused)
    assert _blocks(again) == _blocks(fused)


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="fuse_for_training: expected a torch.nn.Module"):
        pt.fuse_for_training("resnet")
    with pytest.raises(TypeError, match="expected bn to be a torch.nn.BatchNorm2d"):
        pt.ConvBnReLU2d(nn.Conv2d(3, 4, 1), nn.LayerNorm(4))
    with pytest.raises(ValueError, match="4 output channels but the batch norm 5 features"):
        pt.ConvBn2d(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(5))


class _WithHead(nn.Module):
    """A head used by another method than forward, and a non-persistent buffer."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 3)
        self.register_buffer("scale", torch.tensor(2.0), persistent=False)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) * self.scale

    def classify(self, features):
        return self.head(features)


def test_state_dict_keeps_unused_submodules_and_buffer_persistence():
    torch.manual_seed(0)
    model = randomize_batchnorm(_WithHead())
    keys = list(model.state_dict())
    fused = pt.fuse_for_training(model)
    assert _blocks(fused) == ["ConvBnReLU2d"]
    assert fused is model and isinstance(fused, _WithHead)
    assert list(fused.state_dict()) == keys  # head.* kept, the non-persistent scale left out
    assert "scale" in dict(fused.named_buffers()) and "scale" not in fused.state_dict()
    # strict loads, both ways, and the values land
    other = randomize_batchnorm(_WithHead())
    other.load_state_dict(fused.state_dict())
    for k, v in fused.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    twin = randomize_batchnorm(_WithHead())
    fused.load_state_dict(twin.state_dict())
    for k, v in twin.state_dict().items():
        assert torch.equal(fused.state_dict()[k], v), k
    # the method and the buffer still work; .to() moves the buffer forward reads
    assert fused.classify(torch.ones(2, 8)).shape == (2, 3)
    fused.double()
    assert fused.scale.dtype is torch.float64
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    assert torch.equal(fused.eval()(x), copy.deepcopy(twin).double().eval()(x))


def test_a_traced_graph_module_is_fused_in_place_with_its_state_dict():
    model = randomize_batchnorm(SmallResNet())
    gm = torch.fx.symbolic_trace(model)
    keys = list(gm.state_dict())
    fused = pt.fuse_for_training(gm)
    assert fused is gm and list(fused.state_dict()) == keys
    assert _blocks(fused)


def test_pickle_stores_the_unfused_class_and_deepcopy_stays_fused():
    import pickle

    torch.manual_seed(0)
    fused = pt.fuse_for_training(randomize_batchnorm(_WithHead()))
    x = torch.randn(2, 4, 5, 5)
    want = fused.eval()(x)
    loaded = pickle.loads(pickle.dumps(fused))
    assert type(loaded) is _WithHead
    assert list(loaded.state_dict()) == list(fused.state_dict())
    assert torch.equal(loaded.eval()(x), want)
    again = pt.fuse_for_training(loaded)  # the stale block's name is taken back
    assert [n for n, m in again.named_modules() if isinstance(m, training.BLOCKS)] == \
        ["conv_bn_relu"]
    assert torch.equal(again(x), want)
    twin = copy.deepcopy(fused)
    assert type(twin) is type(fused) and _blocks(twin) == ["ConvBnReLU2d"]
    assert torch.equal(twin(x), want)


def test_revert_gives_the_class_back_and_drops_the_blocks():
    model = _WithHead()
    keys = list(model.state_dict())
    pt.fuse_for_training(model)
    pt.revert(model)
    assert type(model) is _WithHead and _blocks(model) == []
    assert list(model.state_dict()) == keys


def test_one_value_per_channel_is_refused_as_pytorch_does():
    """The fused path's check, before the convolution runs, against nn.BatchNorm2d's refusal of
    the same convolution output (the reference): the same geometries refused, the same text."""
    torch.manual_seed(0)
    cases = [((1, 3, 3, 3), 3, 1, 0, 1), ((1, 3, 5, 5), 3, 2, 0, 2), ((1, 3, 1, 1), 1, 1, 0, 1),
             ((1, 3, 4, 4), 3, 3, 1, 1), ((1, 3, 3, 3), 3, 1, 1, 1), ((1, 3, 1, 2), 1, 1, 0, 1),
             ((2, 3, 3, 3), 3, 1, 0, 1), ((1, 3, 6, 6), 3, 1, 0, 2)]
    for shape, k, stride, padding, dilation in cases:
        conv = nn.Conv2d(3, 4, k, stride, padding, dilation, bias=False)
        x = torch.randn(shape)
        try:
            F.batch_norm(conv(x), None, None, training=True)
            want = None
        except ValueError as exc:
            want = str(exc)
        block = pt.ConvBnReLU2d(conv, nn.BatchNorm2d(4))
        try:
            training.check_values_per_channel(x, conv.weight, block.geometry[0])
            got = None
        except ValueError as exc:
            got = str(exc)
        assert got == want, (shape, k, stride, padding, dilation)
    assert want is None and any(c[0][0] == 1 for c in cases)


# ---- the autograd function, its cuDNN calls stood in for ---------------------------------------

class _FakeRuntime:
    """The current device of a made-up two-device machine, in place of the driver's."""

    def __init__(self):
        self.current = 0

    def current_device(self):
        return self.current

    def set_device(self, device):
        self.current = device


class _FakeLayout:
    """What the fused batch norm's descriptors give the autograd function; the C calls record
    their arguments and write nothing (the values are checked on a GPU)."""

    def __init__(self, channels, ops):
        self.ops, self.channels = ops, channels
        self.fwd_ws = self.bwd_ws = self.reserve = 0
        self.stats_bytes = self.saved_bytes = 256
        self.xd = self.pd = self.one = self.zero = self.act = None
        self.x_desc = "x"
        self.calls = []

    def forward(self, *args):
        self.calls.append("forward")
        return 0

    def backward(self, *args):
        self.calls.append(("backward", args[19]))  # bnBiasData
        return 0


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """training._apply runnable on the CPU: the convolution by F.conv2d (channels-last output),
    the cuDNN batch-norm calls by `_FakeLayout`, and a get_handle that makes device 1 current on
    a made-up two-device runtime, as the real one does for tensors on cuda:1. Returns the
    runtime and the layouts made."""
    from pycudnn.runtime.memory import devices

    rt = _FakeRuntime()
    monkeypatch.setattr(devices, "current_device", rt.current_device)
    monkeypatch.setattr(devices, "set_device", rt.set_device)
    monkeypatch.setattr(devices, "visible_devices", 2)
    monkeypatch.setattr(calls, "_multi_gpu", True)
    layouts = []

    def run_forward(op, x, w, b, z, alpha, geom):
        return F.conv2d(x, w, b, *geom).contiguous(memory_format=torch.channels_last), x, w, \
            torch.channels_last, None

    def layout(c, ops):
        layouts.append(_FakeLayout(c.shape[1], ops))
        return layouts[-1]

    def get_handle(device, stream):
        devices.ensure_device(1)
        return 0

    def run_backward(dc, x, w, fmt, geom, need_x, need_w):
        return (torch.zeros_like(x) if need_x else None, torch.zeros_like(w) if need_w else None,
                None)

    monkeypatch.setattr(training, "run_forward", run_forward)
    monkeypatch.setattr(training, "bn_layout", layout)
    monkeypatch.setattr(training, "get_handle", get_handle)
    monkeypatch.setattr(training, "caller_stream", lambda device: 0)
    monkeypatch.setattr(training, "run_backward", run_backward)
    return rt, layouts


def _add_relu_inputs():
    torch.manual_seed(0)
    block = pt.ConvBnAddReLU2d(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))
    x = torch.randn(2, 4, 5, 5).contiguous(memory_format=torch.channels_last).requires_grad_()
    z0 = torch.randn(2, 4, 5, 5, requires_grad=True)
    z = (z0 * 1.0).contiguous(memory_format=torch.channels_last)
    return block, x, z0, z


def test_a_fused_block_gives_the_callers_device_back(fused_on_cpu):
    rt, layouts = fused_on_cpu
    block, x, _, z = _add_relu_inputs()
    conv, bn = block.conv, block.bn
    y = training.apply_block(x, conv.weight, conv.bias, bn.weight, bn.bias, z, block)
    assert layouts[0].calls == ["forward"]  # the handle was taken, on device 1
    assert rt.current == 0
    y.sum().backward()
    assert layouts[0].calls[1][0] == "backward"
    assert rt.current == 0


def test_a_fused_block_saves_neither_the_shortcut_nor_the_conv_bias(fused_on_cpu):
    block, x, z0, z = _add_relu_inputs()
    conv, bn = block.conv, block.bn
    y = training.apply_block(x, conv.weight, conv.bias, bn.weight, bn.bias, z, block)
    saved = {id(t) for t in y.grad_fn.saved_tensors if t is not None}
    assert id(z) not in saved and id(conv.bias) not in saved
    z.mul_(0.5)  # changed in place after the block, as the unfused model allows
    conv.bias.data.add_(1.0)
    y.sum().backward()
    assert z0.grad is not None and conv.bias.grad is not None


def test_a_plain_conv_bn_block_does_not_save_the_shift(fused_on_cpu):
    _, layouts = fused_on_cpu
    torch.manual_seed(0)
    block = pt.ConvBn2d(nn.Conv2d(4, 4, 1, bias=False), nn.BatchNorm2d(4))
    x = torch.randn(2, 4, 3, 3).contiguous(memory_format=torch.channels_last)
    y = training.apply_block(x, block.conv.weight, None, block.bn.weight, block.bn.bias, None, block)
    with torch.no_grad():
        block.bn.bias.add_(1.0)  # an optimizer step between forward and backward
    y.sum().backward()
    assert layouts[0].calls[1] == ("backward", None)  # cuDNN reads the shift only with a ReLU
    assert block.bn.bias.grad is not None


def test_the_differentiable_backward_needs_no_shortcut():
    """create_graph=True's recomputation against PyTorch's own autograd of the unfused block in
    float64, first and second derivatives, with z changed in place after the forward."""
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(3, 4, 3, padding=1).double(), nn.BatchNorm2d(4).double()
    block = pt.ConvBnAddReLU2d(conv, bn)
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    z = torch.randn(2, 4, 5, 5, dtype=torch.float64, requires_grad=True)
    params = (x, conv.weight, conv.bias, bn.weight, bn.bias)
    ref_y = torch.relu(F.batch_norm(conv(x), None, None, bn.weight, bn.bias, True, 0.0, bn.eps) + z)
    gy = torch.randn_like(ref_y, requires_grad=True)
    want = torch.autograd.grad(ref_y, (*params, z), gy, create_graph=True)
    y = ref_y.detach()
    z.data.mul_(0.5)  # the recomputation must not read z
    got = training.recomputed_backward(block, gy, y, params, (True,) * 6 + (False,), True)
    for name, a, b in zip(("x", "w", "cb", "gamma", "beta", "z"), got, want):
        assert torch.allclose(a, b, atol=1e-10), name
    # second order: d/dw of |grad_x|^2, and d/dgy of grad_z
    a = torch.autograd.grad(got[0].pow(2).sum(), (conv.weight, gy), retain_graph=True)
    b = torch.autograd.grad(want[0].pow(2).sum(), (conv.weight, gy), retain_graph=True)
    for u, v in zip(a, b):
        assert torch.allclose(u, v, atol=1e-9)
