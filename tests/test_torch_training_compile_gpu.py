"""fuse_for_training's blocks under torch.compile and torch.export on a GPU: the operators
pycudnn::batch_norm_train and its backward through cuDNN's fused kernels against float64 (within
a bound set by PyTorch's own bfloat16 distance) and opcheck; a compiled bfloat16 fused model
(inductor, and mode="reduce-overhead") has the operators in its graph without a graph break,
runs cuDNN's fused batch norm forward and backward, and trains as near a float64 run as
PyTorch's bfloat16 run does; torch.export keeps the operators."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # a CPU build of PyTorch on a GPU machine
    pytest.skip("PyTorch has no CUDA here", allow_module_level=True)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import library, training  # noqa: E402
from torch_models import SmallResNet, randomize_batchnorm, sgd_steps, training_references  # noqa: E402

if not library.AVAILABLE:
    pytest.skip("PyTorch before 2.4: no torch.library.custom_op", allow_module_level=True)

nn = torch.nn
F = torch.nn.functional
DEV = torch.device("cuda", 0)
CL = torch.channels_last
BF16 = torch.bfloat16
ops = torch.ops.pycudnn
KINDS = {"bn": training.OPS_BN, "relu": training.OPS_RELU, "add_relu": training.OPS_ADD_RELU}


@pytest.fixture(autouse=True)
def _strict_flags_and_fresh_dynamo():
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.benchmark)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    traced = pt.traced_blocks()
    pt.set_traced_blocks("operators")  # what most tests here check; the default is "modules"
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    pt.set_traced_blocks(traced)
    (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
     torch.backends.cudnn.benchmark) = saved


def rel(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _reserve(shape, kind):
    n = training.reserve_size_for((tuple(shape), "bfloat16", 0, KINDS[kind]))
    assert n >= 0, "cuDNN refused the fused batch norm's layout"
    return n


def _batch_norm(x, w, b, z, relu, eps=1e-5):
    y = F.batch_norm(x, None, None, w, b, True, 0.0, eps)
    if z is not None:
        y = y + z
    return torch.relu(y) if relu else y


@pytest.mark.parametrize("kind", ["bn", "relu", "add_relu"])
def test_operators_through_cudnn_match_float64(kind):
    """Output, statistics and the gradients of input, weight, bias and z against float64
    (cuDNN off), within 3x PyTorch's own bfloat16 distance."""
    g = torch.Generator(DEV).manual_seed(0)
    shape = (8, 16, 12, 12)
    x64 = torch.randn(shape, device=DEV, dtype=torch.float64, generator=g) * 2 + 0.5
    w64 = torch.rand(16, device=DEV, dtype=torch.float64, generator=g) + 0.5
    b64 = torch.rand(16, device=DEV, dtype=torch.float64, generator=g) - 0.5
    z64 = torch.randn(shape, device=DEV, dtype=torch.float64, generator=g) \
        if kind == "add_relu" else None
    gy = torch.randn(shape, device=DEV, dtype=torch.float64, generator=g)
    relu = kind != "bn"

    def grads(fn, x, w, b, z):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
        zz = None if z is None else z.detach().clone().requires_grad_()
        y = fn(*leaves, zz)
        got = torch.autograd.grad(y, leaves + ([zz] if zz is not None else []), gy.to(y.dtype))
        return [y, *got]

    with torch.backends.cudnn.flags(enabled=False):
        want = grads(lambda x, w, b, z: _batch_norm(x, w, b, z, relu), x64, w64, b64, z64)
    xb = x64.to(BF16).contiguous(memory_format=CL)
    zb = None if z64 is None else z64.to(BF16).contiguous(memory_format=CL)
    w32, b32 = w64.float(), b64.float()
    theirs = grads(lambda x, w, b, z: _batch_norm(x, w, b, z, relu), xb, w32, b32, zb)
    rs = _reserve(shape, kind)
    ours = grads(lambda x, w, b, z: ops.batch_norm_train(x, w, b, z, relu, 1e-5, rs)[0], xb, w32,
                 b32, zb)
    for name, o, t, r in zip(("y", "x", "weight", "bias", "z"), ours, theirs, want):
        assert rel(o, r) <= 3 * rel(t, r) + 1e-3, (name, rel(o, r), rel(t, r))
    _, mean, invstd, reserve = ops.batch_norm_train(xb, w32, b32, zb, relu, 1e-5, rs)
    x = xb.double()
    assert rel(mean, x.mean((0, 2, 3))) < 1e-5
    assert rel(invstd, (x.var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()) < 1e-4
    assert reserve.numel() == rs


def test_opcheck_passes_on_both_operators_through_cudnn_and_pytorch():
    g = torch.Generator(DEV).manual_seed(1)
    shape = (4, 8, 6, 5)

    def r(*s, dtype=BF16, fmt=torch.contiguous_format):
        return torch.randn(*s, device=DEV, generator=g).to(dtype).contiguous(memory_format=fmt)

    for fmt in (CL, torch.contiguous_format):  # NCHW: the CUDA implementation copies it
        x, z = r(*shape, fmt=fmt).requires_grad_(), r(*shape, fmt=fmt).requires_grad_()
        w = (r(8, dtype=torch.float32) + 2).requires_grad_()
        b = r(8, dtype=torch.float32).requires_grad_()
        x64 = x.detach().double().requires_grad_()
        w64, b64 = w.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        for kind in KINDS:
            relu, zz = kind != "bn", z if kind == "add_relu" else None
            for args in ((x, w, b, zz, relu, 1e-5, _reserve(shape, kind)),
                         (x64, w64, b64, None if zz is None else zz.detach().double(), relu,
                          1e-5, -1)):
                # the reserve is cuDNN's opaque scratch for the backward: its bytes may differ
                # between two runs of the same forward, so the cuDNN path skips the check that
                # compares a compiled run's outputs with an eager one's bit for bit
                if args[6] >= 0:
                    torch.library.opcheck(ops.batch_norm_train.default, args, test_utils=(
                        "test_schema", "test_autograd_registration", "test_faketensor"))
                else:
                    torch.library.opcheck(ops.batch_norm_train.default, args)
                y, mean, invstd, reserve = ops.batch_norm_train(*args)
                back = (torch.randn_like(y), args[0].detach(), y.detach() if relu else None,
                        args[1].detach(), args[2].detach() if relu else None, mean, invstd,
                        reserve, relu, zz is not None, 1e-5, args[6])
                torch.library.opcheck(ops.batch_norm_train_backward.default, back)


def _bf16_fused(seed=0):
    torch.manual_seed(seed)
    base = randomize_batchnorm(SmallResNet()).to(DEV)
    fused = pt.fuse_for_training(copy.deepcopy(base).to(BF16, memory_format=CL))
    return base, fused


def _explain(model, x):
    e = torch._dynamo.explain(model)(x)
    found: dict[str, int] = {}
    for gm in e.graphs:
        for n in gm.graph.nodes:
            if n.op == "call_function" and str(n.target).startswith("pycudnn."):
                found[str(n.target)] = found.get(str(n.target), 0) + 1
    return e.graph_break_count, e.graph_count, found, e.break_reasons


def test_dynamo_traces_a_bf16_fused_model_with_the_fused_batch_norm():
    base, fused = _bf16_fused()
    x = torch.randn(8, 3, 16, 16, device=DEV).to(BF16, memory_format=CL)
    breaks, graphs, found, why = _explain(copy.deepcopy(fused), x)
    assert (breaks, graphs) == (0, 1), why
    assert found.get("pycudnn.batch_norm_train") == 13, found
    # a float32 model under autocast: cast as eager calls cast, then fused too
    model = pt.fuse_for_training(copy.deepcopy(base).to(memory_format=CL))
    with torch.autocast("cuda", dtype=BF16):
        breaks, graphs, found, why = _explain(model, x.float())
    assert (breaks, graphs) == (0, 1), why
    assert found.get("pycudnn.batch_norm_train") == 13, found


@pytest.mark.parametrize("traced", ["operators", "modules"])
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_fused_model_trains_as_near_float64_as_pytorch(mode, traced):
    """Five SGD steps: the compiled fused model's losses and running statistics stay as near a
    float64 run (cuDNN off) as PyTorch's eager bfloat16 run does (3x its distance); under
    reduce-overhead no CUDA graph is skipped. Both ways of tracing the blocks."""
    from torch._dynamo.utils import counters

    pt.set_traced_blocks(traced)
    base, fused = _bf16_fused()
    bf16, (m64, l64), (mt, lt) = training_references(base)
    counters.clear()
    compiled = torch.compile(fused, mode=mode)
    lc = sgd_steps(compiled, bf16, 5, compiled_step=mode == "reduce-overhead")
    if mode == "reduce-overhead":
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    worst_torch = max(abs(a - b) for a, b in zip(lt, l64))
    assert max(abs(a - b) for a, b in zip(lc, l64)) <= 3 * worst_torch + 0.02, (lc, lt, l64)
    ref = dict(m64.named_buffers())
    theirs = dict(mt.named_buffers())
    for name, b in fused.named_buffers():
        if b.is_floating_point():
            assert rel(b, ref[name]) <= 3 * rel(theirs[name], ref[name]) + 1e-3, name
        else:
            assert int(b) == int(ref[name]) == 5, name  # num_batches_tracked


def test_the_compiled_graph_runs_cudnns_fused_batch_norm(monkeypatch):
    """After the first compiled step, each step launches cudnnBatchNormalizationForwardTrainingEx
    and cudnnBatchNormalizationBackwardEx once per block (the operators' CUDA implementations,
    not PyTorch's batch norm)."""
    _, fused = _bf16_fused()
    compiled = torch.compile(fused)
    x = torch.randn(8, 3, 16, 16, device=DEV).to(BF16, memory_format=CL)
    t = torch.randint(0, 10, (8,), device=DEV)
    F.cross_entropy(compiled(x).float(), t).backward()
    launched = {"forward": 0, "backward": 0}

    def counted(name, fn):
        def launch(*args):
            launched[name] += 1
            return fn(*args)
        return launch

    for e in training.remembered_layouts():
        monkeypatch.setattr(e, "forward", counted("forward", e.forward))
        monkeypatch.setattr(e, "backward", counted("backward", e.backward))
    F.cross_entropy(compiled(x).float(), t).backward()
    assert launched == {"forward": 13, "backward": 13}


def test_export_of_a_bf16_training_model_keeps_the_fused_batch_norm():
    _, fused = _bf16_fused()
    eager = copy.deepcopy(fused)
    x = torch.randn(8, 3, 16, 16, device=DEV).to(BF16, memory_format=CL)
    program = torch.export.export(copy.deepcopy(fused), (x,))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count("pycudnn.batch_norm_train.default") == 13, targets
    with torch.no_grad():
        got, want = program.module()(x), eager(x)
    assert rel(got, want) < 2e-2
