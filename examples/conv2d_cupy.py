"""A 2-D convolution on CuPy arrays with pycudnn, checked against a float64 NumPy reference.

Needs: an NVIDIA GPU and CuPy (13 or 14):
  pip install "pycudnn-ctypes[cu12,examples-cu12] @ git+https://github.com/pycudnn/pycudnn"
  (CUDA 13: [cu13,examples-cu13]; in a clone of pycudnn: pip install ".[cu12,examples-cu12]").
Run:  python conv2d_cupy.py
CuPy arrays go in and come out without copies (the CUDA array interface both ways).
"""

if __name__ == "__main__":  # before any optional import, so that --help works without it
    import argparse

    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import sys

import numpy as np

try:
    import cupy as cp
except ImportError:
    sys.exit("conv2d_cupy.py needs CuPy, which is not installed: "
             'pip install "pycudnn-ctypes[cu12,examples-cu12] @ '
             'git+https://github.com/pycudnn/pycudnn" (CUDA 13: [cu13,examples-cu13])')

import pycudnn


def reference_conv2d(x, w, stride, padding):
    """Direct float64 convolution (cross-correlation) in NumPy."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - r) // stride + 1
    ow = (wd + 2 * padding - s) // stride + 1
    y = np.zeros((n, k, oh, ow))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            y += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j])
    return y


def main():
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((8, 16, 32, 32), dtype=cp.float32)
    w = rng.standard_normal((32, 16, 3, 3), dtype=cp.float32)
    b = rng.standard_normal(32, dtype=cp.float32)

    stream = cp.cuda.get_current_stream()
    y = pycudnn.convolution(x, w, b, stride=2, padding=1, stream=stream, allow_tf32=False)
    y_cp = cp.asarray(y)  # zero-copy: CuPy reads pycudnn's __cuda_array_interface__
    assert y_cp.data.ptr == y.ptr

    ref = reference_conv2d(cp.asnumpy(x).astype(np.float64), cp.asnumpy(w).astype(np.float64), 2, 1)
    ref += cp.asnumpy(b).astype(np.float64)[None, :, None, None]
    err = float(np.abs(cp.asnumpy(y_cp) - ref).max() / np.abs(ref).max())
    print(f"conv2d_cupy: output {tuple(y_cp.shape)} {y_cp.dtype}, max relative error vs float64 "
          f"NumPy = {err:.2e} ({'OK' if err < 1e-5 else 'FAILED'})")

    # backward passes on the same arrays
    gy = rng.standard_normal(y_cp.shape, dtype=cp.float32)
    gx = cp.asarray(pycudnn.convolution_backward_data(gy, w, x.shape, stride=2, padding=1, stream=stream))
    gw = cp.asarray(pycudnn.convolution_backward_filter(x, gy, w.shape, stride=2, padding=1, stream=stream))
    print(f"conv2d_cupy: grad_x {tuple(gx.shape)}, grad_w {tuple(gw.shape)}")
    if err >= 1e-5:
        raise SystemExit(1)


if __name__ == "__main__":
    if not pycudnn.device_count():
        sys.exit("conv2d_cupy.py needs an NVIDIA GPU with a working driver; none "
                 "is usable here (`pycudnn info` says why)")
    main()
