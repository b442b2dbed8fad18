"""pycudnn's custom operators (pycudnn/torch/library.py) without a GPU: the schemas; the fake
implementations' shapes, strides and errors against PyTorch's own rules; and, with CPU stand-ins
for the CUDA kernels (PyTorch's convolution, output in the CUDA kernels' memory format), the
parts a GPU does not decide: dynamo traces the public functions whole, AOTAutograd puts the
backward operators in the backward graph, the autograd formulas give PyTorch's gradients (and
second derivatives), torch.export keeps the operators, opcheck passes. The numerics of the real
CUDA kernels are tests/test_torch_compile_gpu.py's."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import calls, library  # noqa: E402

F = torch.nn.functional
CL = torch.channels_last
CONTIG = torch.contiguous_format
needs_custom_ops = pytest.mark.skipif(not library.AVAILABLE,
                                      reason="PyTorch before 2.4: no torch.library.custom_op")
pytestmark = needs_custom_ops

SCHEMAS = {
    "conv2d": "pycudnn::conv2d(Tensor input, Tensor weight, Tensor? bias, int[2] stride, "
              "int[2] padding, int[2] dilation, int groups) -> Tensor",
    "conv2d_bias_relu": "pycudnn::conv2d_bias_relu(Tensor input, Tensor weight, Tensor? bias, "
                        "int[2] stride, int[2] padding, int[2] dilation, int groups) -> Tensor",
    "conv2d_add_relu": "pycudnn::conv2d_add_relu(Tensor input, Tensor weight, Tensor z, "
                       "Tensor? bias, float alpha, int[2] stride, int[2] padding, "
                       "int[2] dilation, int groups) -> Tensor",
    "conv2d_backward_input": "pycudnn::conv2d_backward_input(Tensor grad_output, Tensor input, "
                             "Tensor weight, int[2] stride, int[2] padding, int[2] dilation, "
                             "int groups) -> Tensor",
    "conv2d_backward_weight": "pycudnn::conv2d_backward_weight(Tensor grad_output, "
                              "Tensor input, Tensor weight, int[2] stride, int[2] padding, "
                              "int[2] dilation, int groups) -> Tensor",
    "batch_norm_train": "pycudnn::batch_norm_train(Tensor input, Tensor weight, Tensor bias, "
                        "Tensor? z, bool relu, float eps, int reserve_size) "
                        "-> (Tensor, Tensor, Tensor, Tensor)",
    "batch_norm_train_backward": "pycudnn::batch_norm_train_backward(Tensor grad_output, "
                                 "Tensor input, Tensor? output, Tensor weight, Tensor? bias, "
                                 "Tensor save_mean, Tensor save_invstd, Tensor reserve, "
                                 "bool relu, bool add, float eps, int reserve_size) "
                                 "-> (Tensor, Tensor, Tensor, Tensor)",
}
#: the operators that also have a CPU implementation (PyTorch's own batch norm)
WITH_CPU = {"batch_norm_train", "batch_norm_train_backward"}


def test_every_operator_is_registered_with_its_schema():
    assert set(library.OPS) == set(SCHEMAS)
    for name, schema in SCHEMAS.items():
        op = getattr(torch.ops.pycudnn, name).default
        assert str(op._schema) == schema
        for key in ("CUDA", "Autograd", *(("CPU",) if name in WITH_CPU else ())):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pycudnn::{name}", key), key


def test_eager_calls_do_not_go_through_the_operators(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an eager call took the tracing branch")

    for name in ("traced_conv2d", "traced_conv2d_bias_relu", "traced_conv2d_add_relu"):
        monkeypatch.setattr(pt.functional, name, refuse)
    assert not library.dynamo_compiling() and not library.compiler._is_compiling_flag
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    # the eager path's own check, not the operator's (which would say the same through dispatch)
    with pytest.raises(pt.ConvolutionTypeError, match="expected input on a CUDA device"):
        pt.conv2d(x, w)
    with pytest.raises(pt.ConvolutionTypeError, match="expected input on a CUDA device"):
        pt.conv2d_add_relu(x, w, torch.randn(1, 2, 3, 3))


# ---- fake implementations -------------------------------------------------------------------------

def _fake_cuda(mode, shape, dtype=torch.float32, channels_last=False):
    with mode:
        t = torch.empty(shape, dtype=dtype, device="cuda")
        if channels_last:  # .contiguous(memory_format=...) needs CUDA's device guard: strides instead
            _, c, h, w = shape
            t = torch.empty_strided(shape, (h * w * c, 1, w * c, c), dtype=dtype, device="cuda")
    return t


CASES = [  # x shape, w shape, stride, padding, dilation, groups, x cl, w cl, dtype, output cl
    ((2, 8, 9, 10), (6, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, False, False, torch.float32, False),
    ((2, 8, 9, 10), (6, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, True, False, torch.float32, True),
    ((2, 8, 9, 10), (6, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, False, True, torch.bfloat16, True),
    ((2, 8, 9, 10), (6, 4, 3, 2), (2, 1), (1, 0), (1, 2), 2, True, True, torch.float16, True),
    ((3, 6, 17, 12), (9, 2, 5, 3), (3, 2), (2, 1), (2, 1), 3, False, False, torch.float32, False),
    ((2, 8, 9, 10), (8, 1, 3, 3), (1, 2), (0, 2), (1, 1), 8, True, False, torch.float32, True),
    ((2, 8, 9, 10), (6, 8, 1, 1), (2, 2), (0, 0), (1, 1), 1, True, True, torch.float64, False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_fake_outputs_have_the_shape_and_strides_of_pytorchs_rule(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    xs, ws, stride, padding, dilation, groups, x_cl, w_cl, dtype, out_cl = case
    mode = FakeTensorMode()
    x = _fake_cuda(mode, xs, dtype, x_cl)
    w = _fake_cuda(mode, ws, dtype, w_cl)
    # the shape from PyTorch's own convolution on meta tensors
    ref = F.conv2d(torch.empty(xs, device="meta"), torch.empty(ws, device="meta"), None, stride,
                   padding, dilation, groups)
    fmt = CL if out_cl else CONTIG
    want = torch.empty(ref.shape, memory_format=fmt).stride()
    geom = (list(stride), list(padding), list(dilation), groups)
    ops = torch.ops.pycudnn
    with mode:
        b = torch.empty(ws[0], dtype=dtype, device="cuda")
        z = torch.empty(ref.shape, dtype=dtype, device="cuda")
        outs = [ops.conv2d(x, w, None, *geom), ops.conv2d(x, w, b, *geom),
                ops.conv2d_bias_relu(x, w, b, *geom), ops.conv2d_bias_relu(x, w, None, *geom),
                ops.conv2d_add_relu(x, w, z, b, 0.5, *geom)]
        gy = torch.empty(ref.shape, dtype=dtype, device="cuda")
        gx = ops.conv2d_backward_input(gy, x, w, *geom)
        gw = ops.conv2d_backward_weight(gy, x, w, *geom)
    for y in outs:
        assert (tuple(y.shape), y.stride(), y.dtype, y.device) == (
            tuple(ref.shape), want, dtype, torch.device("cuda", 0))
    assert tuple(gx.shape) == xs and gx.stride() == torch.empty(xs, memory_format=fmt).stride()
    assert tuple(gw.shape) == ws and gw.stride() == torch.empty(ws, memory_format=fmt).stride()
    assert gx.dtype == gw.dtype == dtype


def test_fake_implementation_refuses_what_pytorch_refuses():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    x = _fake_cuda(mode, (2, 6, 8, 8))
    w = _fake_cuda(mode, (4, 4, 3, 3))
    g = ([1, 1], [0, 0], [1, 1], 1)
    with mode:
        with pytest.raises(pt.ConvolutionValueError, match=r"expected input\[2, 6, 8, 8\] to have "
                                                           r"4 channels, but got 6 channels"):
            torch.ops.pycudnn.conv2d(x, w, None, *g)
        with pytest.raises(pt.ConvolutionValueError, match="expected z of the output's size"):
            torch.ops.pycudnn.conv2d_add_relu(x, _fake_cuda(mode, (4, 6, 3, 3)), x, None, 1.0, *g)
    with pytest.raises(pt.ConvolutionTypeError, match="expected input on a CUDA device"), \
            FakeTensorMode():
        torch.ops.pycudnn.conv2d(torch.empty(2, 4, 8, 8), torch.empty(4, 4, 3, 3), None, *g)


# ---- CPU stand-ins for the CUDA kernels -----------------------------------------------------------

_conv_bwd = torch.ops.aten.convolution_backward.default


def _as_cuda_returns(r, x, w):
    """``r`` in the memory format the CUDA kernels return (PyTorch's rule: channels_last when x
    or w is), which the fake implementations promise."""
    out = torch.empty(r.shape, dtype=r.dtype, memory_format=calls.memory_format(x, w))
    return out.copy_(r)


def _cpu_conv(x, w, b, s, p, d, g):
    return _as_cuda_returns(F.conv2d(x, w, b, s, p, d, g), x, w)


def _cpu_bias_relu(x, w, b, s, p, d, g):
    return _as_cuda_returns(torch.relu(F.conv2d(x, w, b, s, p, d, g)), x, w)


def _cpu_add_relu(x, w, z, b, alpha, s, p, d, g):
    return _as_cuda_returns(torch.relu(F.conv2d(x, w, b, s, p, d, g) + alpha * z), x, w)


def _cpu_backward_input(gy, x, w, s, p, d, g):
    r = _conv_bwd(gy, x, w, None, s, p, d, False, [0, 0], g, [True, False, False])[0]
    return _as_cuda_returns(r, x, w)


def _cpu_backward_weight(gy, x, w, s, p, d, g):
    r = _conv_bwd(gy, x, w, None, s, p, d, False, [0, 0], g, [False, True, False])[1]
    return _as_cuda_returns(r, x, w)


@pytest.fixture(scope="module")
def _cpu_kernels():
    lib = torch.library.Library("pycudnn", "IMPL")
    for name, fn in [("conv2d", _cpu_conv), ("conv2d_bias_relu", _cpu_bias_relu),
                     ("conv2d_add_relu", _cpu_add_relu),
                     ("conv2d_backward_input", _cpu_backward_input),
                     ("conv2d_backward_weight", _cpu_backward_weight)]:
        lib.impl(name, fn, "CPU")
    yield
    lib._destroy()


@pytest.fixture
def cpu_ops(_cpu_kernels, monkeypatch):
    """The operators on CPU tensors: the stand-in kernels, and the fake implementations' device
    check let through for CPU tensors (every other check stays)."""
    check = calls.check_tensor

    def check_but_cpu(fn, name, t, dims=None):
        if not (isinstance(t, torch.Tensor) and t.device.type == "cpu"):
            check(fn, name, t, dims)

    monkeypatch.setattr(calls, "check_tensor", check_but_cpu)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Block(torch.nn.Module):
    """The three public functions in a residual block: bias+ReLU, a grouped convolution with
    padding="same" and an even kernel (PyTorch's extra right/bottom padding), add+ReLU."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        d = torch.float64
        self.w1 = torch.nn.Parameter(torch.randn(6, 4, 3, 3, generator=g, dtype=d))
        self.b1 = torch.nn.Parameter(torch.randn(6, generator=g, dtype=d))
        self.w2 = torch.nn.Parameter(torch.randn(6, 3, 2, 2, generator=g, dtype=d))
        self.w3 = torch.nn.Parameter(torch.randn(4, 6, 1, 1, generator=g, dtype=d))
        self.b3 = torch.nn.Parameter(torch.randn(4, generator=g, dtype=d))

    def forward(self, x):
        y = pt.conv2d_bias_relu(x, self.w1, self.b1, 1, 1)
        y = pt.conv2d(y, self.w2, None, 1, "same", 1, 2)
        return pt.conv2d_add_relu(y, self.w3, x, self.b3, 0.5)

    def reference(self, x):
        y = torch.relu(F.conv2d(x, self.w1, self.b1, 1, 1))
        y = F.conv2d(y, self.w2, None, 1, "same", 1, 2)
        return torch.relu(F.conv2d(y, self.w3, self.b3) + 0.5 * x)


def _grads(model, x, fn):
    for p in model.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    y = fn(x)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view(y.shape)).sum().backward()
    return y.detach(), [x.grad] + [p.grad for p in model.parameters()]


