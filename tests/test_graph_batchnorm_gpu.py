"""The batch-norm fusion graphs (`pycudnn.cudnn.graph.batchnorm`) on a GPU, each against a
float64 reference computed by PyTorch on the CPU: convolution with statistics (with and without
the scale-bias-ReLU prologue), the statistics' finalization, the weight gradient through the
prologue, and the data gradient through ReLU into the batch norm's gradient.

NVIDIA documents these patterns for Ampere and Hopper (cuDNN 9.8 and later for the data
gradient), its samples in fp16: there a graph without an engine fails; elsewhere, and for
bf16, it is skipped with cuDNN's reasons. The prologue graphs try the data types of
`PROLOGUE_DTYPES` in turn, as the chains do.
"""

from __future__ import annotations

import pytest

from pycudnn.cudnn import graph as G
from pycudnn.errors import CudnnError, NoAlgorithmError

torch = pytest.importorskip("torch")

from pycudnn.torch.calls import DTYPE_NAMES  # noqa: E402

pytestmark = pytest.mark.gpu

BF16, HALF = 9, 2
N, C, K, HW = 4, 32, 64, 16


def _supported_here() -> bool:
    from pycudnn.ffi import library

    major, _ = torch.cuda.get_device_capability()
    return major in (8, 9) and library.version() >= 90800


def _handle() -> int:
    from pycudnn.runtime.handle import get_handle

    return get_handle(stream=torch.cuda.current_stream().cuda_stream)


def _first_planned(builds, io_dtype=None):
    """The plan of the first ``(dtypes, build)`` whose graph has an engine, as the chains
    search them, and those dtypes; no engine for any: a failure where NVIDIA promises the
    pattern on Ampere and Hopper (fp16 data, NVIDIA's samples' type, or the per-channel graph:
    ``io_dtype`` None), else a skip naming what cuDNN said."""
    handle = _handle()
    said = []
    for dtypes, build in builds:
        try:
            graph = build(handle)
        except CudnnError as exc:  # the graph refused as a whole, as the chains take it
            said.append((tuple(dtypes), "graph", exc.status_name))
            continue
        candidates = G.engine_configs(handle, graph, ("A", "FALLBACK"))
        try:
            plan, _ = G.first_plan(handle, candidates, max_attempts=8)
        except NoAlgorithmError as exc:
            said.append((graph.description, tuple(dtypes), len(candidates), exc.failures[:1]))
            graph.close()
            continue
        for c in candidates:
            if c is not plan.config:
                c.close()
        return plan, dtypes
    if _supported_here() and io_dtype in (None, torch.float16):
        pytest.fail(f"no data types of the table have an engine here: {said}")
    pytest.skip(f"no engine for these graphs on this GPU ({io_dtype}): {said}")


def _run(plan: G.ExecutionPlan, tensors: dict) -> None:
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    plan.execute(_handle(), {k: t.data_ptr() for k, t in tensors.items()}, ws.data_ptr())
    torch.cuda.synchronize()


def _spec(uid: int, t) -> G.TensorSpec:
    dtype = {torch.bfloat16: BF16, torch.float16: HALF, torch.float32: 0}[t.dtype]
    return G.TensorSpec(uid, tuple(t.shape), tuple(t.stride()), dtype)


def _channels(*values):
    """Per-channel float32 tensors shaped 1 x C x 1 x 1, as the graphs take them."""
    return [v.reshape(1, -1, 1, 1).float().contiguous().cuda() for v in values]


def _rel(ours, ref) -> float:
    ours, ref = ours.double().cpu(), ref.double().cpu()
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def _nhwc(*shape, dtype, scale=1.0):
    g = torch.Generator().manual_seed(sum(shape))
    t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    return t.to(dtype).cuda().contiguous(memory_format=torch.channels_last)


def _conv64(x, w, pad):
    return torch.nn.functional.conv2d(x.double().cpu(), w.double().cpu(), padding=pad)


