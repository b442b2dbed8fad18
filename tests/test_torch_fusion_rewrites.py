"""Both fusion passes (fuse_for_training, fuse_for_inference) on the CPU: what they must leave
unfused so that the fused model computes what the original does. In-place adds into the
shortcut, in-place changes between the convolution and the end of the chain, and modules with
hooks (prune, weight_norm, spectral_norm, forward hooks). The reference is always the original
model run eagerly."""

from __future__ import annotations

import copy
import operator

import pytest

torch = pytest.importorskip("torch")

from torch.nn.utils import prune  # noqa: E402

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import training, training_rewrite  # noqa: E402

nn = torch.nn
F = torch.nn.functional


def _training_blocks(model):
    return sorted(type(m).__name__ for m in model.modules() if isinstance(m, training.BLOCKS))


def _inference_blocks(model):
    return sorted(("residual" if m.residual else "relu" if m.relu else "conv")
                  for m in model.modules() if isinstance(m, pt.FusedConv2d))


def _both(model_fn, x):
    """(training blocks, inference blocks, worst |fused - original| of the two passes) for a
    fresh model of ``model_fn`` each; the training pass runs in training mode, on the CPU (the
    plain modules: the rewrite alone decides the result), under no_grad like a statistics pass."""
    out = []
    worst = 0.0
    with torch.no_grad():
        for fuse, mode, kinds in ((pt.fuse_for_training, True, _training_blocks),
                                  (pt.fuse_for_inference, False, _inference_blocks)):
            torch.manual_seed(0)
            m = model_fn().train(mode)
            ref = copy.deepcopy(m)
            want = ref(x.clone())
            fused = fuse(m)
            got = fused(x.clone())
            worst = max(worst, float((got - want).abs().max()))
            out.append(kinds(fused))
    return out[0], out[1], worst


class _Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)


class AddIntoShortcut(_Chain):
    def forward(self, x):
        z = x * 1.0
        keep = z                      # an alias of z sees the in-place add
        z += self.bn(self.conv(x))
        return torch.relu(z) + keep


class AddUnderscoreIntoShortcut(_Chain):
    def forward(self, x):
        z = x * 1.0
        keep = z
        return torch.relu(z.add_(self.bn(self.conv(x)))) + keep


class AddIntoBatchNormOutput(_Chain):
    def forward(self, x):
        y = self.bn(self.conv(x))
        y += x                        # into the batch norm's output, which nothing else holds
        return torch.relu(y)


class InputChangedBeforeReLU(_Chain):
    def forward(self, x):
        x = x * 1.0
        y = self.bn(self.conv(x))     # the convolution reads x here
        x.relu_()                     # then x changes in place, before the ReLU
        return torch.relu(y + x)


class InputChangedBeforeBatchNorm(_Chain):
    def forward(self, x):
        x = x * 1.0
        c = self.conv(x)
        x.mul_(2.0)                   # between the convolution and its batch norm
        return self.bn(c) + x


class ShortcutChangedByModule(_Chain):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU6(inplace=True)

    def forward(self, x):
        z = x * 1.0
        y = self.bn(self.conv(x))
        self.act(z)                   # changes z in place (inplace=True module) before the add
        return torch.relu(y + z) + z


class ShortcutChangedByFunction(_Chain):
    def forward(self, x):
        z = x * 1.0
        y = self.bn(self.conv(x))
        F.hardtanh(z, -0.5, 0.5, True)  # inplace given by position
        return torch.relu(y + z)


def test_an_in_place_add_into_the_shortcut_is_not_fused():
    x = torch.randn(2, 4, 6, 6)
    for cls in (AddIntoShortcut, AddUnderscoreIntoShortcut):
        train, infer, worst = _both(cls, x)
        assert train == ["ConvBn2d"], cls.__name__
        assert infer == ["conv"], cls.__name__  # the batch norm folded, the add left
        assert worst < 1e-5, cls.__name__


def test_an_in_place_add_into_the_batch_norm_output_is_fused():
    train, infer, worst = _both(AddIntoBatchNormOutput, torch.randn(2, 4, 6, 6))
    assert train == ["ConvBnAddReLU2d"] and infer == ["residual"]
    assert worst < 1e-5


@pytest.mark.parametrize("cls", [InputChangedBeforeReLU, ShortcutChangedByModule,
                                 ShortcutChangedByFunction])