def test_dynamo_traces_the_functions_whole_and_the_backward_runs_the_backward_operators(cpu_ops):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    model = Block()
    x = torch.randn(2, 4, 9, 8, dtype=torch.float64, requires_grad=True)
    explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1)

    graphs = []

    def record(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm)

    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=record, bw_compiler=record),
                             fullgraph=True)
    y, grads = _grads(model, x, compiled)
    forward, backward = graphs
    pycudnn = {"pycudnn.conv2d.default", "pycudnn.conv2d_bias_relu.default",
               "pycudnn.conv2d_add_relu.default"}
    assert forward >= pycudnn and "aten.convolution.default" not in forward
    assert backward >= {"pycudnn.conv2d_backward_input.default",
                        "pycudnn.conv2d_backward_weight.default",
                        "aten.threshold_backward.default"}
    assert "aten.convolution_backward.default" not in backward
    ref, ref_grads = _grads(model, x, model.reference)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_frozen_weight_gets_no_weight_gradient_operator(cpu_ops):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    w = torch.randn(4, 4, 3, 3, dtype=torch.float64)  # requires no gradient
    backward = []

    def record(gm, example_inputs):
        backward.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm)

    fn = torch.compile(lambda x: pt.conv2d(x, w, None, 1, 1),
                       backend=aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm),
                                            bw_compiler=record))
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    fn(x).sum().backward()
    assert "pycudnn.conv2d_backward_input.default" in backward[0]
    assert "pycudnn.conv2d_backward_weight.default" not in backward[0]
    torch.testing.assert_close(x.grad, torch.autograd.grad(F.conv2d(x, w, None, 1, 1).sum(), x)[0])