# bf16 and fp16 results are compared by their norm-relative distance from float64: a rounded
# 8-bit (bf16) or 11-bit (fp16) mantissa gives well under 1%, a wrong formula O(1)
_TOL = {torch.bfloat16: 0.02, torch.float16: 0.005}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "scale_bias_relu"])
@pytest.mark.parametrize("ks", [1, 3])
def test_conv_genstats(dtype, prologue, ks):
    from pycudnn.cudnn.graph.batchnorm import build_conv_genstats_graph, channel_spec

    pad = ks // 2
    x = _nhwc(N, C, HW, HW, dtype=dtype)
    w = _nhwc(K, C, ks, ks, dtype=dtype, scale=0.1)
    y = torch.empty(N, K, HW, HW, dtype=dtype, device="cuda").contiguous(
        memory_format=torch.channels_last)
    sums, sqsums = _channels(torch.zeros(K), torch.zeros(K))
    scale, bias = _channels(torch.linspace(0.5, 1.5, C), torch.linspace(-0.5, 0.5, C))
    io = DTYPE_NAMES[dtype]

    def build(dtypes):
        return lambda h: build_conv_genstats_graph(
            h, _spec(1, x), _spec(2, w), _spec(3, y), channel_spec(4, K), channel_spec(5, K),
            pad, 1, 1, dtypes.prologue(io, 6, C) if prologue else None, dtypes.resolve(io).stats)

    table = G.PROLOGUE_DTYPES if prologue else G.PLAIN_DTYPES
    plan, dtypes = _first_planned([(d, build(d)) for d in table], dtype)
    tensors = {"x": x, "w": w, "y": y, "sums": sums, "sqsums": sqsums}
    if prologue:
        operand = dtype if dtypes.operands == "io" else torch.float32
        scale, bias = scale.to(operand), bias.to(operand)
        tensors.update(scale=scale, bias=bias)
    _run(plan, tensors)

    a = x.double().cpu()
    if prologue:
        a = torch.relu(a * scale.double().cpu() + bias.double().cpu())
        if dtypes.read == "io":
            a = a.to(dtype).double()  # the convolution reads its input in the io type
    ref = _conv64(a, w, pad)
    assert _rel(y, ref) < _TOL[dtype]
    assert _rel(sums.flatten(), ref.sum((0, 2, 3))) < _TOL[dtype]
    assert _rel(sqsums.flatten(), (ref * ref).sum((0, 2, 3))) < _TOL[dtype]