def test_an_in_place_change_before_the_relu_keeps_the_add_and_relu_apart(cls):
    train, infer, worst = _both(cls, torch.randn(2, 4, 6, 6))
    assert train == ["ConvBn2d"] and infer == ["conv"]
    assert worst < 1e-5


def test_an_in_place_change_before_the_batch_norm_fuses_nothing():
    train, infer, worst = _both(InputChangedBeforeBatchNorm, torch.randn(2, 4, 6, 6))
    assert train == [] and infer == []
    assert worst < 1e-5


def test_augmented_assignments_are_traced_in_place():
    class M(nn.Module):
        def forward(self, x):
            z = x * 1.0
            keep = z
            z *= 3.0
            z -= 1.0
            return keep

    gm = torch.fx.GraphModule(M(), training_rewrite.fx_tracer().trace(M()))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert operator.imul in targets and operator.isub in targets
    x = torch.randn(3)
    assert torch.equal(gm(x), M()(x))  # fx's own tracer records z * 3.0, and keep stays x


@pytest.mark.parametrize("op,target,args,kwargs,mutates", [
    ("call_method", "relu_", (), {}, True), ("call_method", "relu", (), {}, False),
    ("call_method", "__setitem__", (0, 1.0), {}, True),
    ("call_function", operator.iadd, (1,), {}, True),
    ("call_function", operator.setitem, (0, 1.0), {}, True),
    ("call_function", operator.add, (1,), {}, False),
    ("call_function", F.relu, (True,), {}, True), ("call_function", F.relu, (), {}, False),
    ("call_function", F.relu, (), {"inplace": True}, True),
    ("call_function", F.hardtanh, (-1.0, 1.0, True), {}, True),
    ("call_function", torch.relu_, (), {}, True),
    ("call_function", torch.add, (1,), {"out": "x"}, True)])
def test_may_mutate_recognises_in_place_steps(op, target, args, kwargs, mutates):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    kwargs = {k: x if v == "x" else v for k, v in kwargs.items()}
    node = graph.create_node(op, target, (x, *args), kwargs)
    assert training_rewrite.may_mutate(node, {}) is mutates


def test_an_in_place_module_is_a_mutation():
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.ReLU(inplace=True), nn.ReLU()))
    modules = dict(gm.named_modules())
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    assert [training_rewrite.may_mutate(n, modules) for n in calls] == [True, False]


# ---- hooks ------------------------------------------------------------------------------------

def _block():
    return nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())


def _hooked(where):
    def make():
        m = _block()
        if where == "bn forward hook":
            m[1].register_forward_hook(lambda mod, inp, out: out * 0.5 + 1.0)
        elif where == "conv forward pre-hook":
            m[0].register_forward_pre_hook(lambda mod, inp: (inp[0] * 2.0,))
        elif where == "conv forward hook":
            m[0].register_forward_hook(lambda mod, inp, out: out - 1.0)
        elif where == "prune":
            prune.l1_unstructured(m[0], "weight", amount=0.5)
        elif where == "weight_norm":
            torch.nn.utils.weight_norm(m[0])
        elif where == "spectral_norm":
            torch.nn.utils.spectral_norm(m[0])
        return m
    return make


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the old weight_norm is deprecated
@pytest.mark.parametrize("where", ["bn forward hook", "conv forward pre-hook",
                                   "conv forward hook", "prune", "weight_norm", "spectral_norm"])
def test_modules_with_hooks_are_not_fused(where):
    train, infer, worst = _both(_hooked(where), torch.randn(2, 4, 6, 6))
    assert train == [] and infer == [], where
    assert worst < 1e-5, where


def test_a_hooked_relu_module_stays_and_the_rest_is_fused():
    def make():
        m = _block()
        m[2].register_forward_hook(lambda mod, inp, out: out + 3.0)
        return m

    train, infer, worst = _both(make, torch.randn(2, 4, 6, 6))
    assert train == ["ConvBn2d"] and infer == ["conv"]
    assert worst < 1e-5


def test_hooks_are_read_from_the_modules_when_a_block_runs():
    block = pt.ConvBnReLU2d(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
    assert not training.has_hooks(block.conv)
    handle = block.bn.register_forward_hook(lambda *a: None)
    assert training.has_hooks(block.bn)
    handle.remove()
    block.conv.register_full_backward_hook(lambda *a: None)
    assert training.has_hooks(block.conv)
