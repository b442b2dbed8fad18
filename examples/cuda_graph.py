"""Capture a convolution training step (forward, backward data, backward filter) into a CUDA
graph, replay it on new data, and compare with running the same step eagerly.

Needs: an NVIDIA GPU; nothing beyond pycudnn's own dependencies.
Run:  python cuda_graph.py
Only cuda-python (cuda.bindings) and pycudnn: the graph is captured with
cudaStreamBeginCapture / cudaStreamEndCapture on a non-default stream, instantiated once and
launched with cudaGraphLaunch.

The rules for capturing pycudnn calls:

1. Warm up first: run the step once with the same shapes, buffers and flags, so that the
   algorithm search (heuristics or measurement) is done and cached; a measuring search during
   capture raises ``pycudnn.StreamCaptureError``.
2. Capture into buffers that outlive the graph (``out=``): the graph replays on the same
   addresses, so new data is copied into the captured input buffers before each launch.
   Workspaces are allocated and freed inside the graph (stream-ordered allocation).
"""

from __future__ import annotations

if __name__ == "__main__":  # before any optional import, so that --help works without it
    import argparse

    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import gc
import sys

import numpy as np
from cuda.bindings import runtime as rt

import pycudnn


def check(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


N, C, H, W, K = 16, 32, 28, 28, 64
FLAGS = dict(padding=1, allow_tf32=False)


def step(x, w, gy, y, gx, gw, stream):
    """One forward + backward (data and filter) step into the given buffers."""
    pycudnn.convolution(x, w, out=y, stream=stream, **FLAGS)
    pycudnn.convolution_backward_data(gy, w, x.shape, out=gx, stream=stream, **FLAGS)
    pycudnn.convolution_backward_filter(x, gy, w.shape, out=gw, stream=stream, **FLAGS)


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def main() -> int:
    stream = int(check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreate"))
    rng = np.random.default_rng(0)
    # the captured buffers
    x = pycudnn.from_numpy(rng.standard_normal((N, C, H, W)).astype(np.float32), stream=stream)
    w = pycudnn.from_numpy((rng.standard_normal((K, C, 3, 3)) * 0.1).astype(np.float32),
                           stream=stream)
    gy = pycudnn.from_numpy(rng.standard_normal((N, K, H, W)).astype(np.float32), stream=stream)
    y = pycudnn.empty((N, K, H, W), "float32", stream=stream)
    gx = pycudnn.empty((N, C, H, W), "float32", stream=stream)
    gw = pycudnn.empty((K, C, 3, 3), "float32", stream=stream)

    # 1. warm up: searches and caches the algorithms for these shapes
    step(x, w, gy, y, gx, gw, stream)
    check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    # 2. capture the step on the non-default stream
    mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    check(rt.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
    try:
        step(x, w, gy, y, gx, gw, stream)
    finally:
        graph = check(rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
    _err, _nodes, n_nodes = rt.cudaGraphGetNodes(graph)
    graph_exec = check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
    print(f"cuda_graph: captured forward + backward data + backward filter of "
          f"x {(N, C, H, W)}, w {(K, C, 3, 3)} into a CUDA graph of {n_nodes} nodes")
    ok = n_nodes > 0

    # 3. replay on new data, copied into the captured input buffers; compare with eager runs
    worst = 0.0
    for trial in range(3):
        new_x = pycudnn.from_numpy(rng.standard_normal(x.shape).astype(np.float32), stream=stream)
        new_gy = pycudnn.from_numpy(rng.standard_normal(gy.shape).astype(np.float32), stream=stream)
        for dst, src in ((x, new_x), (gy, new_gy)):
            check(rt.cudaMemcpyAsync(dst.ptr, src.ptr, src.nbytes,
                                     rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync")
        check(rt.cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch")
        replayed = [t.numpy(stream) for t in (y, gx, gw)]

        eager_out = [pycudnn.empty(t.shape, "float32", stream=stream) for t in (y, gx, gw)]
        step(new_x, w, new_gy, *eager_out, stream)
        eager = [t.numpy(stream) for t in eager_out]
        errs = [rel_err(r, e) for r, e in zip(replayed, eager)]
        worst = max(worst, *errs)
        print(f"cuda_graph: replay {trial + 1}: relative difference to eager: y {errs[0]:.1e}, "
              f"grad x {errs[1]:.1e}, grad w {errs[2]:.1e}")
    ok &= worst < 1e-5

    check(rt.cudaGraphExecDestroy(graph_exec), "cudaGraphExecDestroy")
    check(rt.cudaGraphDestroy(graph), "cudaGraphDestroy")
    check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    # pycudnn frees memory on the stream it was allocated on: drop the tensors before the stream
    del x, w, gy, y, gx, gw, new_x, new_gy, eager_out
    gc.collect()
    check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    check(rt.cudaStreamDestroy(stream), "cudaStreamDestroy")

    print(f"cuda_graph: graph replays match eager execution (worst relative difference "
          f"{worst:.1e}): {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if not pycudnn.device_count():
        sys.exit("cuda_graph.py needs an NVIDIA GPU with a working driver; none "
                 "is usable here (`pycudnn info` says why)")
    sys.exit(main())
