"""Small models for the pycudnn.torch tests (imported only where PyTorch is installed)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck (stride on the 3x3), in small."""

    def __init__(self, cin: int, width: int, stride: int = 1, downsample: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, width * 4, 1, stride, bias=False),
                                         nn.BatchNorm2d(width * 4)) if downsample else None)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class FunctionalBlock(nn.Module):
    """The other spellings: F.relu, torch.add, .relu(), a conv with bias and no BatchNorm."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.a(x))
        return torch.add(self.bn(self.b(y)), x).relu()


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(Bottleneck(16, 8, 1, True), Bottleneck(32, 8))
        self.layer2 = nn.Sequential(Bottleneck(32, 16, 2, True), FunctionalBlock(64))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Running statistics and affine parameters away from the identity, so folding matters."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 2 - 1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) - 0.5)
    return model


def training_references(base: nn.Module, train=None, steps: int = 5):
    """Three CUDA batches (16 images of 3x16x16, 10 classes) and two reference runs of
    ``train(model, batches, steps)`` (its losses; `sgd_steps` by default) from copies of
    ``base``: float64 with cuDNN off, and PyTorch's own bfloat16 channels_last. Returns (the batches in bfloat16
    channels_last, (float64 model, losses), (bfloat16 model, losses))."""
    import copy

    train = train or sgd_steps
    g = torch.Generator("cuda").manual_seed(2)
    data = [(torch.randn(16, 3, 16, 16, device="cuda", generator=g),
             torch.randint(0, 10, (16,), device="cuda", generator=g)) for _ in range(3)]
    bf16 = [(x.to(torch.bfloat16, memory_format=torch.channels_last), t) for x, t in data]
    with torch.backends.cudnn.flags(enabled=False):
        m64 = copy.deepcopy(base).double()
        l64 = train(m64, [(x.double(), t) for x, t in data], steps)
    mt = copy.deepcopy(base).to(torch.bfloat16, memory_format=torch.channels_last)
    return bf16, (m64, l64), (mt, train(mt, bf16, steps))


def sgd_steps(model: nn.Module, data, steps: int, compiled_step: bool = False,
              after_step=None) -> list[float]:
    """``steps`` SGD steps (lr 0.05, momentum 0.9, one optimizer) of ``model`` on ``data``'s
    (input, target) batches in turn, cross-entropy in float32; the losses. ``compiled_step``
    marks each step's start for torch.compile's reduce-overhead mode; ``after_step(i)`` is
    called after step ``i``."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for i in range(steps):
        x, t = data[i % len(data)]
        if compiled_step:
            torch.compiler.cudagraph_mark_step_begin()
        loss = F.cross_entropy(model(x).float(), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if after_step is not None:
            after_step(i)
    return losses


def cross_entropy_steps(model: nn.Module, data, dtype, steps: int = 20) -> list[float]:
    """``steps`` SGD steps (lr 0.05, momentum 0.9) of ``model`` on ``data``'s (input, target)
    batches in turn, the input cast to ``dtype``, cross-entropy in float64; the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for i in range(steps):
        x, t = data[i % len(data)]
        loss = F.cross_entropy(model(x.to(dtype)).double(), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def float64_bf16_fused(base: nn.Module, run, fuse, half: torch.dtype = torch.bfloat16):
    """``run(model, dtype)`` on three copies of ``base``: in float64 with cuDNN off (the
    reference), as PyTorch's own ``half`` (bfloat16 unless given) channels_last model, and as
    ``fuse`` of such a copy. Returns (reference result, PyTorch's ``half`` result, the fused
    result, the fused model)."""
    import copy

    cl = torch.channels_last
    with torch.backends.cudnn.flags(enabled=False):
        ref = run(copy.deepcopy(base).double(), torch.float64)
    plain = run(copy.deepcopy(base).to(half, memory_format=cl), half)
    fused = fuse(copy.deepcopy(base).to(half, memory_format=cl))
    return ref, plain, run(fused, half), fused
