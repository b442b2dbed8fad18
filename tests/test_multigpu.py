"""Several GPUs (issue 7): tensors on device 1 run on device 1, per-device caches, two threads
driving two devices at once, and tensors on the wrong device for their partner or stream refused.

Needs a machine with at least two CUDA devices; elsewhere every test skips and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import reference as R


def _device_count() -> int:
    try:
        from pycudnn import memory

        return memory.device_count()
    except Exception:  # pragma: no cover - cuda.bindings missing
        return 0


N_DEVICES = _device_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(N_DEVICES < 2, reason=f"needs 2 CUDA devices; this machine has {N_DEVICES} "
                       "(run on a 2-GPU machine, e.g. nvidia-h200-x2, to cover issue 7's multi-GPU part)"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEO = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)


def _data(seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 8, 10, 10)).astype(dtype)
    w = rng.standard_normal((16, 8, 3, 3)).astype(dtype)
    return x, w, R.conv_forward(x, w, **GEO)


def _err(got, ref) -> float:
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


def _pointer_device(ptr: int) -> int:
    from pycudnn import memory

    return memory.pointer_device(ptr)


@pytest.fixture
def allocations(monkeypatch):
    """Every device allocation pycudnn makes while the test runs: (ptr, device it claims)."""
    from pycudnn import memory

    seen: list[tuple[int, int]] = []
    for name in ("allocate", "allocate_fast"):
        original = getattr(memory, name, None)
        if original is None:
            continue

        def wrapper(nbytes, device=None, stream=None, _orig=original):
            buf = _orig(nbytes, device, stream)
            if buf.nbytes:
                seen.append((buf.ptr, buf.device))
            return buf
        monkeypatch.setattr(memory, name, wrapper)
    try:
        from pycudnn import prepared

        for name in ("allocate_fast",):
            if hasattr(prepared, name):
                monkeypatch.setattr(prepared, name, getattr(memory, name))
        if hasattr(prepared, "thread_workspace"):
            original_tw = prepared.thread_workspace

            def tw(nbytes, device, stream, _orig=original_tw):
                ptr = _orig(nbytes, device, stream)
                if ptr:
                    seen.append((ptr, device))
                return ptr
            monkeypatch.setattr(prepared, "thread_workspace", tw)
    except ImportError:
        pass
    return seen


@pytest.mark.parametrize("engine", ["graph", "v7"])
@pytest.mark.parametrize("benchmark", [False, True])
def test_tensors_on_device_1_run_on_device_1(engine, benchmark, allocations):
    import pycudnn
    from cuda.bindings import runtime as rt
    from pycudnn import handle as H

    x, w, ref = _data(1)
    X, W = pycudnn.from_numpy(x, device=1), pycudnn.from_numpy(w, device=1)
    assert X.device == 1 and _pointer_device(X.ptr) == 1
    rt.cudaSetDevice(1)
    err, s1 = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
    assert not int(err)
    rt.cudaSetDevice(0)
    try:
        for stream in (None, int(s1)):  # the legacy default stream, then a stream of device 1
            for _ in range(3):  # search, cached, prepared fast path
                y = pycudnn.convolution(X, W, padding=1, engine=engine, benchmark=benchmark,
                                        allow_tf32=False, tuning_db=False, stream=stream)
                assert y.device == 1 and _pointer_device(y.ptr) == 1
                assert _err(y.numpy(stream=stream), ref) <= 3e-5
                assert rt.cudaGetDevice()[1] == 0, "the caller's current device was not restored"
    finally:
        rt.cudaSetDevice(1)
        rt.cudaStreamSynchronize(s1)
        rt.cudaStreamDestroy(s1)
        rt.cudaSetDevice(0)
    assert allocations, "no allocation was seen"
    wrong = [(hex(p), d, _pointer_device(p)) for p, d in allocations if _pointer_device(p) != 1]
    assert not wrong, f"workspaces/outputs allocated off device 1: {wrong}"
    assert 1 in H._thread_handles().handles, "no handle for device 1 in this thread"


def test_caches_are_per_device():
    """The same shapes on devices 0 and 1: two cache entries (the key holds the device), each
    record built on its own device (a plan from device 0 never runs on device 1)."""
    import pycudnn
    from pycudnn import algos

    x, w, ref = _data(2)
    pycudnn.clear_caches()
    for dev in (0, 1, 0, 1):
        y = pycudnn.convolution(pycudnn.from_numpy(x, device=dev), pycudnn.from_numpy(w, device=dev),
                                padding=1, allow_tf32=False, tuning_db=False)
        assert y.device == dev and _err(y.numpy(), ref) <= 3e-5
    devices = sorted(p.device for p, _ in algos.caches["forward"].items()
                     if p.input_shape == x.shape)
    assert devices == [0, 1], devices


def test_tuning_records_follow_the_device_model(tmp_path):
    """A benchmark choice stored by a device-0 process is reused on device 1 only when both are the
    same model (the record's key holds the GPU's identity, not the ordinal), and then runs right."""
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        import pycudnn
        from pycudnn import tuning_db
        sys.path.insert(0, "tests")
        import reference as R
        dev = int(sys.argv[1])
        rng = np.random.default_rng(3)
        x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
        w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
        y = pycudnn.convolution(pycudnn.from_numpy(x, device=dev), pycudnn.from_numpy(w, device=dev),
                                padding=1, benchmark=True, allow_tf32=False, tuning_db=True)
        ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)
        err = float(np.abs(y.numpy() - ref).max() / np.abs(ref).max())
        from pycudnn import algos
        sources = [getattr(r, "source", "?") for p, r in algos.caches["forward"].items()]
        print(json.dumps({"err": err, "sources": sources, "identity": tuning_db.device_identity(dev),
                          "entries": len(tuning_db.entries())}))
    """)
    env = dict(os.environ, PYCUDNN_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    out = []
    for dev in (0, 1):
        proc = subprocess.run([sys.executable, "-c", code, str(dev)], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = out
    assert first["err"] <= 3e-5 and second["err"] <= 3e-5, out
    assert first["entries"] >= 1
    if first["identity"] == second["identity"]:
        assert "tuning-db" in second["sources"], f"same model, record not reused: {out}"
    else:
        assert "tuning-db" not in second["sources"], f"another model reused device 0's record: {out}"


@pytest.mark.parametrize("engine", ["graph", "v7"])
def test_two_threads_drive_two_devices_at_once(engine):
    import pycudnn

    x, w, ref = _data(4)
    inputs = {d: (pycudnn.from_numpy(x, device=d), pycudnn.from_numpy(w, device=d)) for d in (0, 1)}
    barrier = threading.Barrier(2)
    errors, wrong, done = [], [], {0: 0, 1: 0}

    def drive(dev):
        try:
            X, W = inputs[dev]
            barrier.wait()
            for _ in range(200):
                y = pycudnn.convolution(X, W, padding=1, engine=engine, allow_tf32=False, tuning_db=False)
                if y.device != dev:
                    wrong.append((dev, "device", y.device))
                e = _err(y.numpy(), ref)
                if e > 3e-5:
                    wrong.append((dev, "error", e))
                done[dev] += 1
        except BaseException as exc:
            errors.append((dev, repr(exc)))

    threads = [threading.Thread(target=drive, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not wrong, wrong[:10]
    assert done == {0: 200, 1: 200}


def _refused(fn, match):
    with pytest.raises(ValueError, match=match):
        fn()


def test_partner_on_another_device_is_refused():
    import pycudnn

    x, w, _ = _data(5)
    z = np.zeros((2, 16, 10, 10), np.float32)
    on = lambda a, d: pycudnn.from_numpy(a, device=d)  # noqa: E731
    X0, W0, W1, Z1 = on(x, 0), on(w, 0), on(w, 1), on(z, 1)
    b1 = on(np.zeros(16, np.float32), 1)
    for engine in ("graph", "v7"):
        pycudnn.convolution(X0, W0, padding=1, engine=engine)  # prepare the fast path first
        pycudnn.convolution(X0, W0, padding=1, engine=engine)
        _refused(lambda: pycudnn.convolution(X0, W1, padding=1, engine=engine), "device|cuda:")
        _refused(lambda: pycudnn.convolution(X0, W0, b1, padding=1, engine=engine), "bias|device|cuda:")
        _refused(lambda: pycudnn.convolution(X0, W0, padding=1, engine=engine,
                                             out=pycudnn.empty((2, 16, 10, 10), device=1)), "out|device|cuda:")
        _refused(lambda: pycudnn.convolution_add_relu(X0, W0, Z1, padding=1, engine=engine), "z|device|cuda:")
        _refused(lambda: pycudnn.convolution_backward_data(on(z, 1), W0, x.shape, padding=1, engine=engine),
                 "device|cuda:")
        _refused(lambda: pycudnn.convolution_backward_filter(X0, on(z, 1), w.shape, padding=1, engine=engine),
                 "device|cuda:")

# The next cases would make cuDNN touch memory or streams of another device if pycudnn let them
# through: each runs in a subprocess, so an illegal address cannot poison this process.
CHILD = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    import pycudnn
    from cuda.bindings import runtime as rt
    kind, engine = sys.argv[1], sys.argv[2]
    x0 = pycudnn.from_numpy(np.ones((2, 8, 10, 10), np.float32), device=0)
    w0 = pycudnn.from_numpy(np.ones((16, 8, 3, 3), np.float32), device=0)
    x1 = pycudnn.from_numpy(np.ones((2, 8, 10, 10), np.float32), device=1)
    w1 = pycudnn.from_numpy(np.ones((16, 8, 3, 3), np.float32), device=1)
    b0 = pycudnn.from_numpy(np.zeros(16, np.float32), device=0)
    b1 = pycudnn.from_numpy(np.zeros(16, np.float32), device=1)
    z0 = pycudnn.from_numpy(np.zeros((2, 16, 10, 10), np.float32), device=0)
    z1 = pycudnn.from_numpy(np.zeros((2, 16, 10, 10), np.float32), device=1)
    rt.cudaSetDevice(0)
    err, s0 = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
    kw = dict(padding=1, engine=engine, tuning_db=False)
    if kind == "stream":        # tensors on device 1, a stream of device 0
        call = lambda: pycudnn.convolution(x1, w1, stream=int(s0), **kw)
    elif kind == "prepared_bias":   # the prepared fast path, then a bias on device 1
        pycudnn.convolution(x0, w0, b0, **kw); pycudnn.convolution(x0, w0, b0, **kw)
        call = lambda: pycudnn.convolution(x0, w0, b1, **kw)
    elif kind == "prepared_z":      # the prepared fast path, then a residual z on device 1
        pycudnn.convolution_add_relu(x0, w0, z0, **kw); pycudnn.convolution_add_relu(x0, w0, z0, **kw)
        call = lambda: pycudnn.convolution_add_relu(x0, w0, z1, **kw)
    elif kind == "prepared_out":    # the prepared fast path, then out= on device 1
        pycudnn.convolution(x0, w0, **kw); pycudnn.convolution(x0, w0, **kw)
        call = lambda: pycudnn.convolution(x0, w0, out=pycudnn.empty((2, 16, 10, 10), device=1), **kw)
    out = {}
    try:
        y = call()
        y.numpy()
        out["outcome"] = "accepted"
    except Exception as exc:
        out["outcome"] = type(exc).__name__
        out["message"] = str(exc).split("\n")[0][:300]
    for d in (0, 1):
        rt.cudaSetDevice(d)
        err, = rt.cudaDeviceSynchronize()
        out[f"sticky{d}"] = str(err) if int(err) else None
    print(json.dumps(out))
""")


@pytest.mark.parametrize("engine", ["graph", "v7"])
@pytest.mark.parametrize("kind,words", [
    ("stream", "stream"), ("prepared_bias", "bias"), ("prepared_z", "z"), ("prepared_out", "out")])
def test_wrong_device_is_refused_without_touching_it(kind, words, engine):
    """A stream of device 0 for tensors on device 1, and (after the call signature was prepared)
    a bias, residual or out= on another device than the input: a clear error naming it, before any
    work, with no crash and no poisoned context."""
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, engine], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, f"the child crashed (rc {proc.returncode}): {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["sticky0"] is None and result["sticky1"] is None, result
    assert result["outcome"] != "accepted", result
    msg = result.get("message", "")
    assert words in msg.lower() or "device" in msg.lower() or "cuda:" in msg, result
