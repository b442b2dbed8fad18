"""pycudnn.cupy_compat on CuPy arrays against float64 NumPy references, and the CuPy 13 snippets
of docs/migrating-from-cupy.md run with only their import lines changed."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import reference as R

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")

from pycudnn import cupy_compat as cc  # noqa: E402

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "migrating-from-cupy.md"
TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 1e-2}
NCHW, NHWC = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC


def host(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def as64(a):
    return np.asarray(a, np.float64)


def close(actual, expected, dtype, tensor_core="never"):
    tol = TOL[dtype] if not (dtype == "float32" and tensor_core != "never") else 5e-3
    scale = max(np.abs(expected).max(), 1e-6)
    err = np.abs(as64(actual) - expected).max() / scale
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"


def to_dev(a, layout):
    """The CuPy array CuPy 13 expected: (N, H, W, C) / (K, R, S, C) for NHWC."""
    if layout == NHWC and a.ndim == 4:
        a = np.ascontiguousarray(a.transpose(0, 2, 3, 1))
    return cupy.asarray(a)


def from_dev(a, layout):
    h = cupy.asnumpy(a)
    return h.transpose(0, 3, 1, 2) if layout == NHWC and h.ndim == 4 else h


def empty(shape, dtype, layout):
    if layout == NHWC and len(shape) == 4:
        n, c, h, w = shape
        shape = (n, h, w, c)
    return cupy.full(shape, np.nan, dtype)  # NaN: every element must be written


# (spatial, in_ch, out_ch, kernel, pad, stride, dilation, groups)
GEOMETRIES = [
    ((9, 10), 4, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((9, 10), 4, 8, (3, 2), (1, 0), (2, 1), (1, 1), 1),
    ((11, 11), 4, 6, (3, 3), (2, 2), (1, 2), (2, 2), 2),
    ((8, 8), 6, 6, (3, 3), (1, 1), (1, 1), (1, 1), 6),   # depthwise
    ((12,), 4, 8, (3,), (1,), (2,), (1,), 1),            # 1-D (3-D arrays)
    ((5, 6, 7), 2, 4, (3, 3, 3), (1, 1, 1), (1, 1, 2), (1, 1, 1), 1),  # 3-D (5-D arrays)
]
IDS = ["3x3", "stride2", "dil2-groups2", "depthwise", "1d", "3d"]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
@pytest.mark.parametrize("d_layout, w_layout", [(NCHW, NCHW), (NHWC, NHWC), (NHWC, NCHW)],
                         ids=["nchw", "nhwc", "nhwc-data"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_forward_and_backward_against_numpy(geometry, d_layout, w_layout, dtype):
    spatial, c, k, kernel, pad, stride, dilation, groups = geometry
    if len(spatial) != 2 and (d_layout, w_layout) != (NCHW, NCHW):
        pytest.skip("layouts apply to 4-D arrays")
    n = 3
    x = host((n, c) + spatial, dtype, 0)
    w = host((k, c // groups) + kernel, dtype, 1)
    b = host((k,), dtype, 2)
    out_sp = tuple(R.out_shape(spatial, kernel, stride, pad, dilation))
    gy = host((n, k) + out_sp, dtype, 3)
    bx = host((c,), dtype, 4)

    # forward, with bias
    y = empty((n, k) + out_sp, dtype, d_layout)
    ret = cc.convolution_forward(to_dev(x, d_layout), to_dev(w, w_layout), cupy.asarray(b), y, pad,
                                 stride, dilation, groups, auto_tune=False, tensor_core="never",
                                 d_layout=d_layout, w_layout=w_layout)
    assert ret is None
    expect = R.conv_forward(x, w, stride, pad, dilation, groups) + as64(b).reshape((1, k) + (1,) * len(spatial))
    close(from_dev(y, d_layout), expect, dtype)

    # backward data, without and with a bias on the result
    for bias in (None, bx):
        gx = empty((n, c) + spatial, dtype, d_layout)
        cc.convolution_backward_data(to_dev(w, w_layout), to_dev(gy, d_layout),
                                     None if bias is None else cupy.asarray(bias), gx, pad, stride,
                                     dilation, groups, deterministic=False, auto_tune=False,
                                     tensor_core="never", d_layout=d_layout, w_layout=w_layout)
        expect = R.conv_backward_data(gy, w, x.shape, stride, pad, dilation, groups)
        if bias is not None:
            expect = expect + as64(bias).reshape((1, c) + (1,) * len(spatial))
        close(from_dev(gx, d_layout), expect, dtype)

    # backward filter
    gw = empty(w.shape, dtype, w_layout)
    cc.convolution_backward_filter(to_dev(x, d_layout), to_dev(gy, d_layout), gw, pad, stride,
                                   dilation, groups, deterministic=False, auto_tune=False,
                                   tensor_core="never", d_layout=d_layout, w_layout=w_layout)
    close(from_dev(gw, w_layout), R.conv_backward_filter(x, gy, w.shape, stride, pad, dilation, groups),
          dtype)


@pytest.mark.parametrize("auto_tune", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("tensor_core", ["auto", "always", "never"])
def test_flags(auto_tune, deterministic, tensor_core):
    x, w = host((4, 8, 12, 12), "float32", 5), host((16, 8, 3, 3), "float32", 6)
    gy = host((4, 16, 12, 12), "float32", 7)
    geo = ((1, 1), (1, 1), None, 1)
    y = cupy.empty((4, 16, 12, 12), cupy.float32)
    cc.convolution_forward(cupy.asarray(x), cupy.asarray(w), None, y, *geo, auto_tune=auto_tune,
                           tensor_core=tensor_core)
    close(cupy.asnumpy(y), R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1), "float32", tensor_core)
    gx = cupy.empty(x.shape, cupy.float32)
    cc.convolution_backward_data(cupy.asarray(w), cupy.asarray(gy), None, gx, *geo,
                                 deterministic=deterministic, auto_tune=auto_tune,
                                 tensor_core=tensor_core)
    close(cupy.asnumpy(gx), R.conv_backward_data(gy, w, x.shape, (1, 1), (1, 1), (1, 1), 1),
          "float32", tensor_core)
    gw = cupy.empty(w.shape, cupy.float32)
    cc.convolution_backward_filter(cupy.asarray(x), cupy.asarray(gy), gw, *geo,
                                   deterministic=deterministic, auto_tune=auto_tune,
                                   tensor_core=tensor_core)
    close(cupy.asnumpy(gw), R.conv_backward_filter(x, gy, w.shape, (1, 1), (1, 1), (1, 1), 1),
          "float32", tensor_core)
    if deterministic:  # the same bits twice
        gw2 = cupy.empty(w.shape, cupy.float32)
        cc.convolution_backward_filter(cupy.asarray(x), cupy.asarray(gy), gw2, *geo,
                                       deterministic=True, auto_tune=auto_tune,
                                       tensor_core=tensor_core)
        assert cupy.array_equal(gw, gw2)


def test_runs_on_cupys_current_stream():
    x, w = host((2, 4, 8, 8), "float32", 8), host((4, 4, 3, 3), "float32", 9)
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        xd, wd = cupy.asarray(x), cupy.asarray(w)
        y = cupy.empty((2, 4, 8, 8), cupy.float32)
        cc.convolution_forward(xd, wd, None, y, (1, 1), (1, 1), (1, 1), 1, auto_tune=False,
                               tensor_core="never")
        result = cupy.asnumpy(y, stream=side)  # ordered after the convolution on the side stream
        side.synchronize()
    close(result, R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1), "float32")


def test_non_contiguous_inputs_and_outputs():
    x, w = host((2, 4, 9, 9), "float32", 10), host((6, 4, 3, 3), "float32", 11)
    big = cupy.asarray(np.pad(x, ((0, 0), (0, 2), (0, 0), (0, 3))))
    xd = big[:, :4, :, :9]  # a strided view
    y_big = cupy.full((2, 6, 7, 10), np.nan, cupy.float32)
    yd = y_big[:, :, :, :7]
    cc.convolution_forward(xd, cupy.asarray(w), None, yd, (0, 0), (1, 1), (1, 1), 1,
                           auto_tune=False, tensor_core="never")
    close(cupy.asnumpy(yd), R.conv_forward(x, w, (1, 1), (0, 0), (1, 1), 1), "float32")
    assert bool(cupy.isnan(y_big[:, :, :, 7:]).all())  # nothing written outside the view


def _snippets():
    text = DOCS.read_text()
    blocks = re.findall(r"<!-- cupy13-snippet -->\s*```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2, "docs/migrating-from-cupy.md lost its CuPy 13 snippets"
    return blocks


# The import lines a CuPy 13 program changes; nothing else changes.
IMPORTS = {
    "from cupyx import cudnn": "from pycudnn import cupy_compat as cudnn",
    "from cupy.cuda.cudnn import CUDNN_TENSOR_NHWC": "from pycudnn.cupy_compat import CUDNN_TENSOR_NHWC",
}


@pytest.mark.parametrize("index", [0, 1])
def test_migration_guide_snippet_runs_with_only_the_import_changed(index):
    code = _snippets()[index]
    changed = []
    lines = []
    for line in code.splitlines():
        stripped = line.split("#")[0].strip()
        if stripped in IMPORTS:
            changed.append(stripped)
            line = line.replace(stripped, IMPORTS[stripped])
        lines.append(line)
    assert changed and all(c.startswith(("from ", "import ")) for c in changed)
    ns: dict = {}
    exec(compile("\n".join(lines), f"<migrating-from-cupy.md snippet {index}>", "exec"), ns)
    cupy.cuda.get_current_stream().synchronize()
    x, W = cupy.asnumpy(ns["x"]), cupy.asnumpy(ns["W"])
    if index == 0:  # NCHW, forward with bias and both backward passes
        b, gy = cupy.asnumpy(ns["b"]), cupy.asnumpy(ns["gy"])
        geo = (ns["stride"], ns["pad"], ns["dilation"], ns["groups"])
        close(cupy.asnumpy(ns["y"]), R.conv_forward(x, W, *geo) + as64(b)[None, :, None, None],
              "float32")
        close(cupy.asnumpy(ns["gx"]), R.conv_backward_data(gy, W, x.shape, *geo), "float32")
        close(cupy.asnumpy(ns["gW"]), R.conv_backward_filter(x, gy, W.shape, *geo), "float32")
    else:  # NHWC
        x_nchw, w_nchw = x.transpose(0, 3, 1, 2), W.transpose(0, 3, 1, 2)
        y = cupy.asnumpy(ns["y"]).transpose(0, 3, 1, 2)
        close(y, R.conv_forward(x_nchw, w_nchw, (1, 1), (1, 1), (1, 1), 1), "float32", "auto")
