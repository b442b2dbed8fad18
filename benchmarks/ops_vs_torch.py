"""Activation, softmax and pooling: pycudnn (cuDNN's legacy kernels) against PyTorch's own kernels,
in one process, on ResNet-50's shapes at batch 32.

    PYTHONPATH=. python3 benchmarks/ops_vs_torch.py --json $OUT/ops_vs_torch.json

Cells (forward and backward each): ReLU and sigmoid on the activations after each stage
(32x64x112x112, 32x256x56x56, 32x512x28x28, 32x1024x14x14, 32x2048x7x7), max pooling 3x3 stride 2
padding 1 on 32x64x112x112 (the stem), global average pooling 7x7 on 32x2048x7x7 and softmax over
32x1000 (the classifier), in bfloat16 channels-last and float32 NCHW. Both sides get torch tensors
and allocate their outputs. PyTorch: ``F.relu``, ``torch.sigmoid``, ``F.max_pool2d``,
``F.avg_pool2d``, ``F.softmax``, and for the backward passes the ``torch.ops.aten.*_backward``
functions autograd calls (``threshold_backward``, ``sigmoid_backward``,
``max_pool2d_with_indices_backward`` with the indices of its forward, ``avg_pool2d_backward``,
``_softmax_backward_data``).

Two figures, never mixed:

* **kernel time** (us per call): ``gpu_timing.compare_gated``: batches of back-to-back calls
  queued behind a gate the host opens after the last call, CUDA events around them, so no host
  launch gap is counted (the shapes are large as well, so the gap would be small anyway); the two
  sides interleaved, order rotated; the median over batches;
* **host time** (us per call): ``gpu_timing.compare_host`` on tiny shapes (1x8x8x8, 2x10) where
  the GPU work is negligible: ``time.perf_counter`` over chunks of back-to-back calls.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

import gpu_timing  # this script's folder is on sys.path

STAGES = [(32, 64, 112, 112), (32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14),
          (32, 2048, 7, 7)]
CONFIGS = {"bf16-nhwc": ("bfloat16", True), "fp32-nchw": ("float32", False)}


def _cells(torch: Any, dtype: Any, channels_last: bool) -> list[tuple[str, Callable[[], Any],
                                                                     Callable[[], Any]]]:
    """(name, torch call, pycudnn call) for every cell of one configuration."""
    import torch.nn.functional as F

    from pycudnn.ops.activation import activation_backward, activation_forward
    from pycudnn.ops.pooling import pooling_backward, pooling_forward
    from pycudnn.ops.softmax import softmax_backward, softmax_forward

    aten = torch.ops.aten
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def make(shape: Sequence[int]) -> Any:
        return torch.randn(*shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)

    cells: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = []
    for shape in STAGES:
        x = make(shape)
        dy = make(shape)
        name = "x".join(map(str, shape))
        y_relu, y_sig = F.relu(x), torch.sigmoid(x)
        cells += [
            (f"relu fwd {name}", lambda x=x: F.relu(x), lambda x=x: activation_forward(x)),
            (f"relu bwd {name}", lambda y=y_relu, dy=dy: aten.threshold_backward(dy, y, 0),
             lambda x=x, y=y_relu, dy=dy: activation_backward(y, dy, x)),
            (f"sigmoid fwd {name}", lambda x=x: torch.sigmoid(x),
             lambda x=x: activation_forward(x, "sigmoid")),
            (f"sigmoid bwd {name}", lambda y=y_sig, dy=dy: aten.sigmoid_backward(dy, y),
             lambda x=x, y=y_sig, dy=dy: activation_backward(y, dy, x, "sigmoid")),
        ]
    x = make(STAGES[0])
    y, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    dy = torch.randn_like(y)
    cells += [
        ("maxpool 3x3/2 p1 fwd", lambda: F.max_pool2d(x, 3, 2, 1),
         lambda: pooling_forward(x, 3, stride=2, padding=1)),
        ("maxpool 3x3/2 p1 bwd",
         lambda: aten.max_pool2d_with_indices_backward(dy, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx),
         lambda: pooling_backward(y, dy, x, 3, stride=2, padding=1)),
    ]
    xg = make(STAGES[-1])
    yg = F.avg_pool2d(xg, 7)
    dyg = torch.randn_like(yg)
    cells += [
        ("global avgpool 7x7 fwd", lambda: F.avg_pool2d(xg, 7),
         lambda: pooling_forward(xg, 7, mode="average_include_padding")),
        ("global avgpool 7x7 bwd",
         lambda: aten.avg_pool2d_backward(dyg, xg, [7, 7], [7, 7], [0, 0], False, True, None),
         lambda: pooling_backward(yg, dyg, xg, 7, mode="average_include_padding")),
    ]
    logits = torch.randn(32, 1000, device="cuda", dtype=dtype)
    ys = F.softmax(logits, dim=1)
    dys = torch.randn_like(ys)
    cells += [
        ("softmax 32x1000 fwd", lambda: F.softmax(logits, dim=1), lambda: softmax_forward(logits)),
        ("softmax 32x1000 bwd", lambda: aten._softmax_backward_data(dys, ys, 1, logits.dtype),
         lambda: softmax_backward(ys, dys)),
    ]
    settle([fp for _, _, fp in cells])
    # the two sides compute the same thing (checked once, before timing)
    for name, ft, fp in cells:
        a, b = ft(), torch.from_dlpack(fp())
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        if not torch.allclose(a.float(), b.float(), rtol=tol, atol=tol):
            raise AssertionError(f"{name}: pycudnn and PyTorch disagree "
                                 f"(max difference {(a.float() - b.float()).abs().max().item()})")
    return cells


def settle(fns: Sequence[Callable[[], Any]]) -> None:
    """Call each function until pycudnn has chosen its kernel for the signature: the operations
    switch to runtime-compiled kernels built in the background after a few calls
    (pycudnn.ops.runtime_kernels), so the timing starts after the builds are done, as in a
    training loop."""
    from pycudnn.ops import runtime_kernels

    for fn in fns:
        for _ in range(4):
            fn()
    runtime_kernels.wait(timeout=300)


def _host_cells(torch: Any) -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    import torch.nn.functional as F

    from pycudnn.ops.activation import activation_forward
    from pycudnn.ops.pooling import pooling_forward
    from pycudnn.ops.softmax import softmax_forward

    x = torch.randn(1, 8, 8, 8, device="cuda")
    logits = torch.randn(2, 10, device="cuda")
    return [("relu 1x8x8x8", lambda: F.relu(x), lambda: activation_forward(x)),
            ("sigmoid 1x8x8x8", lambda: torch.sigmoid(x), lambda: activation_forward(x, "sigmoid")),
            ("maxpool 3x3/2 p1 1x8x8x8", lambda: F.max_pool2d(x, 3, 2, 1),
             lambda: pooling_forward(x, 3, stride=2, padding=1)),
            ("softmax 2x10", lambda: F.softmax(logits, dim=1), lambda: softmax_forward(logits))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    gate = gpu_timing.get_gate(torch.cuda.current_device(), torch)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "reps": args.reps, "batches": args.batches, "kernel_us": {},
                           "host_us": {}}
    import pycudnn

    out["cudnn"] = pycudnn.cudnn_version()
    for config in args.configs:
        dtype_name, channels_last = CONFIGS[config]
        dtype = getattr(torch, dtype_name)
        rows = out["kernel_us"].setdefault(config, {})
        for name, ft, fp in _cells(torch, dtype, channels_last):
            try:
                s = gpu_timing.compare_gated({"torch": ft, "pycudnn": fp}, stream, args.reps,
                                             args.batches, gate=gate,
                                             synchronize=torch.cuda.synchronize)
                t, p = gpu_timing.median(s["torch"]), gpu_timing.median(s["pycudnn"])
                rows[name] = {"torch": t, "pycudnn": p, "ratio": gpu_timing.ratio(p, t)}
            except Exception as exc:  # one failing cell must not hide the others
                rows[name] = {"error": gpu_timing.error_text(exc)}
            print_row(config, name, rows[name])
    settle([fp for _, _, fp in _host_cells(torch)])
    host = gpu_timing.compare_host(
        {f"{side}: {name}": fn for name, ft, fp in _host_cells(torch)
         for side, fn in (("torch", ft), ("pycudnn", fp))},
        args.host_reps, synchronize=torch.cuda.synchronize)
    for name, _, _ in _host_cells(torch):
        t, p = host[f"torch: {name}"]["median"], host[f"pycudnn: {name}"]["median"]
        out["host_us"][name] = {"torch": t, "pycudnn": p, "ratio": gpu_timing.ratio(p, t)}
        print_row("host", name, out["host_us"][name])
    return out


def print_row(config: str, name: str, row: dict[str, Any]) -> None:
    if "error" in row:
        print(f"{config:10} {name:34} error: {row['error']}")
    else:
        print(f"{config:10} {name:34} {row['torch']:10.2f} {row['pycudnn']:10.2f} "
              f"{row['ratio']:7.2f}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--reps", type=int, default=100, help="calls per gated batch")
    ap.add_argument("--batches", type=int, default=5, help="gated batches per cell and side")
    ap.add_argument("--host-reps", type=int, default=4000, help="calls per host-time figure")
    ap.add_argument("--legacy-kernels", action="store_true",
                    help="keep pycudnn on cuDNN's legacy kernels (no runtime-compiled ones)")
    args = ap.parse_args(argv)
    if args.legacy_kernels:
        from pycudnn.ops import runtime_kernels

        runtime_kernels.configure(enabled=False)
    print(f"{'config':10} {'cell':34} {'torch us':>10} {'pycudnn us':>10} {'ratio':>7}  "
          "(ratio = pycudnn / torch; kernel time per call, host time for 'host')")
    out = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
