"""CPU tests of the convolution functions' argument checking and error context.

Inputs are pycudnn views of made-up device addresses that are never touched: every check here
must fire before anything runs on a GPU (so these tests pass with and without one).
"""

from __future__ import annotations

import numpy as np
import pytest

import pycudnn
from conftest import has_gpu
from pycudnn.api import call as call_module
from pycudnn.api import conv
from pycudnn.api.arguments import suggest_memory_format
from pycudnn.api.call import ConvolutionCall
from pycudnn.runtime.tensor.geometry import conv_output_size


def t(*shape, dtype="float32", ptr=0x7F0000000000):
    """A view of a made-up device address (never dereferenced: every check fires first)."""
    return pycudnn.tensor_from_pointer(ptr, shape, dtype)


X = t(2, 4, 8, 8)
W = t(8, 4, 3, 3)

CASES = [
    # (function, args, kwargs, exception, words)
    (pycudnn.convolution, (t(2, 4), W), {}, ValueError, "expected input to have 3, 4 or 5 dims"),
    (pycudnn.convolution, (t(1, 2, 4, 4, 4, 4), t(2, 2, 1, 1, 1, 1)), {}, ValueError, "3, 4 or 5 dims"),
    (pycudnn.convolution, (X, t(8, 4, 3)), {}, ValueError, "expected weight to have 4 dims"),
    (pycudnn.convolution, (X, t(8, 4, 3, 3, dtype="float16")), {}, TypeError,
     r"input type \(float32\) and weight type \(float16\) should be the same"),
    (pycudnn.convolution, (X, t(8, 3, 3, 3)), {}, ValueError, "expected input.* to have 3 channels, but got 4"),
    (pycudnn.convolution, (X, t(8, 2, 3, 3)), {"groups": 3}, ValueError, "divisible by groups=3"),
    (pycudnn.convolution, (X, t(6, 2, 3, 3)), {"groups": 4}, ValueError, "divisible by groups=4"),
    (pycudnn.convolution, (X, W), {"groups": 0}, ValueError, "non-positive groups"),
    (pycudnn.convolution, (X, W), {"groups": True}, TypeError, "groups: expected a positive int"),
    (pycudnn.convolution, (X, W), {"stride": 0}, ValueError, "non-positive stride is not supported"),
    (pycudnn.convolution, (X, W), {"stride": (1, -1)}, ValueError, "non-positive stride"),
    (pycudnn.convolution, (X, W), {"stride": (1, 1, 1)}, ValueError,
     "stride to be a single integer value or a list of 2 values"),
    (pycudnn.convolution, (X, W), {"padding": -1}, ValueError, "negative padding is not supported"),
    (pycudnn.convolution, (X, W), {"padding": 1.5}, TypeError, "padding: expected an int"),
    (pycudnn.convolution, (X, W), {"dilation": 0}, ValueError, "dilation should be greater than zero"),
    (pycudnn.convolution, (X, W), {"dilation": (1, True)}, ValueError, "dilation to be a single integer"),
    (pycudnn.convolution, (X, t(8, 4, 9, 9)), {}, ValueError, "Kernel size can't be greater than actual input size"),
    (pycudnn.convolution, (X, W), {"dilation": 5}, ValueError, "Kernel size can't be greater"),
    (pycudnn.convolution, (X, W, t(7)), {}, ValueError, "bias to be 1-dimensional with 8 elements"),
    (pycudnn.convolution, (X, W, t(8, dtype="float64")), {}, TypeError, "bias type"),
    (pycudnn.convolution, (X, W), {"out": t(2, 8, 8, 8)}, ValueError, r"out: expected shape \[2, 8, 6, 6\]"),
    (pycudnn.convolution, (X, W), {"out": t(2, 8, 6, 6, dtype="float16")}, TypeError, "out: expected dtype float32"),
    (pycudnn.convolution, (X, W), {"benchmark": "yes"}, TypeError, "benchmark: expected a bool"),
    (pycudnn.convolution, (X, W), {"engine": "cudnn8"}, ValueError, "engine: expected one of"),
    (pycudnn.convolution, (X, W), {"bogus": 1}, TypeError, "unknown flag 'bogus'"),
    (pycudnn.convolution, (np.zeros((2, 4, 8, 8), np.float32), W), {}, TypeError, "from_numpy"),
    (pycudnn.convolution, (X, W), {"stream": "default"}, TypeError, "stream"),
    (pycudnn.conv_transpose, (X, t(4, 2, 3, 3)), {"output_padding": 2, "stride": 2}, ValueError,
     "output padding must be smaller than either stride or dilation"),
    (pycudnn.conv_transpose, (X, t(3, 2, 3, 3)), {}, ValueError, "to have 3 channels, but got 4"),
    (pycudnn.convolution_backward_data, (t(2, 8, 6, 6), W, (2, 4, 8)), {}, ValueError, "input_shape: expected 4 sizes"),
    (pycudnn.convolution_backward_data, (t(2, 8, 5, 5), W, (2, 4, 8, 8)), {}, ValueError,
     r"expected grad_y of size \[2, 8, 6, 6\]"),
    (pycudnn.convolution_backward_data, (t(2, 8, 6, 6), W, "2,4,8,8"), {}, TypeError, "input_shape: expected a tuple"),
    (pycudnn.convolution_backward_filter, (X, t(2, 8, 6, 6), (8, 4, 3)), {}, ValueError, "weight_shape: expected 4 sizes"),
    (pycudnn.convolution_backward_filter, (X, t(2, 8, 6, 6), (8, 2, 3, 3)), {}, ValueError, "to have 2 channels"),
    (pycudnn.convolution_backward_filter, (X, t(2, 9, 6, 6), (8, 4, 3, 3)), {}, ValueError, "expected grad_y of size"),
    (pycudnn.convolution_add_relu, (X, W, t(2, 8, 5, 5)), {}, ValueError, r"expected z of size \[2, 8, 6, 6\]"),
    (pycudnn.convolution_add_relu, (X, W, t(2, 8, 6, 6, dtype="float16")), {}, TypeError, "z type"),
    (pycudnn.convolution_add_relu, (X, W, t(2, 8, 6, 6)), {"alpha": "1"}, TypeError, "alpha: expected a real number"),
]


