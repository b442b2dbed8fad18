"""torch.compile and torch.export of pycudnn.torch models on a GPU (pycudnn/torch/library.py's
custom operators): dynamo finds no graph break in converted and fused models (a small ResNet,
torchvision's ResNet-18); a compiled training step (inductor) gives PyTorch eager's output and
gradients (float32, TF32 off) through pycudnn's launches; mode="reduce-overhead" trains three
steps in CUDA graphs like eager PyTorch; torch.export keeps the operators and its program
computes what the model does; opcheck passes on every operator; autocast is traced.

Compiling is slow: small models and inputs, and dynamo's caches reset between tests."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # a CPU build of PyTorch on a GPU machine
    pytest.skip("PyTorch has no CUDA here", allow_module_level=True)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import calls, library  # noqa: E402
from torch_models import SmallResNet, randomize_batchnorm  # noqa: E402

if not library.AVAILABLE:
    pytest.skip("PyTorch before 2.4: no torch.library.custom_op (pycudnn registers no operators)",
                allow_module_level=True)

nn = torch.nn
F = torch.nn.functional
DEV = torch.device("cuda", 0)
CL = torch.channels_last


@pytest.fixture(autouse=True)
def _strict_flags_and_fresh_dynamo():
    """No TF32 on either side, no routing (these tests are of pycudnn's own launches), nothing
    compiled left over from another test."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.benchmark)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    routing = pt.routing.routing()
    pt.set_routing("pycudnn")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    pt.set_routing(routing)
    (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
     torch.backends.cudnn.benchmark) = saved


def rel_err(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _explain(model, x):
    """(graph breaks, graphs, the pycudnn operators in the graphs by name)."""
    e = torch._dynamo.explain(model)(x)
    ops: dict[str, int] = {}
    for g in e.graphs:
        for n in g.graph.nodes:
            if n.op == "call_function" and str(n.target).startswith("pycudnn."):
                ops[str(n.target)] = ops.get(str(n.target), 0) + 1
    return e.graph_break_count, e.graph_count, ops, e.break_reasons


def _small_cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=2), nn.ReLU(),
                         nn.Conv2d(16, 32, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, 10))


def test_dynamo_finds_no_graph_break_in_a_converted_and_a_fused_model():
    torch.manual_seed(0)
    model = pt.convert(randomize_batchnorm(SmallResNet()).to(DEV).to(memory_format=CL))
    x = torch.randn(2, 3, 16, 16, device=DEV).to(memory_format=CL)
    breaks, graphs, ops, why = _explain(model, x)
    assert (breaks, graphs) == (0, 1), why
    assert ops == {"pycudnn.conv2d": 14}, ops
    fused = pt.fuse_for_inference(model.eval())
    with torch.no_grad():
        breaks, graphs, ops, why = _explain(fused, x)
    assert (breaks, graphs) == (0, 1), why
    assert ops == {"pycudnn.conv2d_bias_relu": 8, "pycudnn.conv2d_add_relu": 4,
                   "pycudnn.conv2d": 2}, ops


def test_dynamo_traces_a_fused_training_model_through_its_original_modules():
    """fuse_for_training's blocks in training mode with float32 data, which cuDNN's fused
    kernels do not take: dynamo traces their unfused path (the
    converted convolution, batch norm, add, ReLU) without a graph break, and the compiled
    step computes the unfused model's output and gradients (float32, TF32 off: the fused model's
    batch norms are the unfused one's, so the two agree to float32 rounding)."""
    torch.manual_seed(0)
    base = randomize_batchnorm(SmallResNet()).to(DEV).to(memory_format=CL)
    fused = pt.fuse_for_training(pt.convert(copy.deepcopy(base)))
    assert any(isinstance(m, pt.ConvBnReLU2d) for m in fused.modules())
    x = torch.randn(4, 3, 16, 16, device=DEV).to(memory_format=CL)
    breaks, graphs, ops, why = _explain(fused, x)
    assert (breaks, graphs) == (0, 1), why
    assert set(ops) == {"pycudnn.conv2d"}, ops
    eager = copy.deepcopy(base)
    out = torch.compile(fused, backend="aot_eager")(x)
    out.sum().backward()
    ref = eager(x)
    ref.sum().backward()
    assert rel_err(out, ref) < 1e-4
    theirs = dict(eager.named_parameters())
    for name, p in fused.named_parameters():
        assert p.grad is not None, name
        assert rel_err(p.grad, theirs[name].grad) < 1e-3, name


