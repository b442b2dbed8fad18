"""Several GPUs: tensors on device 1 run on device 1, per-device caches, two threads
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
        from pycudnn.runtime import memory

        return memory.device_count()
    except Exception:  # pragma: no cover - cuda.bindings missing
        return 0


N_DEVICES = _device_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(N_DEVICES < 2, reason=f"needs 2 CUDA devices; this machine has {N_DEVICES} "
                       "(these tests cover using several GPUs from one process)"),
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
    from pycudnn.runtime import memory

    return memory.pointer_device(ptr)


@pytest.fixture
def allocations(monkeypatch):
    """Every device allocation pycudnn makes while the test runs: (ptr, device it claims,
    device that owns the memory), the owner asked at once (the memory may be freed by the end)."""
    import sys

    from pycudnn.runtime import memory

    seen: list[tuple[int, int]] = []

    def patch_everywhere(original, replacement):
        # every module of pycudnn that bound the function by name looks it up in its own namespace
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("pycudnn"):
                for attr, value in list(vars(module).items()):
                    if value is original:
                        monkeypatch.setattr(module, attr, replacement)

    for name in ("allocate", "allocate_fast"):
        original = getattr(memory, name)

        def wrapper(nbytes, device=None, stream=None, *more, _orig=original, **kw):
            buf = _orig(nbytes, device, stream, *more, **kw)
            if buf.nbytes:
                seen.append((buf.ptr, buf.device, memory.pointer_device(buf.ptr)))
            return buf
        patch_everywhere(original, wrapper)

    original_tw = memory.workspaces.thread_workspace

    def tw(nbytes, device, stream, _orig=original_tw):
        ptr = _orig(nbytes, device, stream)
        if ptr:
            seen.append((ptr, device, memory.pointer_device(ptr)))
        return ptr
    patch_everywhere(original_tw, tw)
    return seen


@pytest.mark.parametrize("engine", ["graph", "v7"])
@pytest.mark.parametrize("measure", [False, True])  # not "benchmark": pytest-benchmark owns that name
def test_tensors_on_device_1_run_on_device_1(engine, measure, allocations):
    import pycudnn
    from cuda.bindings import runtime as rt
    from pycudnn.runtime import handle as H

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
                y = pycudnn.convolution(X, W, padding=1, engine=engine, benchmark=measure,
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
    wrong = [(hex(p), claimed, owner) for p, claimed, owner in allocations if (claimed, owner) != (1, 1)]
    assert not wrong, f"workspaces/outputs allocated off device 1: {wrong}"
    assert 1 in H.thread_handles(), "no handle for device 1 in this thread"


def test_caches_are_per_device():
    """The same shapes on devices 0 and 1: two cache entries (the key holds the device), each
    record built on its own device (a plan from device 0 never runs on device 1)."""
    import pycudnn
    from pycudnn.search.cache import caches

    x, w, ref = _data(2)
    pycudnn.clear_caches()
    for dev in (0, 1, 0, 1):
        y = pycudnn.convolution(pycudnn.from_numpy(x, device=dev), pycudnn.from_numpy(w, device=dev),
                                padding=1, allow_tf32=False, tuning_db=False)
        assert y.device == dev and _err(y.numpy(), ref) <= 3e-5
    devices = sorted(p.device for p, _ in caches["forward"].items()
                     if p.input_shape == x.shape)
    assert devices == [0, 1], devices


def test_tuning_records_follow_the_device_model(tmp_path):
    """A benchmark choice stored by a device-0 process is reused on device 1 only when both are the
    same model (the record's key holds the GPU's identity, not the ordinal), and then runs right."""
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        import pycudnn
        from pycudnn.tuning import db as tuning_db
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
        from pycudnn.search.cache import caches
        sources = [getattr(r, "source", "?") for p, r in caches["forward"].items()]
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


# The next cases would make cuDNN touch memory or streams of another device if pycudnn let them
# through: each runs in a subprocess, so an illegal address cannot poison this process.
CHILD = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    import pycudnn
    from cuda.bindings import runtime as rt
    kind, engine = sys.argv[1], sys.argv[2]
    on = lambda shape, d: pycudnn.from_numpy(np.ones(shape, np.float32), device=d)
    X, W, Y, B = (2, 8, 10, 10), (16, 8, 3, 3), (2, 16, 10, 10), (16,)
    x0, w0, y0, b0 = on(X, 0), on(W, 0), on(Y, 0), on(B, 0)
    x1, w1, y1, b1 = on(X, 1), on(W, 1), on(Y, 1), on(B, 1)
    rt.cudaSetDevice(0)
    err, s0 = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
    kw = dict(padding=1, engine=engine, tuning_db=False)
    conv, bwd_data, bwd_filter, add_relu = (pycudnn.convolution, pycudnn.convolution_backward_data,
                                            pycudnn.convolution_backward_filter,
                                            pycudnn.convolution_add_relu)
    # (the valid call that prepares the call signature, the same call with one tensor elsewhere)
    cases = {
        "weight":      (lambda: conv(x0, w0, **kw), lambda: conv(x0, w1, **kw)),
        "bias":        (lambda: conv(x0, w0, b0, **kw), lambda: conv(x0, w0, b1, **kw)),
        "bias_relu":   (lambda: conv(x0, w0, b0, activation="relu", **kw),
                        lambda: conv(x0, w0, b1, activation="relu", **kw)),
        "out":         (lambda: conv(x0, w0, **kw),
                        lambda: conv(x0, w0, out=pycudnn.empty(Y, device=1), **kw)),
        "z":           (lambda: add_relu(x0, w0, y0, **kw), lambda: add_relu(x0, w0, y1, **kw)),
        "add_relu_bias": (lambda: add_relu(x0, w0, y0, bias=b0, **kw),
                          lambda: add_relu(x0, w0, y0, bias=b1, **kw)),
        "grad_y_data": (lambda: bwd_data(y0, w0, X, **kw), lambda: bwd_data(y0, w1, X, **kw)),
        "grad_y_filter": (lambda: bwd_filter(x0, y0, W, **kw), lambda: bwd_filter(x0, y1, W, **kw)),
        "stream":      (lambda: conv(x1, w1, **kw), lambda: conv(x1, w1, stream=int(s0), **kw)),
    }
    prepare, bad = cases[kind]
    out = {}
    for when in ("fresh", "prepared"):
        if when == "prepared":
            prepare(); prepare()
        try:
            y = bad()
            y.numpy()
            out[when] = {"outcome": "accepted"}
        except Exception as exc:
            out[when] = {"outcome": type(exc).__name__, "message": str(exc).split("\n")[0][:300]}
        for d in (0, 1):
            rt.cudaSetDevice(d)
            err, = rt.cudaDeviceSynchronize()
            out[when][f"sticky{d}"] = str(err) if int(err) else None
        rt.cudaSetDevice(0)
    print(json.dumps(out))
""")