def test_eager_geometry_entries_do_not_recompile_a_compiled_graph(cpu_ops):
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    model = Block()
    compiled = torch.compile(model, backend=counter)
    x = torch.randn(1, 4, 6, 6, dtype=torch.float64)
    compiled(x)
    for i in range(3):  # eager calls fill geometry()'s cache; the traced code never read it
        calls.geometry(i + 1, i, 1, 1, model.w1)
        compiled(x)
    assert counter.frame_count == 1


def test_unbatched_input_and_autocast_off_trace_like_eager(cpu_ops):
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    fn = torch.compile(lambda x: pt.conv2d(x, w, None, 2, 1), backend="eager", fullgraph=True)
    x = torch.randn(3, 7, 7, dtype=torch.float64)
    torch.testing.assert_close(fn(x), F.conv2d(x, w, None, 2, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_keeps_the_pycudnn_operators(cpu_ops, strict):
    model = Block()
    x = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    program = torch.export.export(model, (x,), strict=strict)
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t.startswith("pycudnn.")] == [
        "pycudnn.conv2d_bias_relu.default", "pycudnn.conv2d.default",
        "pycudnn.conv2d_add_relu.default"]
    assert not any("convolution" in t for t in targets)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model.reference(x), rtol=1e-12, atol=1e-12)