def test_dynamo_finds_no_graph_break_in_torchvisions_resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = pt.convert(torchvision.models.resnet18(weights=None)).to(DEV).to(memory_format=CL)
    x = torch.randn(2, 3, 64, 64, device=DEV).to(memory_format=CL)
    breaks, graphs, ops, why = _explain(model, x)
    assert (breaks, graphs) == (0, 1), why
    assert ops == {"pycudnn.conv2d": 20}, ops
    with torch.no_grad():
        breaks, graphs, ops, why = _explain(pt.fuse_for_inference(model.eval()), x)
    assert (breaks, graphs) == (0, 1), why
    # the stem and each block's first convolution with their ReLU, each block's second with its
    # shortcut's add, the three downsampling convolutions with their folded BatchNorm
    assert ops == {"pycudnn.conv2d_bias_relu": 9, "pycudnn.conv2d_add_relu": 8,
                   "pycudnn.conv2d": 3}, ops


def test_routing_decides_at_trace_time_which_convolutions_the_graph_gives_to_pytorch():
    """Benchmark mode with routing on: dynamo measures each new signature as an eager first call
    would; a signature PyTorch runs in every direction the graph needs is traced as its own
    convolution (the compiler fuses around it), the others stay pycudnn's operators; the
    compiled step computes what eager PyTorch does."""
    torch.backends.cudnn.benchmark = True
    pt.set_routing("auto")
    pt.clear_cache()
    pt.routing.clear_report()
    torch.manual_seed(0)
    plain = randomize_batchnorm(SmallResNet()).to(DEV).to(memory_format=CL)
    converted = pt.convert(copy.deepcopy(plain))
    x = torch.randn(4, 3, 16, 16, device=DEV).to(memory_format=CL)
    e = torch._dynamo.explain(converted)(x)
    assert (e.graph_break_count, e.graph_count) == (0, 1), e.break_reasons
    nodes = [n for g in e.graphs for n in g.graph.nodes if n.op == "call_function"]
    ours = sum(str(n.target) == "pycudnn.conv2d" for n in nodes)
    aten = sum(n.target in (torch.conv2d, F.conv2d) for n in nodes)
    winners: dict[str, set[str]] = {}  # signature -> the sides that won its directions
    for d in pt.routing_report():
        winners.setdefault(d["signature"], set()).add(d["winner"])
    assert winners, "nothing was measured at trace time"
    assert aten + ours == 14, (aten, ours)
    assert (aten > 0) == any(w == {"torch"} for w in winners.values()), (aten, winners)
    y = torch.randint(0, 10, (4,), device=DEV)
    out = torch.compile(converted, backend="aot_eager")(x)  # the traced graph, not inductor's
    F.cross_entropy(out, y).backward()
    ref = plain(x)
    F.cross_entropy(ref, y).backward()
    assert rel_err(out, ref) < 1e-4
    for (name, p), q in zip(converted.named_parameters(), plain.parameters()):
        assert rel_err(p.grad, q.grad) < 1e-4, name
    # routing off: every convolution is pycudnn's operator again
    pt.set_routing("pycudnn")
    pt.clear_cache()  # (decided signatures keep their side until then)
    torch._dynamo.reset()
    assert _explain(converted, x)[2] == {"pycudnn.conv2d": 14}


def test_a_compiled_training_step_gives_pytorchs_output_and_gradients():
    torch.manual_seed(0)
    plain = randomize_batchnorm(SmallResNet()).to(DEV).to(memory_format=CL)
    converted = pt.convert(copy.deepcopy(plain))
    compiled = torch.compile(converted)
    x = torch.randn(4, 3, 16, 16, device=DEV).to(memory_format=CL)
    y = torch.randint(0, 10, (4,), device=DEV)
    pt.clear_cache()
    out = compiled(x)
    F.cross_entropy(out, y).backward()
    # the compiled graph ran pycudnn's remembered launches, forward and both backward directions
    assert {k[0] for k in calls.remembered_signatures()["forward"]} == {"conv"}
    assert {k[0] for k in calls.remembered_signatures()["backward"]} == {"data", "filter"}
    ref = plain(x)
    F.cross_entropy(ref, y).backward()
    assert rel_err(out, ref) < 1e-4
    for (name, p), q in zip(converted.named_parameters(), plain.parameters()):
        assert rel_err(p.grad, q.grad) < 1e-4, name
    for b, c in zip(converted.buffers(), plain.buffers()):  # BatchNorm's running statistics
        assert rel_err(b, c) < 1e-4


