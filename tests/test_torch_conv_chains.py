"""Batch norms fused into the convolutions (`fuse_for_training(model, into_convolutions=True)`)
on the CPU: which chains the rewrite takes, that the plain path is the model's own, and that the
fused autograd functions, run with the reference kernels (the graphs' arithmetic in PyTorch
operations), train like the plain model in float64: outputs, every gradient, the running
statistics, over several steps. cuDNN's graphs are checked against float64 apart
(test_graph_batchnorm_gpu.py), and the whole path on a GPU in test_torch_conv_chains_gpu.py."""

from __future__ import annotations

import copy
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import conv_chains as CC  # noqa: E402
from torch_models import SmallResNet, randomize_batchnorm  # noqa: E402


def kinds(model):
    return Counter(type(m).__name__ for m in model.modules()
                   if type(m).__module__.startswith("pycudnn.torch"))


def chain3(c: int = 6, stride: int = 1):
    """conv -> bn -> relu -> conv -> bn -> relu -> conv: one head, a middle, a tail."""
    return nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.Conv2d(c, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.Conv2d(c, 5, 1, bias=False))


def test_the_rewrite_takes_bn_relu_between_two_convolutions():
    model = pt.fuse_for_training(randomize_batchnorm(SmallResNet()), into_convolutions=True)
    # three bottlenecks: conv1 sums its output, conv2 reads through bn1 and sums, conv3 reads
    # through bn2; the stem (its ReLU feeds two modules), the downsamples and bn3 are not chains
    assert kinds(model) == {"ConvStats2d": 3, "BnReLUConv2d": 6, "ConvBn2d": 2,
                            "ConvBnReLU2d": 1, "ConvBnAddReLU2d": 1}
    assert kinds(pt.fuse_for_training(randomize_batchnorm(SmallResNet()))).get("ConvStats2d") is None


# the middle convolution is in both links, the first batch norm in the first only
@pytest.mark.parametrize("why,change,links", [
    ("grouped", lambda m: setattr(m, "3", nn.Conv2d(6, 6, 3, padding=1, groups=2, bias=False)),
     0),
    ("bias", lambda m: setattr(m, "3", nn.Conv2d(6, 6, 3, padding=1)), 0),
    ("string padding", lambda m: setattr(m, "3", nn.Conv2d(6, 6, 3, padding="same",
                                                           bias=False)), 0),
    ("cumulative momentum", lambda m: setattr(m[1], "momentum", None), 1),
    ("no running stats", lambda m: setattr(m, "1", nn.BatchNorm2d(6, track_running_stats=False)),
     1),
    ("hook", lambda m: m[1].register_forward_hook(lambda *a: None), 1),
])
def test_links_the_graphs_cannot_take_are_left_to_the_blocks(why, change, links):
    model = chain3()
    change(model)
    fused = pt.fuse_for_training(model, into_convolutions=True)
    assert kinds(fused).get("BnReLUConv2d", 0) == links, why


def test_the_plain_path_and_revert_are_the_model_itself():
    base = randomize_batchnorm(SmallResNet()).double().train()
    fused = pt.fuse_for_training(copy.deepcopy(base), into_convolutions=True)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    assert torch.equal(fused(x), base(x))  # on the CPU every chain runs the model's modules
    for a, b in zip(fused.state_dict().values(), base.state_dict().values()):
        assert torch.equal(a, b)
    assert list(fused.state_dict()) == list(base.state_dict())
    pt.revert(fused)
    assert not kinds(fused)
    assert torch.equal(fused(x), base(x))