def _op_samples(n=2, k=6, h=7, width=8):
    """Each operator with float64 arguments (strided, padded, dilated, grouped geometry)."""
    g = torch.Generator().manual_seed(1)
    d = torch.float64

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=d, requires_grad=True)

    geom = ([2, 1], [1, 0], [1, 2], 2)
    x, w, b = r(n, 4, h, width), r(k, 2, 3, 2), r(k)
    out = (n, k, (h - 1) // 2 + 1, width - 2)
    z = r(*out)
    gy = torch.randn(*out, generator=g, dtype=d)
    ops = torch.ops.pycudnn
    return [(ops.conv2d.default, (x, w, b, *geom)),
            (ops.conv2d.default, (x.detach().contiguous(memory_format=CL), w, None, *geom)),
            (ops.conv2d_bias_relu.default, (x, w, b, *geom)),
            (ops.conv2d_add_relu.default, (x, w, z, b, 0.5, *geom)),
            (ops.conv2d_backward_input.default, (gy, x.detach(), w.detach(), *geom)),
            (ops.conv2d_backward_weight.default, (gy, x.detach(), w.detach(), *geom))]


def test_opcheck_passes_on_every_operator(cpu_ops):
    for op, args in _op_samples():
        torch.library.opcheck(op, args)


def test_gradients_and_second_derivatives_match_finite_differences(cpu_ops):
    """The autograd formulas (register_autograd) against finite differences; the second
    derivative goes through the create_graph fallback (PyTorch's convolution_backward)."""
    for op, args in _op_samples(n=1, k=4, h=5, width=5)[:4]:  # small: finite differences per element
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        rest = list(args)
        where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]

        def f(*ts, op=op, rest=rest, where=where):
            a = list(rest)
            for i, t in zip(where, ts):
                a[i] = t
            return op(*a)

        # fast mode checks the Jacobian against finite differences along random directions:
        # one evaluation per direction, not per element, so the check costs little on any host
        assert torch.autograd.gradcheck(f, tensors, fast_mode=True)
        assert torch.autograd.gradgradcheck(f, tensors, fast_mode=True)


