"""fuse_for_training's blocks under torch.compile and torch.export without a GPU: the operators
pycudnn::batch_norm_train and pycudnn::batch_norm_train_backward (their CPU implementations
against a float64 NumPy batch norm and finite differences, opcheck, the fake implementations'
shapes, strides and errors), and a fused ResNet-style model compiled with fullgraph=True (no graph
break, the operators in the forward and backward graphs) or exported, in train and eval mode,
against the eager fused model's output, gradients and running statistics in float64. The cuDNN
kernels behind the CUDA implementations are tests/test_torch_compile_gpu.py's."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import library, training  # noqa: E402
from torch_models import SmallResNet, randomize_batchnorm  # noqa: E402

pytestmark = pytest.mark.skipif(not library.AVAILABLE,
                                reason="PyTorch before 2.4: no torch.library.custom_op")

nn = torch.nn
F = torch.nn.functional
CL = torch.channels_last
D = torch.float64
ops = torch.ops.pycudnn


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """A fresh dynamo, and the blocks traced as operators (what most tests here check)."""
    saved = pt.traced_blocks()
    pt.set_traced_blocks("operators")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    pt.set_traced_blocks(saved)


def _r(*shape, seed=0, grad=False):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D)
    return t.requires_grad_(grad)


def _numpy_batch_norm(x, w, b, z, relu, eps):
    """Training batch norm in float64 NumPy: (y, mean, 1/std, unbiased variance)."""
    xn = x.detach().numpy()
    mean = xn.mean(axis=(0, 2, 3))
    var = xn.var(axis=(0, 2, 3))
    invstd = 1.0 / np.sqrt(var + eps)
    per = (slice(None), None, None)
    y = (xn - mean[per]) * (invstd * w.detach().numpy())[per] + b.detach().numpy()[per]
    if z is not None:
        y = y + z.detach().numpy()
    if relu:
        y = np.maximum(y, 0.0)
    n = xn.size // xn.shape[1]
    return y, mean, invstd, var * n / (n - 1)


# ---- the operators -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["bn", "relu", "add_relu"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_batch_norm_train_matches_numpy(kind, channels_last):
    x = _r(3, 5, 4, 6)
    if channels_last:
        x = x.contiguous(memory_format=CL)
    w, b = _r(5, seed=1) + 1.5, _r(5, seed=2)
    z = _r(3, 5, 4, 6, seed=3) if kind == "add_relu" else None
    y, mean, invstd, reserve = ops.batch_norm_train(x, w, b, z, kind != "bn", 1e-3, -1)
    ref_y, ref_mean, ref_invstd, _ = _numpy_batch_norm(x, w, b, z, kind != "bn", 1e-3)
    np.testing.assert_allclose(y.numpy(), ref_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean.numpy(), ref_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(invstd.numpy(), ref_invstd, rtol=1e-12)
    assert y.is_contiguous(memory_format=CL) and y.dtype == D and mean.dtype == D
    assert reserve.dtype == torch.uint8 and reserve.numel() == 0


def test_half_input_keeps_float32_statistics_as_cudnn_does():
    x = _r(2, 4, 3, 3).to(torch.bfloat16)
    w, b = torch.ones(4), torch.zeros(4)
    y, mean, invstd, _ = ops.batch_norm_train(x, w, b, None, True, 1e-5, 8)
    assert y.dtype == torch.bfloat16 and mean.dtype == invstd.dtype == torch.float32
    ref_y, ref_mean, _, _ = _numpy_batch_norm(x.double(), w.double(), b.double(), None, True,
                                              1e-5)
    np.testing.assert_allclose(mean.numpy(), ref_mean, rtol=1e-6, atol=1e-6)
    # within bfloat16's rounding of the float64 result
    np.testing.assert_allclose(y.double().numpy(), ref_y, rtol=2 ** -7, atol=2 ** -7)


@pytest.mark.parametrize("kind", ["bn", "relu", "add_relu"])
def test_gradients_and_second_derivatives_match_finite_differences(kind):
    """The registered autograd (the backward operator) against finite differences; the second
    derivative goes through the create_graph path (PyTorch's batch norm, recomputed)."""
    x, w, b = _r(2, 3, 3, 2, grad=True), (_r(3, seed=1) + 2).requires_grad_(), _r(3, seed=2,
                                                                                  grad=True)
    z = _r(2, 3, 3, 2, seed=3, grad=True) if kind == "add_relu" else None
    inputs = (x, w, b) if z is None else (x, w, b, z)

    def f(x, w, b, z=None):
        return ops.batch_norm_train(x, w, b, z, kind != "bn", 1e-3, -1)[0]

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("kind", ["bn", "relu", "add_relu"])
def test_backward_operator_gives_pytorchs_gradients(kind):
    x, w, b = _r(4, 6, 5, 3), _r(6, seed=1) + 1.0, _r(6, seed=2)
    z = _r(4, 6, 5, 3, seed=3) if kind == "add_relu" else None
    relu = kind != "bn"
    y, mean, invstd, reserve = ops.batch_norm_train(x, w, b, z, relu, 1e-5, -1)
    gy = _r(4, 6, 5, 3, seed=4)
    gx, gw, gb, gz = ops.batch_norm_train_backward(gy, x, y if relu else None, w,
                                                   b if relu else None, mean, invstd, reserve,
                                                   relu, z is not None, 1e-5, -1)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    zz = None if z is None else z.clone().requires_grad_()
    ref = F.batch_norm(leaves[0], None, None, leaves[1], leaves[2], True, 0.0, 1e-5)
    if zz is not None:
        ref = ref + zz
    if relu:
        ref = torch.relu(ref)
    want = torch.autograd.grad(ref, leaves + ([zz] if zz is not None else []), gy)
    for got, ref_g in zip((gx, gw, gb, gz), want):
        torch.testing.assert_close(got, ref_g, rtol=1e-10, atol=1e-10)
    assert gx.is_contiguous(memory_format=CL)
    assert gz.numel() == (gx.numel() if z is not None else 0)


def _op_samples():
    x, w, b = _r(2, 4, 3, 5, grad=True), (_r(4, seed=1) + 2).requires_grad_(), _r(4, seed=2,
                                                                                  grad=True)
    z = _r(2, 4, 3, 5, seed=3, grad=True)
    xc = x.detach().contiguous(memory_format=CL).requires_grad_()
    samples = [(x, w, b, None, False, 1e-5, -1), (xc, w, b, None, True, 1e-3, -1),
               (x, w, b, z, True, 1e-5, 0), (xc, w, b, z, True, 1e-5, 32)]
    out = [(ops.batch_norm_train.default, s) for s in samples]
    for x_, w_, b_, z_, relu, eps, rs in samples:
        y, mean, invstd, reserve = ops.batch_norm_train(x_, w_, b_, z_, relu, eps, rs)
        gy = torch.randn_like(y)
        out.append((ops.batch_norm_train_backward.default,
                    (gy, x_.detach(), y.detach() if relu else None, w_.detach(),
                     b_.detach() if relu else None, mean, invstd, reserve, relu, z_ is not None,
                     eps, rs)))
    return out


def test_opcheck_passes_on_both_operators():
    for op, args in _op_samples():
        torch.library.opcheck(op, args)


def _fake_cuda(mode, shape, dtype=torch.float32, channels_last=False):
    with mode:
        if channels_last:  # .contiguous(memory_format=...) needs CUDA's device guard: strides
            _, c, h, w = shape
            return torch.empty_strided(shape, (h * w * c, 1, w * c, c), dtype=dtype,
                                       device="cuda")
        return torch.empty(shape, dtype=dtype, device="cuda")


@pytest.mark.parametrize("add", [False, True])
def test_fake_outputs_are_what_the_cuda_implementation_returns(add):
    """Channels-last output and gradients (the fused kernels' layout, whatever the input's), the
    statistics in the weight's dtype, cuDNN's reserve of the size the graph was traced with."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    shape = (4, 8, 5, 7)
    x = _fake_cuda(mode, shape, torch.bfloat16)  # NCHW: the CUDA implementation copies it
    w, b = _fake_cuda(mode, (8,)), _fake_cuda(mode, (8,))
    z = _fake_cuda(mode, shape, torch.bfloat16, channels_last=True) if add else None
    with mode:
        y, mean, invstd, reserve = ops.batch_norm_train(x, w, b, z, True, 1e-5, 320)
        grads = ops.batch_norm_train_backward(y, x, y, w, b, mean, invstd, reserve, True, add,
                                              1e-5, 320)
    cl = torch.empty(shape, memory_format=CL).stride()
    assert (tuple(y.shape), y.stride(), y.dtype, y.device.type) == (shape, cl, torch.bfloat16,
                                                                    "cuda")
    assert [(tuple(t.shape), t.dtype) for t in (mean, invstd)] == [((8,), torch.float32)] * 2
    assert (tuple(reserve.shape), reserve.dtype) == ((320,), torch.uint8)
    gx, gw, gb, gz = grads
    assert gx.stride() == cl and gx.dtype == torch.bfloat16
    assert [(tuple(t.shape), t.dtype) for t in (gw, gb)] == [((8,), torch.float32)] * 2
    assert tuple(gz.shape) == (shape if add else (0,))


def test_bad_arguments_are_named():
    x, w, b = _r(2, 4, 3, 3), _r(4), _r(4)
    cases = [((x[0], w, b, None, False, 1e-5, -1), r"expected a 4-D input \(N, C, H, W\), got 3-D"),
             ((x, _r(3), b, None, False, 1e-5, -1),
              r"expected weight of shape \[4\] \(the input's channels\), got \[3\]"),
             ((x, w, _r(4, 1), None, False, 1e-5, -1), r"expected bias of shape \[4\]"),
             ((x, w, b, x, False, 1e-5, -1), r"z \(the residual add\) needs relu=True"),
             ((x, w, b, x[:1], True, 1e-5, -1),
              (r"expected z of the input's shape \[2, 4, 3, 3\] and dtype torch.float64, "
               r"got \[1, 4, 3, 3\]")),
             ((x, w, b, x.float(), True, 1e-5, -1), "and dtype torch.float64"),
             ((x, w, b, None, False, 1e-5, -2), "expected reserve_size >= -1, got -2")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            ops.batch_norm_train(*args)
    y, mean, invstd, reserve = ops.batch_norm_train(x, w, b, None, True, 1e-5, -1)
    with pytest.raises(ValueError, match="relu=True needs the forward's output"):
        ops.batch_norm_train_backward(y, x, None, w, b, mean, invstd, reserve, True, False, 1e-5,
                                      -1)
    with pytest.raises(ValueError, match=r"expected grad_output of the input's shape"):
        ops.batch_norm_train_backward(y[:1], x, y, w, b, mean, invstd, reserve, True, False,
                                      1e-5, -1)


# ---- the traced blocks ---------------------------------------------------------------------------

def _fused_pair(seed=0, **bn_options):
    """A float64 SmallResNet fused for training and an identical plain copy."""
    torch.manual_seed(seed)
    model = randomize_batchnorm(SmallResNet()).double()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            for k, v in bn_options.items():
                setattr(m, k, v)
    plain = copy.deepcopy(model)
    return pt.fuse_for_training(model), plain


def _ops_in(graphs):
    found: dict[str, int] = {}
    for gm in graphs:
        for n in gm.graph.nodes:
            if n.op == "call_function":
                found[str(n.target)] = found.get(str(n.target), 0) + 1
    return found


def test_dynamo_traces_a_fused_model_whole_with_the_batch_norm_operator():
    fused, _ = _fused_pair()
    explained = torch._dynamo.explain(fused)(_r(2, 3, 16, 16))
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), \
        explained.break_reasons
    blocks = sum(isinstance(m, training.BLOCKS) for m in fused.modules())
    found = _ops_in(explained.graphs)
    assert blocks == 13 and found.get("pycudnn.batch_norm_train") == blocks, found
    assert not any("batch_norm" in k and not k.startswith("pycudnn") for k in found), found


def test_blocks_traced_as_modules_leave_batch_norm_to_the_compiler():
    """The default mode: no pycudnn batch-norm operator in the graph, PyTorch's batch norm once
    per block, no graph break; compiled (fullgraph, aot_eager) it trains as the eager model does
    in float64."""
    pt.set_traced_blocks("modules")
    fused, _ = _fused_pair()
    explained = torch._dynamo.explain(fused)(_r(2, 3, 16, 16))
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), \
        explained.break_reasons
    found = _ops_in(explained.graphs)
    assert not any(k.startswith("pycudnn.batch_norm") for k in found), found
    assert sum(n for k, n in found.items() if "batch_norm" in k) == 13, found
    eager = copy.deepcopy(fused)
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)
    for step in range(2):
        x = _r(2, 3, 16, 16, seed=20 + step)
        for model in (compiled, eager):
            model(x).square().mean().backward()
        for (name, p), q in zip(fused.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-8, atol=1e-10, msg=name)
        for (name, b), c in zip(fused.named_buffers(), eager.buffers()):
            torch.testing.assert_close(b, c, rtol=1e-10, atol=1e-12, msg=name)


def test_changing_the_traced_mode_recompiles():
    from torch._dynamo.testing import CompileCounterWithBackend

    fused, _ = _fused_pair()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(fused, backend=counter, fullgraph=True)
    x = _r(2, 3, 16, 16, seed=3)
    compiled(x)
    pt.set_traced_blocks("modules")
    compiled(x)
    assert counter.frame_count == 2
    assert [_ops_in([g]).get("pycudnn.batch_norm_train") for g in counter.graphs] == [13, None]


def test_set_traced_blocks_names_the_modes():
    with pytest.raises(ValueError, match=r"set_traced_blocks: expected mode to be one of "
                                         r"\['modules', 'operators'\], got 'fused'"):
        pt.set_traced_blocks("fused")
    assert pt.traced_blocks() == "operators"  # unchanged by the refused call


@pytest.mark.parametrize("env,mode", [(None, "modules"), ("operators", "operators"),
                                      (" Operators ", "operators"), ("bogus", "modules")])
def test_the_traced_mode_comes_from_the_environment(env, mode):
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items() if k != "PYCUDNN_TORCH_TRACED_BLOCKS"}
    if env is not None:
        environ["PYCUDNN_TORCH_TRACED_BLOCKS"] = env
    out = subprocess.run([sys.executable, "-c", "import pycudnn.torch as pt; "
                          "print(pt.traced_blocks())"], env=environ, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == mode


@pytest.mark.parametrize("backend,options", [
    ("eager", {}), ("aot_eager", {}), ("aot_eager", {"momentum": None}),
    ("aot_eager", {"track_running_stats": False})],
    ids=["eager", "aot_eager", "aot_eager-cumulative", "aot_eager-untracked"])
def test_compiled_fused_model_trains_like_the_eager_one(backend, options):
    """Three SGD steps of the compiled fused model (fullgraph) and of the eager fused model (on
    the CPU its blocks run the original modules): losses, gradients, parameters and running
    statistics agree in float64."""
    fused, _ = _fused_pair(**options)
    if options.get("track_running_stats") is False:
        for m in fused.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean = m.running_var = m.num_batches_tracked = None
    eager = copy.deepcopy(fused)
    compiled = torch.compile(fused, backend=backend, fullgraph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (fused, eager)]
    for step in range(3):
        x = _r(2, 3, 16, 16, seed=10 + step)
        losses = []
        for model, opt in zip((compiled, eager), opts):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-10, atol=1e-12)
        for (name, p), q in zip(fused.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-8, atol=1e-10, msg=name)
        for opt in opts:
            opt.step()
        for (name, b), c in zip(fused.named_buffers(), eager.buffers()):
            torch.testing.assert_close(b, c, rtol=1e-10, atol=1e-12, msg=name)


def test_a_changed_batch_size_recompiles_once_with_the_operators():
    """CPU tensors need no trace-time reserve, so the dynamic-shape graph dynamo makes for a
    second batch size keeps the operators (on CUDA it traces the original modules)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    fused, plain = _fused_pair()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fused, backend=counter, fullgraph=True)
    for n in (2, 3, 5):
        x = _r(n, 3, 16, 16, seed=n)
        y, ref = compiled(x), plain(x)
        torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
        y.sum().backward()
        ref.sum().backward()
    assert counter.frame_count == 2
    assert [_ops_in([g]).get("pycudnn.batch_norm_train") for g in counter.graphs] == [
        13, 13]
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-8, atol=1e-10, msg=name)
    for (name, b), c in zip(fused.named_buffers(), plain.buffers()):
        torch.testing.assert_close(b, c, rtol=1e-10, atol=1e-12, msg=name)


