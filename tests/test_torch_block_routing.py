"""pycudnn.torch's block routing without a GPU: a fused training block's signature names the
block, its tensors and its batch norm; the decision is taken once per signature (remembered by
the block and by the process, forgotten by clear_cache), only where routing can measure, from
a stored decision without a duel, and never on the caller's own modules (the model's running
statistics, gradients and parameters stay as they were); a fused node that fails on the copies
leaves the block fused and undecided. The duel's figures are routing's (its own tests); here the
fused node is the original modules' computation, so every side runs on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import block_routing, routing, training  # noqa: E402

nn = torch.nn


def _block(kind=training.ConvBnReLU2d, seed=0):
    torch.manual_seed(seed)
    return kind(nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))


def _plain_as_fused(block, x, w, cb, z):
    """A stand-in for the fused node on the CPU: the block's own modules (the copies' here)."""
    return block._plain(x, z)


@pytest.fixture
def duel(monkeypatch):
    """Routing able to measure; the duel replaced by one that runs each side twice and answers
    ``duel.answer``; no stored decision. ``duel.calls`` counts the duels."""
    class Duel:
        answer = False
        calls: list[str] = []

    d = Duel()
    d.calls = []

    def wins(signature, direction, ours, theirs, device, stream, flags, **kw):
        d.calls.append((signature, direction, kw.get("launches")))
        for _ in range(2):
            ours()
            theirs()
        return d.answer

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.setattr(routing, "should_measure", lambda *flags: True)
    monkeypatch.setattr(routing, "pycudnn_wins", wins)
    monkeypatch.setattr(routing, "prejudge", lambda *args: None)
    monkeypatch.setattr(block_routing, "caller_stream", lambda device: 0)
    block_routing.clear_cache()
    yield d
    block_routing.clear_cache()


def _x(n=2, seed=1):
    return torch.randn(n, 4, 6, 6, generator=torch.Generator().manual_seed(seed),
                       requires_grad=True)


def test_the_signature_names_the_block_its_tensors_and_batch_norm():
    b = _block()
    x, w = _x(), b.conv.weight
    sig = block_routing.block_signature(b, x, w, None)
    assert sig == ("conv_bn_relu x[2, 4, 6, 6] w[8, 4, 3, 3] float32 stride=(1, 1) "
                   "padding=(1, 1) dilation=(1, 1) groups=1 eps=1e-05")
    add = _block(training.ConvBnAddReLU2d)
    z = torch.zeros(2, 8, 6, 6)
    assert block_routing.block_signature(add, x, w, z).startswith("conv_bn_add_relu x[2, 4, 6, 6]")
    assert block_routing.block_signature(add, x, w, z).endswith(" add")
    assert block_routing.block_signature(b, _x(3), w, None) != sig


@pytest.mark.parametrize("why", ["no benchmark mode", "routing off", "a capture or flags"])
def test_nothing_is_decided_where_routing_cannot_measure(duel, monkeypatch, why):
    if why == "no benchmark mode":
        monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    elif why == "routing off":
        pt.set_routing("pycudnn")
    else:
        monkeypatch.setattr(routing, "should_measure", lambda *flags: False)
    try:
        b = _block()
        x = _x()
        assert block_routing.fused_keeps(b, x, b.conv.weight, None, None, _plain_as_fused)
    finally:
        pt.set_routing("auto")
    assert b._route is None and duel.calls == []  # decided once it can be measured


@pytest.mark.parametrize("answer", [False, True])
def test_one_duel_per_signature_remembered_by_block_and_process(duel, answer):
    duel.answer = answer
    b, other = _block(), _block(seed=1)
    x = _x()
    for _ in range(3):
        assert block_routing.fused_keeps(b, x, b.conv.weight, None, None,
                                         _plain_as_fused) is answer
    assert block_routing.fused_keeps(other, x, other.conv.weight, None, None,
                                     _plain_as_fused) is answer
    (sig, direction, launches), = duel.calls
    assert direction == "block" and sig.startswith("conv_bn_relu") and launches >= 24
    block_routing.fused_keeps(b, _x(3), b.conv.weight, None, None, _plain_as_fused)
    assert len(duel.calls) == 2  # another batch size is another signature
    pt.clear_cache()  # pycudnn.torch's: the block decisions too
    block_routing.fused_keeps(b, x, b.conv.weight, None, None, _plain_as_fused)
    assert len(duel.calls) == 3


def test_the_duel_runs_on_copies_of_the_modules(duel):
    b = _block(training.ConvBnAddReLU2d)
    b.bn.running_mean.fill_(0.25)
    state = {k: v.clone() for k, v in {**dict(b.conv.named_parameters()),
                                       **dict(b.bn.named_parameters()),
                                       **dict(b.bn.named_buffers())}.items()}
    x, z = _x(), torch.randn(2, 8, 6, 6, requires_grad=True)
    assert block_routing.fused_keeps(b, x, b.conv.weight, None, z, _plain_as_fused) is False
    for name, t in {**dict(b.conv.named_parameters()), **dict(b.bn.named_parameters()),
                    **dict(b.bn.named_buffers())}.items():
        assert torch.equal(t, state[name]), name
    assert all(p.grad is None for p in (*b.conv.parameters(), *b.bn.parameters()))
    assert x.grad is None and z.grad is None
    assert int(b.bn.num_batches_tracked) == 0


def test_a_stored_decision_needs_no_duel_nor_copies(duel, monkeypatch):
    monkeypatch.setattr(routing, "prejudge", lambda *args: "torch")
    monkeypatch.setattr(block_routing.copy, "deepcopy", lambda *a: pytest.fail("copied"))
    ran = []
    b = _block()
    assert block_routing.fused_keeps(b, _x(), b.conv.weight, None, None,
                                     lambda *a: ran.append(a)) is False
    assert duel.calls == [] and ran == []


def test_a_fused_node_that_fails_on_the_copies_leaves_the_block_fused_untimed(duel):
    tried = []

    def refused(*args):
        tried.append(1)
        raise RuntimeError("cuDNN refused these tensors")

    b = _block()
    x = _x()
    for _ in range(3):
        assert block_routing.fused_keeps(b, x, b.conv.weight, None, None, refused) is True
    assert duel.calls == [] and tried == [1]  # tried once, not on every call


def test_the_gradient_of_the_duel_draws_no_random_numbers(duel):
    b = _block()
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    block_routing.fused_keeps(b, _x(), b.conv.weight, None, None, _plain_as_fused)
    assert torch.equal(torch.rand(3), want)


def test_a_duel_inside_a_checkpointed_region_keeps_to_its_own_graph(duel):
    """The block's first call inside torch.utils.checkpoint (non-reentrant): the duel's backward
    must not unpack through the checkpoint's hooks (which would recompute the region, and the
    block's first call again, from inside it); the region's gradients are the plain model's."""
    from torch.utils.checkpoint import checkpoint

    b = _block()
    plain = _block()  # the same seed: the same modules
    x = _x()

    def region(t):
        assert block_routing.fused_keeps(b, t, b.conv.weight, None, None, _plain_as_fused) is False
        return b._plain(t, None)

    checkpoint(region, x, use_reentrant=False).sum().backward()
    xr = x.detach().requires_grad_(True)
    plain._plain(xr, None).sum().backward()
    assert len(duel.calls) == 1
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(b.conv.weight.grad, plain.conv.weight.grad)


def test_pytorchs_numerical_flags_are_part_of_the_process_decision(duel, monkeypatch):
    x = _x()
    first, second = _block(), _block()
    block_routing.fused_keeps(first, x, first.conv.weight, None, None, _plain_as_fused)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    block_routing.fused_keeps(second, x, second.conv.weight, None, None, _plain_as_fused)
    assert len(duel.calls) == 2  # the same signature, decided again for deterministic kernels