def test_tracing_flag_alone_sends_the_functions_to_the_operators(monkeypatch):
    """torch.export without dynamo (non-strict) sets torch.compiler's flag and runs the model's
    Python on fake tensors: the functions must give the graph the operator."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()
    x = _fake_cuda(mode, (2, 4, 8, 8), channels_last=True)
    w = _fake_cuda(mode, (4, 4, 3, 3))
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    with mode:
        gm = make_fx(lambda x, w: pt.conv2d_bias_relu(x, w, None, 1, 1))(x, w)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "pycudnn.conv2d_bias_relu.default" in targets
    # bias=None: zeros from the graph, not a cached tensor of the CUDA kernel's
    assert any("zeros" in t or "full" in t for t in targets), targets


def test_without_custom_ops_nothing_is_registered_and_the_functions_stay_eager():
    code = textwrap.dedent("""
        import torch
        del torch.library.custom_op
        import pycudnn.torch as pt
        from pycudnn.torch import library
        assert not library.AVAILABLE
        assert library.dynamo_compiling() is False
        assert not library.compiler._is_compiling_flag
        try:
            torch.ops.pycudnn.conv2d
        except (AttributeError, RuntimeError):
            pass
        else:
            raise AssertionError("pycudnn::conv2d registered")
        try:
            pt.conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3))
        except pt.ConvolutionTypeError as exc:
            assert "CUDA device" in str(exc)
        print("ok")
        """)
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, cwd=root, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_double_backward_through_a_compiled_graph_is_pytorchs_clear_error(cpu_ops):
    """AOTAutograd has no double backward: the first derivative (create_graph=True) comes, the
    second raises PyTorch's own error (eager calls are twice differentiable, see
    test_gradients_and_second_derivatives_match_finite_differences)."""
    model = Block()
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(1, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
    ref, = torch.autograd.grad(model.reference(x).sum(), x)
    torch.testing.assert_close(g, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.sum(), x)
