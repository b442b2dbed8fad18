"""pycudnn.torch's block routing on a GPU: in benchmark mode each fused training block's first
call times the block fused against its original modules (forward and backward) and runs the
faster from then on. Whichever way the blocks go, a bfloat16 fused model trains as near a
float64 run (cuDNN off) as PyTorch's own bfloat16 run does, its running statistics counted once
per step (the duel runs on copies), and the decisions are reported once per block signature."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # a CPU build of PyTorch on a GPU machine
    pytest.skip("PyTorch has no CUDA here", allow_module_level=True)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import block_routing, routing, training  # noqa: E402
from pycudnn.tuning import routes as route_store  # noqa: E402
from torch_models import SmallResNet, randomize_batchnorm, sgd_steps, training_references  # noqa: E402

F = torch.nn.functional
DEV = torch.device("cuda", 0)
CL = torch.channels_last
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _benchmark_mode():
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    pt.set_routing("auto")
    pt.clear_cache()
    routing.clear_report()
    route_store.clear()  # each test decides afresh
    yield
    (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
     torch.backends.cuda.matmul.allow_tf32) = saved
    pt.clear_cache()
    routing.clear_report()
    route_store.clear()


def rel(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("forced", ["measured", "modules", "fused"])
def test_a_routed_fused_model_trains_as_near_float64_as_pytorch(forced, monkeypatch):
    real = routing.pycudnn_wins

    def wins(signature, direction, *args, **kw):
        if direction == "block" and forced != "measured":
            return forced == "fused"
        return real(signature, direction, *args, **kw)

    monkeypatch.setattr(routing, "pycudnn_wins", wins)
    torch.manual_seed(0)
    base = randomize_batchnorm(SmallResNet()).to(DEV)
    fused = pt.fuse_for_training(pt.convert(copy.deepcopy(base).to(BF16, memory_format=CL)))
    bf16, (m64, l64), (mt, lt) = training_references(base)

    launched = []
    apply_block = training.apply_block
    monkeypatch.setattr(training, "apply_block", lambda *a: (launched.append(1), apply_block(*a))[1])
    # the first step's duels run the fused node on copies: launches counted from the second.
    # One optimizer over the five steps, as the references' (momentum carries across steps)
    lf = sgd_steps(fused, bf16, 5, after_step=lambda i: launched.clear() if i == 0 else None)

    worst = max(abs(a - b) for a, b in zip(lt, l64))
    assert max(abs(a - b) for a, b in zip(lf, l64)) <= 3 * worst + 0.02, (lf, lt, l64)
    ref, theirs = dict(m64.named_buffers()), dict(mt.named_buffers())
    for name, b in fused.named_buffers():
        if b.is_floating_point():
            assert rel(b, ref[name]) <= 3 * rel(theirs[name], ref[name]) + 1e-3, name
        else:
            assert int(b) == int(ref[name]) == 5, name  # num_batches_tracked: no duel counted

    if forced == "modules":
        assert launched == []  # every block as its original modules
    elif forced == "fused":
        assert len(launched) == 4 * 13  # SmallResNet's 13 blocks a step, each fused
    else:
        blocks = [d for d in pt.routing_report() if d["direction"] == "block"]
        signatures = [d["signature"] for d in blocks]
        assert blocks and len(signatures) == len(set(signatures)), signatures
        for d in blocks:
            assert d["torch_gpu_us"] > 0 and d["reason"], d
            assert d["pycudnn_gpu_us"] > 0 or "not searched" in d["reason"], d
        kept = sum(d["winner"] == "pycudnn" for d in blocks)
        assert (kept == 0) == (launched == []), (kept, len(launched))


def test_a_later_process_takes_the_stored_block_decisions():
    torch.manual_seed(0)
    model = pt.fuse_for_training(pt.convert(
        randomize_batchnorm(SmallResNet()).to(DEV).to(BF16, memory_format=CL)))
    x = torch.randn(8, 3, 16, 16, device=DEV).to(BF16, memory_format=CL)
    model(x).float().sum().backward()
    first = {d["signature"]: d["winner"] for d in pt.routing_report() if d["direction"] == "block"}
    assert first
    pt.clear_cache()  # what a new process knows: the stored decisions only
    routing.clear_report()
    block_routing.clear_cache()
    model(x).float().sum().backward()
    again = [d for d in pt.routing_report() if d["direction"] == "block"]
    assert {d["signature"]: d["winner"] for d in again} == first
    assert all(d["reason"].startswith("stored: ") for d in again)