@pytest.mark.parametrize("fn,args,kwargs,exc,words", CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_refused_before_any_gpu_work(fn, args, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fn(*args, **kwargs)


def test_output_size_formula():
    assert conv_output_size((8, 8), (3, 3), (1, 1), (1, 1), (1, 1)) == (8, 8)
    assert conv_output_size((7,), (3,), (2,), (0,), (2,)) == (2,)
    assert conv_output_size((5, 6, 7), (2, 2, 2), (2, 2, 2), (1, 0, 2), (1, 1, 1)) == (3, 3, 5)


def test_suggest_memory_format():
    nchw = pycudnn.tensor_from_pointer(0x1000, (2, 4, 8, 8), "float32")
    nhwc = pycudnn.tensor_from_pointer(0x1000, (2, 4, 8, 8), "float32", strides=(256, 1, 32, 4))
    w = pycudnn.tensor_from_pointer(0x2000, (8, 4, 3, 3), "float32")
    assert suggest_memory_format(nchw, w) == "contiguous"
    assert suggest_memory_format(nhwc, w) == "channels_last"
    one_d = pycudnn.tensor_from_pointer(0x1000, (2, 4, 8), "float32")
    assert suggest_memory_format(one_d, pycudnn.tensor_from_pointer(0x2000, (8, 4, 3), "float32")) == "contiguous"


def test_repro_snippet_covers_bfloat16_and_channels_last():
    from pycudnn.engines.problem import ConvolutionParams
    from pycudnn.api.repro import repro_lines

    x = pycudnn.tensor_from_pointer(0x1000, (2, 4, 8, 8), "bfloat16", strides=(256, 1, 32, 4))
    w = pycudnn.tensor_from_pointer(0x2000, (8, 4, 3, 3), "bfloat16", strides=(36, 1, 12, 4))
    y = pycudnn.tensor_from_pointer(0x3000, (2, 8, 8, 8), "bfloat16", strides=(512, 1, 64, 8))
    flags = pycudnn.config.resolve({"benchmark": True})
    call = ConvolutionCall("conv2d", "forward", x, w, y, (1, 1), (1, 1), (1, 1), 1, flags, None)
    params = call.params_for(x, w, y, None)
    assert isinstance(params, ConvolutionParams)
    lines = repro_lines(call, params)
    text = "\n".join(lines)
    assert "while running conv2d (forward" in text
    assert "ptr=0x1000" in text and "format=channels_last" in text
    snippet = text.split("reproduce with:\n", 1)[1]
    code = "\n".join(line[4:] for line in snippet.split("\n"))
    assert "dtype='bfloat16'" in code and "memory_format='channels_last'" in code
    assert "pycudnn.convolution(x, w, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1" in code
    assert "benchmark=True" in code
    compile(code, "<repro>", "exec")  # it is valid Python


def test_params_for_1d_conv_are_2d_with_unit_height():
    x = pycudnn.tensor_from_pointer(0x1000, (2, 4, 16), "float32")
    w = pycudnn.tensor_from_pointer(0x2000, (8, 4, 3), "float32")
    y = pycudnn.tensor_from_pointer(0x3000, (2, 8, 7), "float32")
    flags = pycudnn.config.resolve({})
    call = ConvolutionCall("conv1d", "forward", x, w, y, (2,), (0,), (1,), 1, flags, None)
    p = call.params_for(x, w, y, None)
    assert p.input_shape == (2, 4, 1, 16) and p.weight_shape == (8, 4, 1, 3)
    assert p.output_shape == (2, 8, 1, 7)
    assert p.stride == (1, 2) and p.padding == (0, 0) and p.dilation == (1, 1)


# ---- outputs that share memory with themselves or with an input ---------------------------------

BASE = 0x7F0000000000


@pytest.mark.parametrize("out_shape,call", [
    ((2, 8, 8, 8), lambda out: pycudnn.convolution(
        t(2, 4, 8, 8, ptr=BASE), t(8, 4, 3, 3, ptr=BASE + (1 << 30)), padding=1, out=out)),
    ((2, 4, 8, 8), lambda out: pycudnn.convolution_backward_data(
        t(2, 8, 8, 8, ptr=BASE), t(8, 4, 3, 3, ptr=BASE + (1 << 30)), (2, 4, 8, 8), padding=1, out=out)),
    ((8, 4, 3, 3), lambda out: pycudnn.convolution_backward_filter(
        t(2, 4, 8, 8, ptr=BASE), t(2, 8, 8, 8, ptr=BASE + (1 << 30)), (8, 4, 3, 3), padding=1, out=out)),
], ids=["forward", "backward_data", "backward_filter"])
def test_out_aliasing_an_input_is_refused(out_shape, call):
    """An out= starting where the first input starts: cuDNN does not compute in place."""
    with pytest.raises(ValueError, match=r"out overlaps (input|grad_y), which the call reads"):
        call(t(*out_shape, ptr=BASE))


def test_out_overlapping_itself_is_refused():
    out = pycudnn.tensor_from_pointer(BASE + (2 << 30), (2, 8, 8, 8), "float32", strides=(0, 64, 8, 1))
    with pytest.raises(ValueError, match="out: its elements overlap each other"):
        pycudnn.convolution(X, W, padding=1, out=out)


# The two tests below pass validation on purpose, so on a GPU they would run on made-up addresses
# (an illegal address that breaks CUDA for the whole process): they run without a GPU only, and
# test_conv_gpu.py runs the same layouts on real memory.
needs_no_gpu = pytest.mark.skipif(has_gpu(), reason="passes validation on made-up addresses: "
                                  "runs without a GPU only (test_conv_gpu.py has the GPU twin)")


@needs_no_gpu
def test_interleaved_out_next_to_its_input_is_accepted():
    """Even channels written, odd channels read, of one buffer: no element shared, so the call gets
    past validation (and stops only for want of a GPU here)."""
    from pycudnn.errors import NoDeviceError

    buf = BASE + (3 << 30)
    x = pycudnn.tensor_from_pointer(buf + 4 * 64, (2, 4, 8, 8), "float32", strides=(512, 128, 8, 1))
    out = pycudnn.tensor_from_pointer(buf, (2, 4, 8, 8), "float32", strides=(512, 128, 8, 1))
    w = t(4, 4, 3, 3, ptr=BASE + (4 << 30))
    with pytest.raises(NoDeviceError):
        pycudnn.convolution(x, w, padding=1, out=out)


@needs_no_gpu
def test_add_relu_accepts_out_equal_to_z_but_not_shifted():
    from pycudnn.errors import NoDeviceError

    z = t(2, 8, 8, 8, ptr=BASE + (2 << 30))
    with pytest.raises(NoDeviceError):  # the in-place residual: validation passes
        pycudnn.convolution_add_relu(X, W, z, padding=1, out=z)
    shifted = t(2, 8, 8, 8, ptr=BASE + (2 << 30) + 4 * 8)
    with pytest.raises(ValueError, match="out partially overlaps z"):
        pycudnn.convolution_add_relu(X, W, z, padding=1, out=shifted)


def test_remembered_call_hands_an_overlapping_out_to_the_full_path():
    """The fast path's cheap test: an out= of the remembered layout that shares memory with an input
    goes to the full path (which refuses it), never straight to the kernel."""
    import numpy as np

    from pycudnn.api.prepared import PreparedConvolution

    x, w = t(2, 4, 8, 8, ptr=BASE), t(8, 4, 3, 3, ptr=BASE + (1 << 30))
    prepared = object.__new__(PreparedConvolution)  # just the layout a remembered call has
    prepared.__dict__.update(out_shape=(2, 8, 8, 8), _out_strides=(512, 64, 8, 1),
                             dtype=np.dtype("float32"), device=0, _out_span=4 * 1024,
                             _a_span=x.span_bytes, _b_span=w.span_bytes)
    apart = t(2, 8, 8, 8, ptr=BASE + (2 << 30))
    assert prepared.matching_out(apart, x, w) is apart
    assert prepared.matching_out(t(2, 8, 8, 8, ptr=BASE + 64), x, w) is False
    assert prepared.matching_out(t(2, 8, 8, 8, ptr=BASE + (1 << 30)), x, w) is False
    z = apart
    assert prepared.matching_out(apart, x, w, None, z) is apart  # out is z exactly
    shifted_z = t(2, 8, 8, 8, ptr=BASE + (2 << 30) + 32)
    assert prepared.matching_out(apart, x, w, None, shifted_z) is False


def test_geometry_above_int32_is_refused_up_front():
    with pytest.raises(ValueError, match=r"stride: expected every value to be at most 2147483647"):
        pycudnn.convolution(X, W, stride=2**40)
    with pytest.raises(ValueError, match=r"groups: expected at most 2147483647"):
        pycudnn.convolution(X, W, groups=2**31)


def test_sample_above_int32_is_refused_before_allocating():
    with pytest.raises(ValueError, match=r"one sample holds 2500000000 elements"):
        pycudnn.convolution(t(1, 1, 50000, 50000), t(1, 1, 1, 1, ptr=BASE + (1 << 40)))


# ---- PyTorch's string padding and output_padding >= stride, accepted as PyTorch accepts them ----

class _Recorder:
    """Stands in for the GPU steps of a convolution call: what each would have run."""

    def __init__(self, monkeypatch):
        self.runs, self.copies, self.zeroed = [], [], []
        self.next = 1 << 44
        rec = self

        def run(call):
            rec.runs.append((call.direction, call.padding, call.dilation,
                             (call.x.shape, call.w.shape, call.y.shape)))

        def alloc(shape, dtype="float32", memory_format="contiguous", device=None, stream=None):
            rec.next += 1 << 32
            return pycudnn.tensor_from_pointer(rec.next, shape, dtype)

        monkeypatch.setattr(ConvolutionCall, "run", run)
        monkeypatch.setattr(ConvolutionCall, "run_fused", lambda call: False)
        for module in (conv, call_module):  # the public functions and the call they run
            monkeypatch.setattr(module, "empty", alloc)
            monkeypatch.setattr(module, "zeros", alloc)
            monkeypatch.setattr(module, "get_handle", lambda *a, **k: 0)
            monkeypatch.setattr(module, "transform",
                                lambda h, src, dst: rec.copies.append((src, dst)))
        monkeypatch.setattr(conv, "fill_zero", lambda t, s, h=None: rec.zeroed.append(t))


@pytest.mark.parametrize("k,d,pad,extra", [(3, 1, 1, 0), (5, 1, 2, 0), (4, 1, 1, 1), (2, 1, 0, 1),
                                           (3, 2, 2, 0), (4, 3, 4, 1)])
def test_padding_same_is_pytorchs(monkeypatch, k, d, pad, extra):
    """PyTorch: total = dilation * (kernel - 1); total // 2 on both sides and, when odd, one
    zero more after the input (a padded copy)."""
    rec = _Recorder(monkeypatch)
    x = t(2, 4, 11, 13)
    y = pycudnn.convolution(x, t(8, 4, k, k), padding="same", dilation=d, allow_tf32=False)
    assert y.shape == (2, 8, 11, 13)  # 'same': the input's size
    direction, padding, dilation, (xs, ws, ys) = rec.runs[-1]
    assert direction == "forward" and padding == (pad, pad) and dilation == (d, d)
    assert xs == (2, 4, 11 + extra, 13 + extra)
    if extra:  # the input copied into the padded one's corner, which starts zeroed
        src, dst = rec.copies[-1]
        assert src is x and dst.shape == x.shape and dst.strides == (4 * 12 * 14, 12 * 14, 14, 1)
    else:
        assert rec.copies == []


def test_padding_same_pads_only_the_odd_dims(monkeypatch):
    rec = _Recorder(monkeypatch)
    y = pycudnn.convolution(t(1, 2, 9, 9, 9), t(3, 2, 2, 3, 4), padding="same")
    assert y.shape == (1, 3, 9, 9, 9)
    _, padding, _, (xs, _, _) = rec.runs[-1]
    assert padding == (0, 1, 1) and xs == (1, 2, 10, 9, 10)


def test_padding_valid_is_no_padding(monkeypatch):
    rec = _Recorder(monkeypatch)
    y = pycudnn.convolution(X, W, padding="valid", stride=2)
    assert y.shape == (2, 8, 3, 3) and rec.runs[-1][1] == (0, 0)


@pytest.mark.parametrize("kwargs,exc,words", [
    ({"padding": "same", "stride": 2}, ValueError,
     "padding='same' is not supported for strided convolutions"),
    ({"padding": "full"}, ValueError, r"Invalid padding string 'full'"),
    ({"padding": "same", "out": t(2, 8, 8, 7)}, ValueError, r"out: expected shape \[2, 8, 8, 8\]"),
])
def test_string_padding_refusals_name_the_parameter(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        pycudnn.convolution(X, t(8, 4, 4, 4), **kwargs)


@pytest.mark.parametrize("stride,dilation,op,padding", [(1, 3, 2, 0), (2, 4, 3, 1), (1, 2, 1, 1),
                                                         (2, 3, 2, 2)])
def test_conv_transpose_output_padding_below_dilation_crops_the_unpadded_result(
        monkeypatch, stride, dilation, op, padding):
    rec = _Recorder(monkeypatch)
    i, k = 5, 3
    x, w = t(2, 4, i, i), t(4, 6, k, k)
    y = pycudnn.conv_transpose(x, w, stride=stride, padding=padding, output_padding=op,
                               dilation=dilation)
    o = (i - 1) * stride - 2 * padding + dilation * (k - 1) + op + 1  # PyTorch's output size
    assert y.shape == (2, 6, o, o)
    full = (i - 1) * stride + dilation * (k - 1) + 1
    direction, pad, dil, (xs, ws, dys) = rec.runs[-1]
    assert direction == "backward_data" and pad == (0, 0) and xs == (2, 6, full, full)
    src, dst = rec.copies[-1]
    kept = min(o, full - padding)
    assert src.shape == dst.shape == (2, 6, kept, kept)
    tmp_ptr = rec.next - (1 << 32)  # the unpadded result was the first allocation of the two
    assert src.ptr == tmp_ptr + 4 * padding * (full + 1)  # starts at (padding, padding)
    assert dst.ptr == y.ptr
    assert (rec.zeroed == [y]) == (kept < o)  # positions past the unpadded result are zeros


def test_conv_transpose_output_padding_at_least_stride_and_dilation_is_refused():
    with pytest.raises(ValueError, match="output padding must be smaller than either stride or "
                                         "dilation"):
        pycudnn.conv_transpose(X, t(4, 2, 3, 3), stride=2, dilation=2, output_padding=2)


def test_conv_transpose_crop_past_the_unpadded_size_keeps_nothing_there(monkeypatch):
    """A padding larger than the unpadded size (a kernel of size 1 in that dim, output_padding
    below the dilation): no input element reaches the output there, PyTorch's output is the bias
    alone, so the output is zeroed and nothing is copied."""
    rec = _Recorder(monkeypatch)
    y = pycudnn.conv_transpose(t(1, 2, 1, 3), t(2, 3, 1, 3), stride=1, padding=(2, 0),
                               output_padding=(4, 0), dilation=(5, 1))
    assert y.shape == (1, 3, 1, 5)  # PyTorch's: (1 - 1) * 1 - 4 + 0 + 4 + 1 = 1 in H
    assert rec.runs[-1][3][0] == (1, 3, 1, 5)  # the unpadded result: 1 in H, 5 in W
    assert rec.zeroed == [y] and rec.copies == []


@pytest.mark.parametrize("x,w,kwargs,words", [
    (t(1, 2, 5), t(2, 3, 2), {"output_padding": 1},
     "conv_transpose1d: output padding must be smaller than either stride or dilation, but got "
     "output_padding_width: 1 stride_width: 1 dilation_width: 1"),
    (t(1, 2, 3, 3), t(2, 3, 2, 2), {"output_padding": (2, 0), "stride": (2, 1)},
     "conv_transpose2d: output padding must be smaller than either stride or dilation, but got "
     "output_padding_height: 2 output_padding_width: 0 stride_height: 2 stride_width: 1 "
     "dilation_height: 1 dilation_width: 1"),
    (t(1, 2, 3, 3, 3), t(2, 3, 2, 2, 2), {"output_padding": (0, 0, 3), "dilation": (1, 1, 3)},
     "conv_transpose3d: output padding must be smaller than either stride or dilation, but got "
     "output_padding_depth: 0 output_padding_height: 0 output_padding_width: 3 stride_depth: 1 "
     "stride_height: 1 stride_width: 1 dilation_depth: 1 dilation_height: 1 dilation_width: 3"),
])
def test_conv_transpose_output_padding_refusal_is_worded_as_pytorchs(x, w, kwargs, words):
    import re

    with pytest.raises(ValueError, match="^" + re.escape(words) + "$"):
        pycudnn.conv_transpose(x, w, **kwargs)


# geometry of PyTorch's OpInfo samples: output_padding 1 >= stride 1 (below the dilation 2) in W
TX, TW = t(1, 4, 4, 4), t(4, 2, 3, 3, ptr=0x7F0000000000 + (1 << 36))
TGEO = dict(stride=1, padding=(1, 1), output_padding=(0, 1), dilation=(1, 2))
TY_SHAPE = (1, 2, 4, 7)  # (4 - 1) - 2 + 2 * 2 + 1 + 1 = 7 in W


def test_conv_transpose_weight_gradient_with_output_padding_at_least_stride_pads_the_input(
        monkeypatch):
    """The backward filter of the convolution of grad_y, whose output has output_padding //
    stride more positions than x: x extended with zeros after its last element there."""
    rec = _Recorder(monkeypatch)
    gy = t(*TY_SHAPE, ptr=0x7F0000000000 + (2 << 36))
    gw = pycudnn.conv_transpose_backward_filter(TX, gy, (4, 2, 3, 3), **TGEO)
    assert gw.shape == (4, 2, 3, 3)
    direction, pad, dil, (xs, ws, ys) = rec.runs[-1]
    # roles swapped: grad_y is the convolution's input, the padded x its output gradient
    assert direction == "backward_filter" and pad == (1, 1) and dil == (1, 2)
    assert xs == TY_SHAPE and ws == (4, 2, 3, 3) and ys == (1, 4, 4, 5)
    (src, dst), = rec.copies  # x into the corner of zeros
    assert src is TX and dst.shape == TX.shape and dst.strides == (4 * 4 * 5, 4 * 5, 5, 1)


def test_conv_transpose_input_gradient_with_output_padding_at_least_stride_drops_the_extra(
        monkeypatch):
    rec = _Recorder(monkeypatch)
    gy = t(*TY_SHAPE, ptr=0x7F0000000000 + (2 << 36))
    gx = pycudnn.conv_transpose_backward_data(gy, TW, TX.shape, **TGEO)
    assert gx.shape == TX.shape
    direction, pad, dil, (xs, ws, ys) = rec.runs[-1]
    assert direction == "forward" and xs == TY_SHAPE and ys == (1, 4, 4, 5)
    (src, dst), = rec.copies  # the first 4 of the 5 positions in W
    assert src.shape == TX.shape and src.strides == (4 * 4 * 5, 4 * 5, 5, 1) and dst is gx


def test_conv_transpose_gradients_below_the_stride_are_the_plain_convolutions(monkeypatch):
    rec = _Recorder(monkeypatch)
    x, w = t(2, 4, 5, 5), t(4, 3, 3, 3, ptr=0x7F0000000000 + (1 << 36))
    gy = t(2, 3, 10, 10, ptr=0x7F0000000000 + (2 << 36))  # (5 - 1) * 2 - 2 + 2 + 1 + 1
    geo = dict(stride=2, padding=1, output_padding=1)
    assert pycudnn.conv_transpose_backward_data(gy, w, x.shape, **geo).shape == x.shape
    assert pycudnn.conv_transpose_backward_filter(x, gy, w.shape, **geo).shape == w.shape
    assert [r[0] for r in rec.runs] == ["forward", "backward_filter"] and rec.copies == []


@pytest.mark.parametrize("call,words", [
    (lambda: pycudnn.conv_transpose_backward_filter(TX, t(1, 2, 4, 6), (4, 2, 3, 3), **TGEO),
     r"conv_transpose_backward_filter: expected grad_y of size \[1, 2, 4, 7\] for input "
     r"\[1, 4, 4, 4\] and weight \[4, 2, 3, 3\], but got \[1, 2, 4, 6\]"),
    (lambda: pycudnn.conv_transpose_backward_data(t(1, 2, 4, 6), TW, (1, 4, 4, 4), **TGEO),
     r"conv_transpose_backward_data: expected grad_y of size \[1, 2, 4, 7\] for input_shape "
     r"\[1, 4, 4, 4\] and weight \[4, 2, 3, 3\], but got \[1, 2, 4, 6\]"),
    (lambda: pycudnn.conv_transpose_backward_filter(TX, t(*TY_SHAPE), (4, 2, 3, 3), stride=1,
                                                    output_padding=1),
     "conv_transpose_backward_filter: output padding must be smaller than either stride or "
     "dilation, but got output_padding_height: 1"),
    (lambda: pycudnn.conv_transpose_backward_filter(TX, t(*TY_SHAPE), (3, 2, 3, 3), **TGEO),
     r"expected input\[1, 4, 4, 4\] to have 3 channels, but got 4"),
    (lambda: pycudnn.conv_transpose_backward_data(t(*TY_SHAPE), TW, (1, 4, 4), **TGEO),
     "input_shape: expected 4 sizes"),
    (lambda: pycudnn.conv_transpose_backward_data(t(*TY_SHAPE, dtype="float16"), TW,
                                                  (1, 4, 4, 4), **TGEO),
     "float16"),
])
def test_conv_transpose_gradient_bad_input_is_refused_before_any_gpu_work(call, words):
    with pytest.raises((ValueError, TypeError), match=words):
        call()
