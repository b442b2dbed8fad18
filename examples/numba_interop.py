"""Numba device arrays in and out of pycudnn, without copies.

Needs: an NVIDIA GPU and Numba's CUDA target, numba-cuda:
  pip install "pycudnn-ctypes[cu12,examples-cu12] @ git+https://github.com/pycudnn/pycudnn"
  (CUDA 13: [cu13,examples-cu13]; in a clone of pycudnn: pip install ".[cu12,examples-cu12]").
Run:  python numba_interop.py

* In: ``numba.cuda.to_device`` arrays go straight into pycudnn (the CUDA array interface).
* Out: ``numba.cuda.as_cuda_array(pycudnn_tensor)`` views pycudnn's result, and ``out=`` writes
  into an array Numba allocated.
* Streams: the arrays are made on a Numba stream and ``pycudnn.current_stream(array)`` gives that
  stream to pycudnn, so everything is ordered on it.
* A ``@cuda.jit`` kernel then works on pycudnn's output in place.
"""

from __future__ import annotations

if __name__ == "__main__":  # before any optional import, so that --help works without it
    import argparse

    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import math
import sys

import numpy as np

try:
    from numba import cuda
except ImportError:
    sys.exit("numba_interop.py needs Numba with numba-cuda, which is not installed: "
             'pip install "pycudnn-ctypes[cu12,examples-cu12] @ '
             'git+https://github.com/pycudnn/pycudnn" (CUDA 13: [cu13,examples-cu13])')

import pycudnn


def reference_conv2d(x, w, padding):
    """Float64 cross-correlation, stride 1."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = h + 2 * padding - r + 1, wd + 2 * padding - s + 1
    y = np.zeros((n, k, oh, ow))
    for i in range(r):
        for j in range(s):
            y += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return y


def reference_backward_data(gy, w, padding):
    """Gradient of reference_conv2d with respect to x (stride 1): a full correlation with the
    flipped, transposed filter."""
    r = w.shape[2]
    w_t = np.flip(w, (2, 3)).transpose(1, 0, 2, 3)
    return reference_conv2d(gy, w_t, r - 1 - padding)


@cuda.jit
def relu_inplace(a):
    i = cuda.grid(1)
    if i < a.size and a[i] < 0:
        a[i] = 0


def device_pointer(a):
    """The device address of a Numba array (through the CUDA array interface)."""
    return a.__cuda_array_interface__["data"][0]


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def main() -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    gy = rng.standard_normal((4, 16, 12, 12)).astype(np.float32)
    ok = True

    stream = cuda.stream()
    x_d = cuda.to_device(x, stream=stream)  # Numba device arrays in
    w_d = cuda.to_device(w, stream=stream)
    s = pycudnn.current_stream(x_d)  # the stream x_d was made on
    print(f"numba_interop: Numba stream handle {s:#x} passed to pycudnn")

    y = pycudnn.convolution(x_d, w_d, padding=1, stream=s, allow_tf32=False)
    y_d = cuda.as_cuda_array(y)  # a Numba view of pycudnn's result: no copy
    same_memory = device_pointer(y_d) == y.ptr
    y_host = y_d.copy_to_host(stream=stream)
    stream.synchronize()
    err = rel_err(y_host, reference_conv2d(x.astype(np.float64), w.astype(np.float64), 1))
    good = err < 1e-5 and same_memory
    print(f"numba_interop: forward {tuple(y_d.shape)} viewed by Numba without a copy "
          f"({same_memory}), relative error vs float64 NumPy {err:.1e} ({'OK' if good else 'FAILED'})")
    ok &= good

    # out=: pycudnn writes into an array Numba allocated
    gy_d = cuda.to_device(gy, stream=stream)
    gx_d = cuda.device_array(x.shape, np.float32, stream=stream)
    gx_t = pycudnn.convolution_backward_data(gy_d, w_d, x.shape, padding=1, out=gx_d, stream=s,
                                             allow_tf32=False)
    same_memory = gx_t.ptr == device_pointer(gx_d)
    gx = gx_d.copy_to_host(stream=stream)
    stream.synchronize()
    err = rel_err(gx, reference_backward_data(gy.astype(np.float64), w.astype(np.float64), 1))
    good = err < 1e-5 and same_memory
    print(f"numba_interop: backward data written into a Numba array (out=, same memory "
          f"{same_memory}), relative error {err:.1e} ({'OK' if good else 'FAILED'})")
    ok &= good

    # a Numba kernel on pycudnn's output, in place
    flat = y_d.reshape(y_d.size)
    threads = 256
    try:
        relu_inplace[math.ceil(flat.size / threads), threads, stream](flat)
    except Exception as exc:  # e.g. no NVVM for Numba to compile with on this machine
        print(f"numba_interop: skipped the @cuda.jit kernel (Numba cannot compile here: "
              f"{type(exc).__name__}: {exc})")
    else:
        relu_host = y_d.copy_to_host(stream=stream)
        stream.synchronize()
        good = np.array_equal(relu_host, np.maximum(y_host, 0))
        print(f"numba_interop: @cuda.jit ReLU applied in place to pycudnn's output "
              f"({'OK' if good else 'FAILED'})")
        ok &= good

    print(f"numba_interop: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if not pycudnn.device_count():
        sys.exit("numba_interop.py needs an NVIDIA GPU with a working driver; none "
                 "is usable here (`pycudnn info` says why)")
    sys.exit(main())
