"""pycudnn.torch.fuse_for_training without a GPU: which chains the fx rewrite fuses, that the
fused model keeps the original's parameters, buffers and state_dict keys, that a call that does
not fit the fused kernels (here: CPU tensors) runs the original modules, and revert."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import training  # noqa: E402
from torch_models import Bottleneck, SmallResNet, randomize_batchnorm  # noqa: E402

nn = torch.nn
F = torch.nn.functional


def _blocks(model):
    return [type(m).__name__ for m in model.modules() if isinstance(m, training._BLOCKS)]


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
    assert [n for n, m in again.named_modules() if isinstance(m, training._BLOCKS)] == \
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