@pytest.mark.parametrize("engine", ["graph", "v7"])
@pytest.mark.parametrize("kind", ["weight", "bias", "bias_relu", "out", "z", "add_relu_bias",
                                  "grad_y_data", "grad_y_filter", "stream"])
def test_wrong_device_is_refused_without_touching_it(kind, engine):
    """One tensor on another device than its partners (weight, bias, out=, residual z, grad_y), or
    a stream of device 0 for tensors on device 1: a clear error naming the device (or the stream)
    before any work, both on a fresh call and after the call signature was prepared (whose fast
    path checks less), with no crash and no poisoned context. In a subprocess each, because a
    call that got through would make cuDNN read another device's memory."""
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, engine], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, f"the child crashed (rc {proc.returncode}): {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    problems = []
    for when, r in result.items():
        if r["sticky0"] or r["sticky1"]:
            problems.append(f"{when}: CUDA context poisoned: {r}")
        elif r["outcome"] == "accepted":
            problems.append(f"{when}: accepted")
        else:
            msg = r.get("message", "").lower()
            if not any(k in msg for k in ("device", "cuda:", "stream")):
                problems.append(f"{when}: {r['outcome']} does not name the device or stream: {msg}")
    assert not problems, f"{kind} ({engine}): " + "; ".join(problems)