def test_aot_autograd_puts_the_fused_backward_in_the_backward_graph():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm)

    fused, _ = _fused_pair()
    compiled = torch.compile(fused, backend=aot_autograd(fw_compiler=record, bw_compiler=record),
                             fullgraph=True)
    compiled(_r(2, 3, 16, 16)).sum().backward()
    forward, backward = (_ops_in([g]) for g in graphs)
    assert forward.get("pycudnn.batch_norm_train.default") == 13, forward
    assert backward.get("pycudnn.batch_norm_train_backward.default") == 13, backward
    for graph in (forward, backward):
        assert not any("native_batch_norm" in k or "batch_norm_legit" in k for k in graph), graph


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_of_a_training_model_keeps_the_operator_and_updates_the_statistics(strict):
    fused, plain = _fused_pair()
    x = _r(2, 3, 16, 16)
    program = torch.export.export(copy.deepcopy(fused), (x,), strict=strict)
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count("pycudnn.batch_norm_train.default") == 13
    module = program.module()
    with torch.no_grad():
        torch.testing.assert_close(module(x), plain(x), rtol=1e-10, atol=1e-12)
    theirs = dict(plain.named_buffers())
    for name, b in module.named_buffers():  # the exported program's own copy, updated once
        torch.testing.assert_close(b, theirs[name], rtol=1e-10, atol=1e-12, msg=name)


