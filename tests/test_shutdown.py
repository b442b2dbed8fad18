"""Interpreter shutdown with live pycudnn objects prints nothing and exits 0.

Each test runs a fresh interpreter that creates tensors, legacy and backend descriptors (and, on a
GPU, handles, plans, prepared convolutions, streams with queued work, threads holding handles,
DLPack exports) and then exits without cleaning anything up: no close(), no synchronize, objects
in reference cycles, in daemon threads still running, in module globals. The process must exit
with status 0 and write nothing on stderr (no "Exception ignored in", no segfault, no CUDA error
text from a destroy after the driver shut down). The child writes a marker on stderr just before
it starts exiting, so a failure says whether the output came from the run or from the shutdown.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "=== pycudnn shutdown test: exiting ==="

COMMON = textwrap.dedent(f"""
    import gc, sys, threading
    MARKER = {MARKER!r}

    def leave(how="return"):
        print("done", flush=True)
        sys.stderr.write(MARKER + "\\n")
        sys.stderr.flush()
        if how == "sys.exit":
            sys.exit(0)
""")

CPU_CHILD = COMMON + textwrap.dedent("""
    import pycudnn
    from pycudnn.ffi import backend as B
    from pycudnn.cudnn import descriptors as D
    from pycudnn import errors as E

    x = pycudnn.tensor_from_pointer(0x7F0000000000, (2, 4, 8, 8), "float32")
    w = pycudnn.tensor_from_pointer(0x7F1000000000, (8, 4, 3, 3), "float32")
    v = x.narrow(0, 1, 1).unsqueeze(4)
    keep = [D.TensorDescriptor((2, 4, 8, 8), "float32"),
            D.FilterDescriptor((8, 4, 3, 3), "float16", "NHWC"),
            D.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), groups=2, dtype="bfloat16"),
            D.ActivationDescriptor(), D.OpTensorDescriptor(),
            B.BackendDescriptor(B.DescriptorType.TENSOR),
            B.BackendDescriptor(B.DescriptorType.CONVOLUTION)]
    closed = D.TensorDescriptor((1, 2, 3), "float64")
    closed.close()
    cycle = [D.TensorDescriptor((1, 2, 3), "float64"), B.BackendDescriptor(B.DescriptorType.OPERATIONGRAPH)]
    cycle.append(cycle)
    del cycle
    for bad in (lambda: D.TensorDescriptor((2, -1, 3), "float32", validate=False),  # failed sets
                lambda: pycudnn.convolution(x, w)):                                  # no device
        try:
            bad()
        except (E.CudnnError, E.NoDeviceError):
            pass
    capsule = x.__dlpack__()

    ready = threading.Event()
    def holder():  # a daemon thread still holding descriptors when the interpreter exits
        mine = [D.TensorDescriptor((2, 3, 4), "float16"), B.BackendDescriptor(B.DescriptorType.ENGINEHEUR)]
        ready.set()
        threading.Event().wait()
    threading.Thread(target=holder, daemon=True).start()
    ready.wait()
    def late():  # a non-daemon thread that ends after the main thread
        import time
        time.sleep(0.2)
        more = [D.FilterDescriptor((8, 4, 3), "float32")]
    threading.Thread(target=late).start()
    leave(sys.argv[1])
