"""Whether cuDNN's ResNet fusions pay on this GPU. Per ResNet-50 layer (bf16, or ``--dtype
float16``, channels_last), one "BN-ReLU-conv" step of a chain, forward and backward:

* PyTorch, unfused: ``conv(relu(batch_norm(x)))`` (cuDNN's convolution and batch norm,
  benchmark mode), and with ``--inductor`` the same function under ``torch.compile``;
* fused: `bn_finalize` of the previous layer's sums, then `conv_genstats` with the
  scale-bias-ReLU prologue (forward); `sbr_wgrad`, `dgrad_drelu_dbn` and the batch norm's
  input gradient as one PyTorch multiply-add (backward). The prologue graphs take the first
  data types of `PROLOGUE_DTYPES` that get a plan, as the chains do (a cast of the scale and
  bias timed in where those are the input's type).

GPU time of each, the GPU held (a sleep kernel queued first, so the timed calls run back to back),
which plans were chosen (the fastest of the first few that finalize), and each result's
norm-relative distance from float64 (PyTorch's, cuDNN off) beside PyTorch's own distance.

    PYTHONPATH=. python3 benchmarks/probes/conv_bn_fusion.py [--batch 64] [--inductor]
        [--dtype float16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from pycudnn.cudnn import graph as G
from pycudnn.cudnn.graph.batchnorm import (build_bn_finalize_graph,
                                           build_conv_genstats_graph, build_dgrad_drelu_dbn_graph,
                                           build_sbr_wgrad_graph, channel_spec)
from pycudnn.errors import CudnnError, NoAlgorithmError
from pycudnn.runtime.handle import get_handle
from pycudnn.torch.calls import DTYPE_NAMES

CL = torch.channels_last
#: (name, input channels, output channels, input size, kernel, stride): ResNet-50's BN-ReLU-conv
#: steps (the 1x1 and 3x3 of each stage, and the 3x3 with stride 2 that opens stages 3-5)
LAYERS = [
    ("s1.conv2 3x3", 64, 64, 56, 3, 1), ("s1.conv3 1x1", 64, 256, 56, 1, 1),
    ("s2.conv1 1x1", 256, 128, 56, 1, 1), ("s2.conv2 3x3/2", 128, 128, 56, 3, 2),
    ("s2.conv2 3x3", 128, 128, 28, 3, 1), ("s2.conv3 1x1", 128, 512, 28, 1, 1),
    ("s3.conv2 3x3", 256, 256, 14, 3, 1), ("s3.conv3 1x1", 256, 1024, 14, 1, 1),
    ("s4.conv2 3x3", 512, 512, 7, 3, 1), ("s4.conv3 1x1", 512, 2048, 7, 1, 1),
]
EPS, MOMENTUM = 1e-5, 0.1


def handle() -> int:
    return get_handle(stream=torch.cuda.current_stream().cuda_stream)


def spec(uid: int, t: torch.Tensor) -> G.TensorSpec:
    dt = {torch.bfloat16: 9, torch.float16: 2, torch.float32: 0}[t.dtype]
    return G.TensorSpec(uid, tuple(t.shape), tuple(t.stride()), dt)


def gpu_ms(fn, calls: int = 20, reps: int = 5) -> float:
    """Median GPU ms per call of ``fn``, the calls queued behind a sleep kernel."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(50_000_000)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