def test_bn_finalize_matches_pytorch_batch_norm_statistics():
    from pycudnn.cudnn.graph.batchnorm import build_bn_finalize_graph, channel_spec

    count, eps, momentum = N * HW * HW, 1e-5, 0.1
    g = torch.Generator().manual_seed(3)
    data = torch.randn(N, C, HW, HW, generator=g, dtype=torch.float64) * 2 + 0.5
    weight64, bias64 = torch.rand(C, generator=g, dtype=torch.float64) + 0.5, torch.randn(C, generator=g, dtype=torch.float64)
    rm64, rv64 = torch.randn(C, generator=g, dtype=torch.float64), torch.rand(C, generator=g, dtype=torch.float64) + 0.5
    sums, sqsums, weight, bias, rm, rv = _channels(
        data.sum((0, 2, 3)), (data * data).sum((0, 2, 3)), weight64, bias64, rm64, rv64)
    saved_mean, saved_inv_std, eq_scale, eq_bias = _channels(*(torch.zeros(C),) * 4)
    specs = [channel_spec(i, C) for i in range(1, 11)]
    plan, _ = _first_planned([((), lambda h: build_bn_finalize_graph(
        h, *specs, count=count, eps=eps, momentum=momentum))])
    _run(plan, {"sums": sums, "sqsums": sqsums, "weight": weight, "bias": bias,
                        "running_mean": rm, "running_var": rv, "saved_mean": saved_mean,
                        "saved_inv_std": saved_inv_std, "eq_scale": eq_scale, "eq_bias": eq_bias,
                        "running_mean_out": rm, "running_var_out": rv})

    ref_rm, ref_rv = rm64.clone(), rv64.clone()
    out = torch.nn.functional.batch_norm(data, ref_rm, ref_rv, weight64, bias64, training=True,
                                         momentum=momentum, eps=eps)
    mean = data.mean((0, 2, 3))
    inv_std = (data.var((0, 2, 3), unbiased=False) + eps).rsqrt()
    assert _rel(saved_mean.flatten(), mean) < 1e-5
    assert _rel(saved_inv_std.flatten(), inv_std) < 1e-4
    assert _rel(rm.flatten(), ref_rm) < 1e-5, "running mean (PyTorch's momentum rule)"
    assert _rel(rv.flatten(), ref_rv) < 1e-4, "running variance (unbiased, as PyTorch's)"
    applied = data * eq_scale.double().cpu() + eq_bias.double().cpu()
    assert _rel(applied, out) < 1e-4, "eq_scale / eq_bias apply the batch norm"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_scale_bias_relu_wgrad(dtype):
    from pycudnn.cudnn.graph.batchnorm import build_sbr_wgrad_graph

    x = _nhwc(N, C, HW, HW, dtype=dtype)
    dy = _nhwc(N, K, HW, HW, dtype=dtype)
    dw = torch.empty(K, C, 3, 3, dtype=dtype, device="cuda").contiguous(
        memory_format=torch.channels_last)
    scale, bias = _channels(torch.linspace(0.5, 1.5, C), torch.linspace(-0.5, 0.5, C))
    io = DTYPE_NAMES[dtype]

    def build(dtypes):
        return lambda h: build_sbr_wgrad_graph(h, _spec(1, x), _spec(2, dy), _spec(3, dw),
                                               dtypes.prologue(io, 4, C), 1, 1, 1)

    plan, dtypes = _first_planned([(d, build(d)) for d in G.WGRAD_DTYPES], dtype)
    operand = dtype if dtypes.operands == "io" else torch.float32
    scale, bias = scale.to(operand), bias.to(operand)
    _run(plan, {"x": x, "dy": dy, "dw": dw, "scale": scale, "bias": bias})

    a = torch.relu(x.double().cpu() * scale.double().cpu() + bias.double().cpu())
    if dtypes.read == "io":
        a = a.to(dtype).double()
    w64 = torch.zeros(K, C, 3, 3, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(a, w64, padding=1).backward(dy.double().cpu())
    assert _rel(dw, w64.grad) < _TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_dgrad_drelu_dbn_gives_batch_norm_gradients(dtype):
    from pycudnn.cudnn.graph.batchnorm import build_dgrad_drelu_dbn_graph, channel_spec

    x = _nhwc(N, C, HW, HW, dtype=dtype)  # the batch norm's input (a convolution's output)
    w = _nhwc(K, C, 3, 3, dtype=dtype, scale=0.1)
    dy = _nhwc(N, K, HW, HW, dtype=dtype)
    x64 = x.double().cpu()
    eps = 1e-5
    mean64 = x64.mean((0, 2, 3))
    inv_std64 = (x64.var((0, 2, 3), unbiased=False) + eps).rsqrt()
    weight64, bias64 = torch.linspace(0.5, 1.5, C, dtype=torch.float64), torch.linspace(-0.3, 0.3, C, dtype=torch.float64)
    mean, inv_std, weight, bias = _channels(mean64, inv_std64, weight64, bias64)
    dweight, dbias, eq_dy, eq_x, eq_b = _channels(*(torch.zeros(C),) * 5)
    dx_relu = torch.empty_like(x)
    specs = [channel_spec(i, C) for i in range(5, 14)]
    plan, _ = _first_planned([((), lambda h: build_dgrad_drelu_dbn_graph(
        h, _spec(1, dy), _spec(2, w), _spec(3, x), _spec(4, dx_relu), *specs, padding=1))],
        dtype)
    _run(plan, {"dy": dy, "w": w, "x": x, "dx_relu": dx_relu, "mean": mean,
                        "inv_std": inv_std, "weight": weight, "bias": bias, "dweight": dweight,
                        "dbias": dbias, "eq_scale_dy": eq_dy, "eq_scale_x": eq_x,
                        "eq_bias": eq_b})

    # the reference: conv(relu(batch_norm(x))) differentiated in float64
    xr = x64.clone().requires_grad_(True)
    wt = weight64.clone().requires_grad_(True)
    bs = bias64.clone().requires_grad_(True)
    bn = torch.nn.functional.batch_norm(xr, None, None, wt, bs, training=True, eps=eps)
    torch.nn.functional.conv2d(torch.relu(bn), w.double().cpu(), padding=1).backward(
        dy.double().cpu())
    dx = (eq_dy.double().cpu() * dx_relu.double().cpu() + eq_x.double().cpu() * x64
          + eq_b.double().cpu())
    tol = _TOL[dtype]
    assert _rel(dweight.flatten(), wt.grad) < tol
    assert _rel(dbias.flatten(), bs.grad) < tol
    assert _rel(dx, xr.grad) < 2 * tol, "dx from the graph's coefficients"