def test_export_in_eval_mode_traces_the_original_modules():
    fused, plain = _fused_pair()
    fused.eval()
    plain.eval()
    x = _r(2, 3, 16, 16)
    program = torch.export.export(fused, (x,))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert not any(t.startswith("pycudnn.") for t in targets), targets
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), plain(x), rtol=1e-12, atol=1e-12)


def test_eager_calls_do_not_take_the_traced_path(monkeypatch):
    def refuse(*args):
        raise AssertionError("an eager call took the traced path")

    monkeypatch.setattr(training, "traced_block", refuse)
    fused, plain = _fused_pair()
    x = _r(2, 3, 16, 16)
    torch.testing.assert_close(fused(x), plain(x), rtol=0, atol=0)


def test_traced_block_refuses_one_value_per_channel_as_pytorch_does():
    block = pt.ConvBnReLU2d(nn.Conv2d(3, 4, 3).double(), nn.BatchNorm2d(4).double())
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        training.traced_block(block, _r(1, 3, 3, 3), None)


def test_traced_block_on_cuda_takes_the_operator_only_where_cudnn_fuses(monkeypatch):
    """The trace-time decision for CUDA tensors (fake ones here): bfloat16 channels-last with
    float32 batch-norm parameters gives the operator with cuDNN's reserve size for the
    convolution's output; float32, or a layout cuDNN refuses, traces the original modules."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    asked = []

    def reserve_size(signature):
        asked.append(signature)
        return 96 if signature[1] == "bfloat16" else -1

    monkeypatch.setattr(training, "reserve_size_for", reserve_size)
    mode = FakeTensorMode()

    def block(dtype):
        """A ConvBnAddReLU2d whose tensors are fake CUDA ones, the weight in ``dtype`` (none
        requires a gradient: a CPU build of PyTorch aborts on a CUDA autograd node)."""
        conv, bn = nn.Conv2d(8, 12, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(12)
        conv.weight = nn.Parameter(_fake_cuda(mode, (12, 8, 3, 3), dtype), requires_grad=False)
        bn.weight, bn.bias = (nn.Parameter(_fake_cuda(mode, (12,)), requires_grad=False)
                              for _ in range(2))
        for name in ("running_mean", "running_var"):
            setattr(bn, name, _fake_cuda(mode, (12,)))
        bn.num_batches_tracked = _fake_cuda(mode, (), torch.int64)
        return pt.ConvBnAddReLU2d(conv, bn)

    x = _fake_cuda(mode, (2, 8, 9, 9), torch.bfloat16, channels_last=True)
    z = _fake_cuda(mode, (2, 12, 5, 5), torch.bfloat16, channels_last=True)
    x32 = _fake_cuda(mode, (2, 8, 9, 9), torch.float32, channels_last=True)
    z32 = _fake_cuda(mode, (2, 12, 5, 5), torch.float32, channels_last=True)
    z1 = _fake_cuda(mode, (2, 12, 1, 5), torch.bfloat16)
    fused, fused32 = block(torch.bfloat16), block(torch.float32)
    with mode:
        y = training.traced_block(fused, x, z)
        assert training.traced_block(fused32, x32, z32) is None  # float32: not fused
        assert training.traced_block(fused, x, z1) is None  # broadcast z: not fused
    assert asked == [((2, 12, 5, 5), "bfloat16", 0, training.OPS_ADD_RELU)]
    assert y is not None and y.dtype == torch.bfloat16 and tuple(y.shape) == (2, 12, 5, 5)
    monkeypatch.setattr(training, "reserve_size_for", lambda signature: -1)
    with mode:
        assert training.traced_block(fused, x, z) is None  # cuDNN refuses the layout
