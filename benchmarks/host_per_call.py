"""Host time per call on a tiny convolution, where the GPU work is negligible and the host path is
all that is measured: pycudnn's remembered and prepared calls against ``F.conv2d``, same process.

The convolution is 1x8x8x8 input, eight 3x3 filters, padding 1, float32 (TF32 allowed for both).
Each figure is the best of 5 rounds of ``--calls`` back-to-back calls, synchronized at the end of
the round, in microseconds per call. Columns:

* ``F.conv2d``: PyTorch with torch tensors in, output allocated (what its users do);
* ``torch in``: ``pycudnn.convolution`` with torch tensors in, output allocated;
* ``torch in, out=``: the same with a torch output tensor passed as ``out=``;
* ``views, out=``: pycudnn views (``pycudnn.as_tensor`` made once) in and ``out=``;
* ``prepared, torch in`` / ``prepared, views``: a ``prepare_convolution`` object called with
  ``out=``; and the backward passes through their remembered path with views and ``out=``;
* both engines for the views and prepared columns.

Run it with the pycudnn to measure on ``PYTHONPATH`` (e.g. two checkouts to compare a change):

    PYTHONPATH=. python3 benchmarks/host_per_call.py --json host.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any, Callable


def per_call(torch: Any, fn: Callable[[], Any], calls: int) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def measure(calls: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    import pycudnn

    torch.backends.cudnn.allow_tf32 = True
    x = torch.randn(1, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    y = torch.empty(1, 8, 8, 8, device="cuda")
    X, W, Y = pycudnn.as_tensor(x), pycudnn.as_tensor(w), pycudnn.as_tensor(y)
    dW = pycudnn.as_tensor(torch.empty_like(w))
    out: dict[str, Any] = {"pycudnn": pycudnn.__file__, "calls": calls}
    out["F.conv2d"] = per_call(torch, lambda: F.conv2d(x, w, padding=1), calls)
    for engine in ("graph", "v7"):
        f = dict(padding=1, engine=engine)
        out[f"{engine}: torch in"] = per_call(torch, lambda: pycudnn.convolution(x, w, **f), calls)
        out[f"{engine}: torch in, out="] = per_call(
            torch, lambda: pycudnn.convolution(x, w, out=y, **f), calls)
        out[f"{engine}: views, out="] = per_call(
            torch, lambda: pycudnn.convolution(X, W, out=Y, **f), calls)
        conv = pycudnn.prepare_convolution(X, W, **f)
        out[f"{engine}: prepared, torch in"] = per_call(torch, lambda: conv(x, w, out=y), calls)
        out[f"{engine}: prepared, views"] = per_call(torch, lambda: conv(X, W, out=Y), calls)
        out[f"{engine}: backward data, views"] = per_call(
            torch, lambda: pycudnn.convolution_backward_data(Y, W, X.shape, out=X, **f), calls)
        out[f"{engine}: backward filter, views"] = per_call(
            torch, lambda: pycudnn.convolution_backward_filter(X, Y, W.shape, out=dW, **f), calls)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    out = measure(args.calls)
    for k, v in out.items():
        print(f"{k:32s} {v:.2f}" if isinstance(v, float) else f"{k:32s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