""")

GPU_CHILD = COMMON + textwrap.dedent("""
    import numpy as np
    import pycudnn
    from cuda.bindings import runtime as rt

    rng = np.random.default_rng(0)
    x = pycudnn.from_numpy(rng.standard_normal((4, 16, 16, 16)).astype(np.float32))
    w = pycudnn.from_numpy(rng.standard_normal((32, 16, 3, 3)).astype(np.float32))
    xh = pycudnn.from_numpy(rng.standard_normal((4, 16, 16, 16)), dtype="float16", memory_format="channels_last")
    wh = pycudnn.from_numpy(rng.standard_normal((32, 16, 3, 3)), dtype="float16", memory_format="channels_last")
    b = pycudnn.from_numpy(rng.standard_normal(32).astype(np.float32))
    keep = []
    for engine in ("graph", "v7"):
        for benchmark in (False, True):
            y = pycudnn.convolution(x, w, b, padding=1, activation="relu", engine=engine,
                                    benchmark=benchmark, tuning_db=False)
            keep.append(y)
            keep.append(pycudnn.convolution_backward_filter(x, y, w.shape, padding=1, engine=engine,
                                                            tuning_db=False))
            keep.append(pycudnn.convolution_add_relu(xh, wh, pycudnn.empty((4, 32, 16, 16), "float16",
                        memory_format="channels_last"), padding=1, engine=engine, tuning_db=False))
    try:
        keep.append(pycudnn.prepare_convolution(x, w, padding=1))
    except Exception:  # the prepared API may not take these arguments: shutdown is the point here
        pass
    err, stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
    for _ in range(20):  # queued work, never synchronized, on a stream never destroyed
        keep.append(pycudnn.convolution(x, w, padding=1, stream=int(stream)))
    capsule = keep[0].__dlpack__()
    cycle = [pycudnn.empty((1024, 1024)), pycudnn.convolution(x, w, padding=1)]
    cycle.append(cycle)
    del cycle

    def worker():  # an ended thread: its handle went back to the pool
        pycudnn.convolution(x, w, padding=1)
    t = threading.Thread(target=worker)
    t.start(); t.join()
    ready = threading.Event()
    def holder():  # a daemon thread holding a handle, a plan run and a tensor at exit
        mine = pycudnn.convolution(xh, wh, padding=1, engine="graph")
        ready.set()
        threading.Event().wait()
    threading.Thread(target=holder, daemon=True).start()
    ready.wait()
    def late():  # a non-daemon thread still convolving while the main thread exits
        for _ in range(50):
            pycudnn.convolution(x, w, padding=1, stream=int(stream))
    threading.Thread(target=late).start()
    if len(sys.argv) > 2 and sys.argv[2] == "torch":
        import torch
        tx = torch.randn(2, 16, 8, 8, device="cuda")
        tw = torch.randn(8, 16, 3, 3, device="cuda")
        ty = pycudnn.convolution(tx, tw, padding=1, stream=torch.cuda.current_stream())
        keep.append(torch.from_dlpack(ty))
    leave(sys.argv[1])
""")


def run_child(code: str, *args: str, flags=()) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYCUDNN_LOG", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, *flags, "-c", code, *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)


def check_clean_exit(proc: subprocess.CompletedProcess) -> None:
    during, _, after = proc.stderr.partition(MARKER + "\n")
    if MARKER not in proc.stderr:
        during, after = proc.stderr, ""
    assert proc.stdout.strip().endswith("done"), \
        f"the child did not reach its end (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert after == "", f"output on stderr during interpreter shutdown:\n{after[-4000:]}"
    assert during == "", f"output on stderr while the child ran (before exiting):\n{during[-4000:]}"
    assert proc.returncode == 0, f"exit status {proc.returncode}"


@pytest.mark.parametrize("how", ["return", "sys.exit"])
@pytest.mark.parametrize("flags", [(), ("-X", "dev", "-W", "error")], ids=["plain", "dev-mode"])
def test_cpu_objects_at_exit(how, flags):
    """CPU objects (views, legacy and backend descriptors; failed sets; a DLPack capsule; threads
    holding descriptors) at exit. With ``-X dev -W error`` a ResourceWarning or any warning in a
    finalizer would show."""
    check_clean_exit(run_child(CPU_CHILD, how, flags=flags))


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["return", "sys.exit"])
def test_gpu_objects_at_exit(how):
    """Handles, plans (both engines, heuristics and benchmark), prepared convolutions, device
    buffers, work queued on a stream never synchronized, a thread holding a handle and one still
    convolving while the interpreter exits."""
    check_clean_exit(run_child(GPU_CHILD, how))


@pytest.mark.gpu
def test_gpu_objects_at_exit_with_torch():
    """The same with PyTorch in the process (its own CUDA state and atexit handlers) and a torch
    tensor viewing a pycudnn output through DLPack."""
    pytest.importorskip("torch")
    check_clean_exit(run_child(GPU_CHILD, "return", "torch"))
