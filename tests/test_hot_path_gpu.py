"""GPU tests of what the host-cost work on the remembered-call path must keep: call signatures
that still tell configurations apart and still match across input kinds, outputs that are
distinct while alive, and a first call on a fresh thread that binds its device itself.

    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=. python3 -m pytest -q tests/test_hot_path_gpu.py
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import reference as R

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _fresh():
    import pycudnn

    pycudnn.clear_caches()
    yield
    pycudnn.clear_caches()
    pycudnn.config.reset()


def _data(seed, shape=(2, 8, 10, 10), k=8):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal((k, shape[1], 3, 3)).astype(np.float32))


def _err(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def test_a_configuration_change_is_another_signature():
    import pycudnn
    from pycudnn.api import prepared

    x, w = _data(1)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)
    for _ in range(3):
        assert _err(pycudnn.convolution(X, W, padding=1, allow_tf32=False).numpy(), ref) < 2e-5
    assert len(prepared.remembered_calls()) == 1
    pycudnn.config.deterministic = True  # the same call now means other flags
    assert _err(pycudnn.convolution(X, W, padding=1, allow_tf32=False).numpy(), ref) < 2e-5
    assert len(prepared.remembered_calls()) == 2
    # flags given by keyword and flags from an override are told apart too
    pycudnn.convolution(X, W, padding=1, allow_tf32=False, benchmark=False)
    assert len(prepared.remembered_calls()) == 3
    with pycudnn.flags(benchmark=False):
        pycudnn.convolution(X, W, padding=1, allow_tf32=False)
    assert len(prepared.remembered_calls()) == 4


def test_torch_tensors_and_views_of_one_layout_share_a_signature():
    torch = pytest.importorskip("torch")
    import pycudnn
    from pycudnn.api import prepared

    x, w = _data(2)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    with torch.backends.cudnn.flags(enabled=False):
        ref = torch.nn.functional.conv2d(tx.double(), tw.double(), padding=1).cpu().numpy()
    y_torch = pycudnn.convolution(tx, tw, padding=1, allow_tf32=False)
    y_views = pycudnn.convolution(pycudnn.as_tensor(tx), pycudnn.as_tensor(tw), padding=1,
                                  allow_tf32=False)
    assert len(prepared.remembered_calls()) == 1
    assert type(y_torch.shape) is tuple and type(y_torch.strides) is tuple
    assert y_torch.memory_format == "contiguous"
    for y in (y_torch, y_views):
        assert _err(y.numpy(), ref) < 2e-5
    # channels-last torch tensors are another layout: another signature, still right (both
    # channels-last: a mixed pair is staged into one format and not remembered as one launch)
    tx_cl = tx.contiguous(memory_format=torch.channels_last)
    tw_cl = tw.contiguous(memory_format=torch.channels_last)
    y_cl = pycudnn.convolution(tx_cl, tw_cl, padding=1, allow_tf32=False)
    assert len(prepared.remembered_calls()) == 2 and y_cl.memory_format == "channels_last"
    assert _err(y_cl.numpy(), ref) < 2e-5


def test_outputs_of_remembered_calls_are_distinct_while_alive():
    import pycudnn

    x, w = _data(3)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    held = []
    for i in range(16):
        held.append((i, pycudnn.convolution(X, W, padding=1, allow_tf32=False)))
        X = pycudnn.from_numpy(x * (i + 2))  # the next call reads other values
    assert len({y.ptr for _, y in held}) == len(held)
    for i, y in held:
        ref = R.conv_forward(x * (i + 1), w, (1, 1), (1, 1), (1, 1), 1)
        assert _err(y.numpy(), ref) < 2e-5


def test_first_call_on_a_fresh_thread_binds_its_device():
    """The remembered call made by this thread, replayed first thing on a new thread: its output
    allocation needs the device's context current there (bound on that thread's first use)."""
    import pycudnn
    from pycudnn.api import prepared

    x, w = _data(4)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)
    pycudnn.convolution(X, W, padding=1, allow_tf32=False)
    results, errors = [], []

    def run():
        try:
            y = pycudnn.convolution(X, W, padding=1, allow_tf32=False)
            results.append(y.numpy())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors
    assert len(prepared.remembered_calls()) == 1
    assert _err(results[0], ref) < 2e-5