def _steps(model, data, steps, kernels=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        if kernels is None:
            out = model(data[i])
        else:
            with CC.use_kernels(kernels):
                out = model(data[i])
        loss = (out.float() ** 2).mean() if out.dim() == 4 else out.square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("stride", [1, 2])
def test_fused_functions_train_like_the_model_in_float64(stride):
    torch.manual_seed(0)
    base = randomize_batchnorm(chain3(stride=stride)).double().train()
    fused = pt.fuse_for_training(copy.deepcopy(base), into_convolutions=True)
    assert kinds(fused) == {"ConvStats2d": 1, "BnReLUConv2d": 2}
    data = [torch.randn(4, 3, 9, 9, dtype=torch.float64) * 2 + 0.5 for _ in range(4)]
    ref = _steps(base, data, 4)
    got = _steps(fused, data, 4, CC.REFERENCE_KERNELS)
    assert got == pytest.approx(ref, rel=1e-9)
    for (name, a), b in zip(fused.state_dict().items(), base.state_dict().values()):
        assert torch.allclose(a.double(), b.double(), rtol=1e-8, atol=1e-10), name


class _RefusingBackward(CC.ReferenceKernels):
    """Kernels with no engine for a chain's backward graphs (as cuDNN has none in bf16)."""

    def __init__(self):
        self.fused_convolutions = 0

    def prepare_backward(self, x, w, g):
        raise CC.KernelRefused

    def conv_stats(self, *args):
        self.fused_convolutions += 1
        return super().conv_stats(*args)


class _RefusingWgradLate(CC.ReferenceKernels):
    """Kernels that prepared the backward but refuse the weight gradient's layout there."""

    calls = 0

    def sbr_wgrad(self, *args):
        type(self).calls += 1
        raise CC.KernelRefused


def _chain_and_steps(seed: int, steps: int):
    """A chain3 model, its fused copy, ``steps`` batches and the model's own losses on them."""
    torch.manual_seed(seed)
    base = randomize_batchnorm(chain3()).double().train()
    fused = pt.fuse_for_training(copy.deepcopy(base), into_convolutions=True)
    data = [torch.randn(4, 3, 9, 9, dtype=torch.float64) * 2 + 0.5 for _ in range(steps)]
    return base, fused, data, _steps(base, data, steps)


def test_a_chain_whose_backward_is_refused_trains_as_the_models_modules():
    base, fused, data, ref = _chain_and_steps(3, 3)
    kernels = _RefusingBackward()
    assert _steps(fused, data, 3, kernels) == ref  # exactly: the modules ran
    for (name, a), b in zip(fused.state_dict().items(), base.state_dict().values()):
        assert torch.equal(a, b), name  # running statistics updated once a step, not twice
    assert kernels.fused_convolutions == 3  # only the head's, which needs no backward graph
    with CC.use_kernels(kernels), torch.no_grad():
        fused(data[0])  # no gradient wanted: nothing to prepare, the whole chain runs fused
    assert kernels.fused_convolutions == 3 + 3


def test_a_refusal_in_the_backward_computes_that_piece_with_pytorch():
    _, fused, data, ref = _chain_and_steps(4, 2)
    assert _steps(fused, data, 2, _RefusingWgradLate()) == pytest.approx(ref, rel=1e-9)
    assert _RefusingWgradLate.calls == 2 * 2  # both BnReLUConv2d, both steps, and no error


def test_fused_functions_give_every_gradient_of_a_resnet_in_float64():
    torch.manual_seed(1)
    base = randomize_batchnorm(SmallResNet()).double().train()
    fused = pt.fuse_for_training(copy.deepcopy(base), into_convolutions=True)
    x = torch.randn(3, 3, 12, 12, dtype=torch.float64, requires_grad=True)
    xf = x.detach().clone().requires_grad_(True)
    base(x).square().sum().backward()
    with CC.use_kernels(CC.REFERENCE_KERNELS):
        fused(xf).square().sum().backward()
    assert torch.allclose(xf.grad, x.grad, rtol=1e-8, atol=1e-12)
    for (name, p), q in zip(fused.named_parameters(), base.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-8, atol=1e-12), name
    for (name, a), b in zip(fused.named_buffers(), base.buffers()):
        assert torch.equal(a, b) if a.dtype == torch.int64 else torch.allclose(a, b, rtol=1e-10), name


def test_double_backward_through_a_chain():
    torch.manual_seed(2)
    base = randomize_batchnorm(chain3()).double().train()
    fused = pt.fuse_for_training(copy.deepcopy(base), into_convolutions=True)
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64, requires_grad=True)
    xf = x.detach().clone().requires_grad_(True)
    g, = torch.autograd.grad(base(x).square().sum(), x, create_graph=True)
    with CC.use_kernels(CC.REFERENCE_KERNELS):
        gf, = torch.autograd.grad(fused(xf).square().sum(), xf, create_graph=True)
    assert torch.allclose(gf, g, rtol=1e-8)
    hh, = torch.autograd.grad(g.sum(), x)
    hf, = torch.autograd.grad(gf.sum(), xf)
    assert torch.allclose(hf, hh, rtol=1e-7, atol=1e-12)


def test_eval_mode_runs_the_plain_convolutions():
    base = randomize_batchnorm(chain3()).double().eval()
    fused = pt.fuse_for_training(copy.deepcopy(base), into_convolutions=True)
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    with CC.use_kernels(CC.REFERENCE_KERNELS):
        assert torch.equal(fused(x), base(x))
    assert torch.equal(fused[1].running_mean, base[1].running_mean)


def test_into_convolutions_must_be_a_bool():
    with pytest.raises(TypeError, match="into_convolutions must be a bool"):
        pt.fuse_for_training(chain3(), into_convolutions="yes")


def test_chain_modules_refuse_what_the_graphs_cannot_take():
    with pytest.raises(TypeError, match="groups=1, bias=False"):
        CC.ConvStats2d(nn.Conv2d(4, 4, 3, bias=True), nn.BatchNorm2d(4))
    with pytest.raises(TypeError, match="BatchNorm2d of 4 features"):
        CC.BnReLUConv2d(nn.BatchNorm2d(3), nn.Conv2d(4, 4, 3, bias=False), False)