class Fused:
    """One graph's fastest plan among the first that finalize, and its workspace."""

    def __init__(self, graph: G.OperationGraph, tensors: dict[str, torch.Tensor],
                 tries: int = 6) -> None:
        self.graph, self.tensors = graph, tensors
        self.failures: list = []
        h = handle()
        cands = G.engine_configs(h, graph, ("A", "FALLBACK"))
        self.failures += [("heuristics", p) for p in getattr(cands, "problems", [])]
        plans = []
        for c in list(cands):
            if len(plans) >= tries:
                c.close()
                continue
            try:
                plans.append(G.ExecutionPlan(c).finalize(h))
            except CudnnError as exc:
                self.failures.append((c.tag, f"{exc.status_name}: {exc.reason}"))
                c.close()
        if not plans:
            raise NoAlgorithmError(f"no plan for {graph.description}", self.failures)
        timed = []
        for p in plans:
            self.plan = p
            self._ws()
            try:
                timed.append((gpu_ms(self, calls=5, reps=3), p))
            except CudnnError as exc:
                self.failures.append((p.config.tag, f"execute: {exc}"))
        if not timed:
            raise NoAlgorithmError(f"no plan of {graph.description} executed", self.failures)
        timed.sort(key=lambda tp: tp[0])
        self.plan = timed[0][1]
        self.tag = self.plan.config.tag
        self.candidates = [(round(t, 4), p.config.tag) for t, p in timed]
        self._ws()
        self.ptrs = {k: t.data_ptr() for k, t in tensors.items()}

    def _ws(self) -> None:
        self.ws = torch.empty(max(self.plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        self.ptrs = {k: t.data_ptr() for k, t in self.tensors.items()}

    def __call__(self) -> None:
        self.plan.execute(handle(), self.ptrs, self.ws.data_ptr())


def channels(*values: torch.Tensor) -> list[torch.Tensor]:
    return [v.detach().reshape(1, -1, 1, 1).float().contiguous().cuda() for v in values]


def rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.double().flatten(), ref.double().flatten()
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def first_fused(tries: list) -> tuple[Fused, tuple[str, ...]]:
    """The first ``(dtypes, make)`` whose ``make()`` gets a plan, and those dtypes; else the
    last refusal, with every combination's reasons."""
    said: list = []
    for dtypes, make in tries:
        try:
            return make(), tuple(dtypes)
        except (CudnnError, NoAlgorithmError) as exc:
            said.append((tuple(dtypes), str(exc)[:120], getattr(exc, "failures", [])[:2]))
    raise NoAlgorithmError(f"no data types of the table have a plan ({len(said)} tried)", said)


def layer(name: str, c: int, k: int, hw: int, ks: int, stride: int, n: int,
          inductor: bool, dtype: torch.dtype = torch.bfloat16) -> dict:
    pad = ks // 2
    g = torch.Generator(device="cuda").manual_seed(c * 7 + k)
    x = (torch.randn(n, c, hw, hw, device="cuda", generator=g) * 2 + 0.3).to(
        dtype).contiguous(memory_format=CL)
    w = (torch.randn(k, c, ks, ks, device="cuda", generator=g) / (c * ks * ks) ** 0.5).to(
        dtype).contiguous(memory_format=CL)
    gamma = torch.rand(c, device="cuda", generator=g) + 0.5
    beta = torch.randn(c, device="cuda", generator=g) * 0.2
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    ho = (hw + 2 * pad - ks) // stride + 1
    dy = torch.randn(n, k, ho, ho, device="cuda", generator=g).to(dtype).contiguous(
        memory_format=CL)
    row: dict = {"layer": name, "shape": [n, c, k, hw, ks, stride]}

    # ---- PyTorch, unfused
    def torch_layer(x, w, gamma, beta, rm, rv):
        a = F.relu(F.batch_norm(x, rm, rv, gamma, beta, True, MOMENTUM, EPS))
        return F.conv2d(a, w, None, stride, pad)

    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, gamma, beta)]
    y_t = torch_layer(*leaves, rm.clone(), rv.clone())
    row["torch_fwd_ms"] = gpu_ms(lambda: torch_layer(*leaves, rm, rv))
    row["torch_bwd_ms"] = gpu_ms(lambda: torch.autograd.grad(y_t, leaves, dy, retain_graph=True))
    grads_t = torch.autograd.grad(y_t, leaves, dy, retain_graph=True)
    if inductor:
        compiled = torch.compile(torch_layer, dynamic=False)
        y_c = compiled(*leaves, rm.clone(), rv.clone())
        row["inductor_fwd_ms"] = gpu_ms(lambda: compiled(*leaves, rm, rv))
        row["inductor_bwd_ms"] = gpu_ms(
            lambda: torch.autograd.grad(y_c, leaves, dy, retain_graph=True))

    # ---- the float64 reference (cuDNN off)
    with torch.backends.cudnn.flags(enabled=False):
        ref_leaves = [t.detach().double().requires_grad_(True) for t in (x, w, gamma, beta)]
        y_ref = torch_layer(*ref_leaves, rm.double(), rv.double())
        grads_ref = torch.autograd.grad(y_ref, ref_leaves, dy.double())
    row["torch_err"] = {"y": rel(y_t, y_ref), "dx": rel(grads_t[0], grads_ref[0]),
                        "dw": rel(grads_t[1], grads_ref[1]),
                        "dgamma": rel(grads_t[2], grads_ref[2])}

    # ---- fused
    h = handle()
    xf = x.float()
    sums, sqsums = channels(xf.sum((0, 2, 3)), (xf * xf).sum((0, 2, 3)))  # the previous layer's genstats
    weight, bias, run_m, run_v = channels(gamma, beta, rm, rv)
    saved_mean, saved_inv_std, eq_scale, eq_bias = channels(*(torch.zeros(c),) * 4)
    y = torch.empty(n, k, ho, ho, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    ysum, ysq = channels(torch.zeros(k), torch.zeros(k))
    dw = torch.empty_like(w)
    dxr = torch.empty_like(x)
    dgamma, dbeta, eq_dy, eq_x, eq_b = channels(*(torch.zeros(c),) * 5)
    pieces: dict[str, Fused] = {}
    try:
        cs = [channel_spec(i, c) for i in range(1, 11)]
        pieces["finalize"] = Fused(build_bn_finalize_graph(
            h, *cs, count=n * hw * hw, eps=EPS, momentum=MOMENTUM), {
            "sums": sums, "sqsums": sqsums, "weight": weight, "bias": bias, "running_mean": run_m,
            "running_var": run_v, "saved_mean": saved_mean, "saved_inv_std": saved_inv_std,
            "eq_scale": eq_scale, "eq_bias": eq_bias, "running_mean_out": run_m,
            "running_var_out": run_v})
        pieces["finalize"]()
        io = DTYPE_NAMES[dtype]
        scale_io, bias_io = eq_scale.to(dtype), eq_bias.to(dtype)

        def operands(d: G.FusionDtypes) -> dict[str, torch.Tensor]:
            if d.operands == "io":  # what the chains pass: float32 eq_scale/eq_bias cast
                return {"scale": scale_io, "bias": bias_io}
            return {"scale": eq_scale, "bias": eq_bias}

        pieces["conv_genstats"], row["conv_genstats_dtypes"] = first_fused([
            (d, lambda d=d: Fused(build_conv_genstats_graph(
                h, spec(1, x), spec(2, w), spec(3, y), channel_spec(4, k), channel_spec(5, k),
                pad, stride, 1, d.prologue(io, 6, c), d.resolve(io).stats),
                {"x": x, "w": w, "y": y, "sums": ysum, "sqsums": ysq, **operands(d)}))
            for d in G.PROLOGUE_DTYPES])
        pieces["sbr_wgrad"], row["sbr_wgrad_dtypes"] = first_fused([
            (d, lambda d=d: Fused(build_sbr_wgrad_graph(
                h, spec(1, x), spec(2, dy), spec(3, dw), d.prologue(io, 4, c), pad, stride, 1),
                {"x": x, "dy": dy, "dw": dw, **operands(d)}))
            for d in G.WGRAD_DTYPES])
        cast = "io" in (row["conv_genstats_dtypes"][0], row["sbr_wgrad_dtypes"][0])
        ds = [channel_spec(i, c) for i in range(5, 14)]
        pieces["dgrad_drelu_dbn"] = Fused(build_dgrad_drelu_dbn_graph(
            h, spec(1, dy), spec(2, w), spec(3, x), spec(4, dxr), *ds, padding=pad,
            stride=stride), {"dy": dy, "w": w, "x": x, "dx_relu": dxr, "mean": saved_mean,
                             "inv_std": saved_inv_std, "weight": weight, "bias": bias,
                             "dweight": dgamma, "dbias": dbeta, "eq_scale_dy": eq_dy,
                             "eq_scale_x": eq_x, "eq_bias": eq_b})
    except (CudnnError, NoAlgorithmError) as exc:
        row["fused_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        row["fused_failures"] = getattr(exc, "failures", [])[:12]
        row["fused_built"] = {k: p.tag for k, p in pieces.items()}
        return row

    def apply_dx() -> torch.Tensor:
        return torch.addcmul(torch.addcmul(eq_b, eq_x, x), eq_dy, dxr)

    def cast_operands() -> None:
        scale_io.copy_(eq_scale), bias_io.copy_(eq_bias)

    for k_, p in pieces.items():
        row[f"{k_}_ms"] = gpu_ms(p)
        row[f"{k_}_plan"] = p.tag
        row[f"{k_}_candidates"] = p.candidates
    row["dx_apply_ms"] = gpu_ms(apply_dx)
    row["cast_ms"] = gpu_ms(cast_operands) if cast else 0.0
    row["fused_fwd_ms"] = row["finalize_ms"] + row["cast_ms"] + row["conv_genstats_ms"]
    row["fused_bwd_ms"] = row["sbr_wgrad_ms"] + row["dgrad_drelu_dbn_ms"] + row["dx_apply_ms"]

    # one clean pass for the errors: running statistics and sums from fresh values
    run_m.copy_(rm.reshape(1, -1, 1, 1)), run_v.copy_(rv.reshape(1, -1, 1, 1))
    for t in (ysum, ysq, dgamma, dbeta, eq_dy, eq_x, eq_b):
        t.zero_()
    pieces["finalize"]()
    cast_operands()
    pieces["conv_genstats"]()
    pieces["sbr_wgrad"]()
    pieces["dgrad_drelu_dbn"]()
    dx = apply_dx()
    torch.cuda.synchronize()
    once, dg_once = ysum.clone(), dgamma.clone()
    pieces["conv_genstats"]()  # once more, not zeroed: do the reductions add to their outputs?
    pieces["dgrad_drelu_dbn"]()
    torch.cuda.synchronize()
    row["genstats_accumulates"] = rel(ysum, 2 * once) < 1e-3
    row["dbn_accumulates"] = rel(dgamma, 2 * dg_once) < 1e-3
    ysum.copy_(once), dgamma.copy_(dg_once)
    ysum_ref = y_ref.sum((0, 2, 3))
    row["fused_err"] = {"y": rel(y, y_ref), "sums": rel(ysum, ysum_ref),
                        "dx": rel(dx, grads_ref[0]), "dw": rel(dw, grads_ref[1]),
                        "dgamma": rel(dgamma, grads_ref[2]), "dbeta": rel(dbeta, grads_ref[3])}
    row["fwd_x_torch"] = row["torch_fwd_ms"] / row["fused_fwd_ms"]
    row["bwd_x_torch"] = row["torch_bwd_ms"] / row["fused_bwd_ms"]
    if inductor:
        row["fwd_x_inductor"] = row["inductor_fwd_ms"] / row["fused_fwd_ms"]
        row["bwd_x_inductor"] = row["inductor_bwd_ms"] / row["fused_bwd_ms"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--inductor", action="store_true")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--layers", default="", help="comma-separated indices into LAYERS")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "/tmp"),
                                                  "conv_bn_fusion.json"))
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    pick = [int(i) for i in a.layers.split(",")] if a.layers else range(len(LAYERS))
    rows = []
    for i in pick:
        try:
            r = layer(*LAYERS[i], a.batch, a.inductor, getattr(torch, a.dtype))
        except Exception as exc:  # noqa: BLE001 - a probe reports and carries on
            r = {"layer": LAYERS[i][0], "error": f"{type(exc).__name__}: {exc}"[:2000]}
        rows.append(r)
        keys = ("torch_fwd_ms", "fused_fwd_ms", "fwd_x_torch", "torch_bwd_ms", "fused_bwd_ms",
                "bwd_x_torch", "fwd_x_inductor", "bwd_x_inductor")
        print(r["layer"], {k: round(r[k], 3) for k in keys if k in r},
              {k: r[k] for k in ("fused_err", "torch_err", "error", "fused_error") if k in r},
              flush=True)
    with open(a.json, "w") as f:
        json.dump({"batch": a.batch, "dtype": a.dtype, "cudnn": torch.backends.cudnn.version(),
                   "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print("wrote", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
