"""A 2-D convolution on memory allocated with cuda-python alone (cuda.bindings), by raw pointers.

Needs: an NVIDIA GPU; nothing beyond pycudnn's own dependencies.
Run:  python conv2d_raw_pointers.py
No array library: cudaMalloc'd pointers are wrapped with pycudnn.tensor_from_pointer.
"""

if __name__ == "__main__":  # before any optional import, so that --help works without it
    import argparse

    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import sys

import numpy as np
from cuda.bindings import runtime as rt

import pycudnn


def check(err):
    err = err[0] if isinstance(err, tuple) else err
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")


def main():
    n, c, h, w_, k = 4, 8, 16, 16, 16
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((n, c, h, w_)).astype(np.float32)
    w_host = rng.standard_normal((k, c, 3, 3)).astype(np.float32)

    err, stream = rt.cudaStreamCreate()
    check(err)
    pointers = []
    for arr in (x_host, w_host):
        err, ptr = rt.cudaMalloc(arr.nbytes)
        check(err)
        check(rt.cudaMemcpy(ptr, arr.ctypes.data, arr.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
        pointers.append(ptr)
    y_bytes = n * k * h * w_ * 4
    err, y_ptr = rt.cudaMalloc(y_bytes)
    check(err)

    x = pycudnn.tensor_from_pointer(int(pointers[0]), x_host.shape, "float32")
    w = pycudnn.tensor_from_pointer(int(pointers[1]), w_host.shape, "float32")
    y = pycudnn.tensor_from_pointer(int(y_ptr), (n, k, h, w_), "float32")
    pycudnn.convolution(x, w, padding=1, out=y, stream=int(stream), allow_tf32=False)
    check(rt.cudaStreamSynchronize(stream))

    y_host = np.empty((n, k, h, w_), np.float32)
    check(rt.cudaMemcpy(y_host.ctypes.data, y_ptr, y_bytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))

    xp = np.pad(x_host.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((n, k, h, w_))
    for i in range(3):
        for j in range(3):
            ref += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + h, j:j + w_], w_host[:, :, i, j].astype(np.float64))
    err_rel = float(np.abs(y_host - ref).max() / np.abs(ref).max())
    print(f"conv2d_raw_pointers: output {(n, k, h, w_)} float32 on cudaMalloc'd memory, max relative "
          f"error vs float64 NumPy = {err_rel:.2e} ({'OK' if err_rel < 1e-5 else 'FAILED'})")
    for ptr in pointers + [y_ptr]:
        check(rt.cudaFree(ptr))
    check(rt.cudaStreamDestroy(stream))
    if err_rel >= 1e-5:
        raise SystemExit(1)


if __name__ == "__main__":
    if not pycudnn.device_count():
        sys.exit("conv2d_raw_pointers.py needs an NVIDIA GPU with a working driver; none "
                 "is usable here (`pycudnn info` says why)")
    main()