def test_reduce_overhead_trains_three_steps_in_cuda_graphs_like_eager(monkeypatch):
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    plain = _small_cnn().to(DEV).to(memory_format=CL)
    converted = pt.convert(copy.deepcopy(plain))
    compiled = torch.compile(converted, mode="reduce-overhead")
    g = torch.Generator(device=DEV).manual_seed(0)
    xs = [torch.randn(8, 3, 16, 16, device=DEV, generator=g).to(memory_format=CL)
          for _ in range(3)]
    ys = torch.randint(0, 10, (3, 8), device=DEV, generator=g)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (converted, plain)]
    launches = {"n": 0}

    def counted(fn):
        def run(*args):
            launches["n"] += 1
            return fn(*args)
        return run

    counters.clear()
    losses: dict[str, list[float]] = {"compiled": [], "eager": []}
    for i in range(3):  # warm-up run, recording, replay
        if i == 2:  # a replay runs no Python: the operators' CUDA implementations are not called
            for name in ("run_forward", "run_backward_data", "run_backward_filter"):
                monkeypatch.setattr(library, name, counted(getattr(library, name)))
        for side, model, opt in (("compiled", compiled, opts[0]), ("eager", plain, opts[1])):
            if side == "compiled":
                torch.compiler.cudagraph_mark_step_begin()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xs[i]), ys[i])
            loss.backward()
            opt.step()
            losses[side].append(float(loss))
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert launches["n"] == 0
    for a, b in zip(losses["compiled"], losses["eager"]):
        assert abs(a - b) <= 1e-4 * abs(b), losses
    for p, q in zip(converted.parameters(), plain.parameters()):
        assert rel_err(p, q) < 1e-4


def test_export_keeps_the_operators_and_its_program_computes_the_model():
    torch.manual_seed(0)
    model = pt.convert(randomize_batchnorm(SmallResNet()).to(DEV).to(memory_format=CL)).eval()
    x = torch.randn(2, 3, 16, 16, device=DEV).to(memory_format=CL)
    with torch.no_grad():
        want = model(x)
    for m, kinds in ((model, {"pycudnn.conv2d.default"}),
                     (pt.fuse_for_inference(model), {"pycudnn.conv2d_add_relu.default",
                                                     "pycudnn.conv2d_bias_relu.default"})):
        program = torch.export.export(m, (x,))
        targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
        assert kinds <= set(targets) and not any("convolution" in t for t in targets), targets
        assert sum(t.startswith("pycudnn.") for t in targets) == 14
        with torch.no_grad():
            got = program.module()(x)
        assert rel_err(got, want) < 1e-4


def test_opcheck_passes_on_every_operator():
    g = torch.Generator(device=DEV).manual_seed(0)

    def r(*shape, grad=True, fmt=torch.contiguous_format):
        t = torch.randn(*shape, device=DEV, generator=g).contiguous(memory_format=fmt)
        return t.requires_grad_(grad)

    geom = ([2, 1], [1, 0], [1, 2], 2)
    ops = torch.ops.pycudnn
    for fmt in (torch.contiguous_format, CL):
        x, w, b = r(2, 4, 7, 8, fmt=fmt), r(6, 2, 3, 2), r(6)
        z, gy = r(2, 6, 4, 6, fmt=fmt), r(2, 6, 4, 6, grad=False, fmt=fmt)
        for op, args in [(ops.conv2d.default, (x, w, b, *geom)),
                         (ops.conv2d.default, (x, w, None, *geom)),
                         (ops.conv2d_bias_relu.default, (x, w, b, *geom)),
                         (ops.conv2d_bias_relu.default, (x, w, None, *geom)),
                         (ops.conv2d_add_relu.default, (x, w, z, b, 0.5, *geom)),
                         (ops.conv2d_backward_input.default, (gy, x.detach(), w.detach(), *geom)),
                         (ops.conv2d_backward_weight.default,
                          (gy, x.detach(), w.detach(), *geom))]:
            torch.library.opcheck(op, args)


def test_autocast_is_traced_as_eager_casts():
    torch.manual_seed(0)
    convs = pt.convert(_small_cnn().to(DEV).to(memory_format=CL))[:6]  # up to the pooling
    x = torch.randn(4, 3, 16, 16, device=DEV).to(memory_format=CL)
    compiled = torch.compile(convs, backend="eager", fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        got = compiled(x)
        want = convs(x)
    assert got.dtype == want.dtype == torch.bfloat16
    assert rel_err(got, want) < 1e-2


def test_measuring_at_trace_time_leaves_the_devices_random_generator_as_it_was():
    """dynamo restores only the current device's CUDA generator around tracing, so the stand-in
    tensors' random draws must not advance the generator of the device they are on."""
    torch.backends.cudnn.benchmark = True
    pt.set_routing("auto")
    pt.clear_cache()
    pt.routing.clear_report()
    signature = ((2, 8, 16, 16), (2048, 256, 16, 1), "float32", 0, (8, 8, 3, 3), (72, 9, 3, 1),
                 "float32", False, ((1, 1), (1, 1), (1, 1), 1), True, True)
    before = torch.cuda.get_rng_state(0)
    cpu_before = torch.get_rng_state()
    library.routed_to_torch(signature)
    assert torch.equal(torch.cuda.get_rng_state(0), before)
    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert pt.routing_report(), "the signature was not measured"
