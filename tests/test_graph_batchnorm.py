"""The batch-norm fusion graphs' argument checks (each before any descriptor is made, naming the
tensor and what it must be), that a refused build leaves no descriptor behind, and that the new
attributes take the values cuDNN's header gives them (the real libcudnn answers). Their results
are checked on a GPU in test_graph_batchnorm_gpu.py."""

from __future__ import annotations

import pytest

from pycudnn.cudnn import graph as G
from pycudnn.errors import CudnnError
from pycudnn.ffi import backend as B

BF16 = 9


def nhwc(uid, *shape):
    return G.TensorSpec(uid, shape, G.nhwc_strides(shape), BF16)


def chans(first, count, c):
    return [G.channel_spec(first + i, c) for i in range(count)]


X, W, Y = nhwc(1, 4, 32, 16, 16), nhwc(2, 64, 32, 3, 3), nhwc(3, 4, 64, 16, 16)


def test_channel_spec_is_one_float_per_channel_channels_last():
    s = G.channel_spec(5, 48)
    assert (s.shape, s.strides, s.dtype) == ((1, 48, 1, 1), (48, 1, 48, 48), 0)


@pytest.mark.parametrize("build,words", [
    (lambda: G.build_conv_genstats_graph(0, X, W, Y, *chans(4, 2, 32), 1),
     "sums shape (1, 32, 1, 1) must be (1, 64, 1, 1)"),
    (lambda: G.build_conv_genstats_graph(0, X, W, Y, *chans(4, 2, 64), 0),
     "spatial dim 0"),
    (lambda: G.build_conv_genstats_graph(0, X, W, Y, *chans(4, 2, 64), 1, prologue=G.ScaleBiasRelu(
        *chans(6, 2, 64))), "prologue scale shape (1, 64, 1, 1) must be (1, 32, 1, 1)"),
    (lambda: G.build_conv_genstats_graph(0, X, W, Y, G.channel_spec(1, 64),
                                         G.channel_spec(5, 64), 1), "distinct"),
    (lambda: G.build_conv_genstats_graph(0, X, W, Y.like(3, virtual=True), *chans(4, 2, 64), 1),
     "y must be a real"),
    (lambda: G.build_bn_finalize_graph(0, *chans(1, 10, 8), count=0, eps=1e-5, momentum=0.1),
     "count must be"),
    (lambda: G.build_bn_finalize_graph(0, *chans(1, 10, 8), count=True, eps=1e-5, momentum=0.1),
     "count must be"),
    (lambda: G.build_bn_finalize_graph(0, *chans(1, 10, 8), count=64, eps=-1.0, momentum=0.1),
     "eps must be"),
    (lambda: G.build_bn_finalize_graph(0, *chans(1, 10, 8), count=64, eps=1e-5,
                                       momentum=float("nan")), "momentum must be"),
    (lambda: G.build_bn_finalize_graph(0, *chans(1, 9, 8), G.channel_spec(10, 4), count=64,
                                       eps=1e-5, momentum=0.1),
     "eq_bias shape (1, 4, 1, 1) must be (1, 8, 1, 1)"),
    (lambda: G.build_sbr_wgrad_graph(0, X, Y, W, G.ScaleBiasRelu(*chans(4, 2, 32)), 2),
     "spatial dim 0"),
    (lambda: G.build_dgrad_drelu_dbn_graph(0, Y, W, X, nhwc(4, 4, 32, 8, 8), *chans(5, 9, 32),
                                           padding=1), "dx_relu shape"),
    (lambda: G.build_dgrad_drelu_dbn_graph(0, Y, W, X, nhwc(4, 4, 32, 16, 16),
                                           *chans(5, 8, 32), G.channel_spec(13, 64), padding=1),
     "eq_bias shape (1, 64, 1, 1) must be (1, 32, 1, 1)"),
])
def test_arguments_are_checked_before_any_descriptor(build, words):
    before = B.live_count()
    with pytest.raises(ValueError) as ei:
        build()
    assert words in str(ei.value)
    assert B.live_count() == before


@pytest.mark.parametrize("build", [
    lambda: G.build_conv_genstats_graph(0, X, W, Y, *chans(4, 2, 64), 1),
    lambda: G.build_conv_genstats_graph(0, X, W, Y, *chans(4, 2, 64), 1,
                                        prologue=G.ScaleBiasRelu(*chans(6, 2, 32))),
    lambda: G.build_bn_finalize_graph(0, *chans(1, 10, 8), count=64, eps=1e-5, momentum=0.1),
    lambda: G.build_sbr_wgrad_graph(0, X, Y, W, G.ScaleBiasRelu(*chans(4, 2, 32)), 1),
    lambda: G.build_dgrad_drelu_dbn_graph(0, Y, W, X, nhwc(4, 4, 32, 16, 16), *chans(5, 9, 32),
                                          padding=1),
], ids=["genstats", "sbr_genstats", "finalize", "sbr_wgrad", "dgrad_drelu_dbn"])
def test_a_build_cudnn_refuses_leaves_no_descriptor(build):
    from conftest import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present: the graphs are built in test_graph_batchnorm_gpu.py")
    before = B.live_count()
    with pytest.raises(CudnnError) as ei:  # handle 0 and no GPU: cuDNN refuses a finalize
        build()
    assert "graph: " in str(ei.value)  # the graph and its tensors are named
    assert B.live_count() == before


@pytest.mark.parametrize("kind,attr,setter,value", [
    (B.DescriptorType.OPERATION_GEN_STATS, B.Attr.OPERATION_GENSTATS_MODE, "set_enum",
     B.GenStatsMode.SUM_SQSUM),
    (B.DescriptorType.OPERATION_GEN_STATS, B.Attr.OPERATION_GENSTATS_MATH_PREC, "set_data_type",
     "float32"),
    (B.DescriptorType.OPERATION_BN_FINALIZE_STATISTICS, B.Attr.OPERATION_BN_FINALIZE_STATS_MODE,
     "set_enum", B.BnFinalizeStatsMode.TRAINING),
    (B.DescriptorType.OPERATION_BN_FINALIZE_STATISTICS, B.Attr.OPERATION_BN_FINALIZE_MATH_PREC,
     "set_data_type", "float32"),
    (B.DescriptorType.OPERATION_BN_BWD_WEIGHTS, B.Attr.OPERATION_BN_BWD_WEIGHTS_MATH_PREC,
     "set_data_type", "float32"),
], ids=["genstats_mode", "genstats_prec", "finalize_mode", "finalize_prec", "bn_bwd_prec"])
def test_new_attributes_take_their_values(kind, attr, setter, value):
    try:
        d = B.BackendDescriptor(kind)
    except CudnnError as exc:
        pytest.skip(f"backend descriptors cannot be created here: {exc.status_name}")
    with d:
        getattr(d, setter)(attr, value)  # cuDNN checks the attribute's type and count
        with pytest.raises(ValueError, match=f"{attr.symbol} takes"):
            d.set_int64(attr, 1)  # the table refuses another C type before any C call


def test_the_package_hands_on_the_builders():
    from pycudnn.cudnn.graph import batchnorm

    for name in batchnorm.__all__:
        assert getattr(G, name) is getattr(batchnorm, name)
