"""Backend-descriptor layer on the CPU: enum values against cuDNN's header, RAII, validation.

Creating backend descriptors and setting attributes works without a GPU; finalizing needs one
(status 1008 here), so finalize-dependent behaviour lives in test_graph_gpu.py.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import threading

import pytest

from pycudnn.ffi import backend as B
from pycudnn.cudnn import graph as G
from pycudnn.ffi import library as _lib
from pycudnn.errors import CudnnError


# ---- the header ----------------------------------------------------------------------------

def _header_text() -> str | None:
    candidates = []
    try:
        libdir = os.path.dirname(os.path.realpath(_lib.lib().path))
        candidates.append(os.path.join(os.path.dirname(libdir), "include", "cudnn_graph_v9.h"))
        candidates.append(os.path.join(os.path.dirname(libdir), "include", "cudnn_graph.h"))
    except Exception:
        pass
    try:
        import nvidia.cudnn as nc

        for base in list(getattr(nc, "__path__", [])):
            candidates.append(os.path.join(base, "include", "cudnn_graph_v9.h"))
    except Exception:
        pass
    candidates += ["/usr/include/cudnn_graph_v9.h", "/usr/include/cudnn_graph.h"]
    for p in candidates:
        if os.path.exists(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                return f.read()
    return None


def _parse_enums(text: str) -> dict[str, dict[str, int]]:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"typedef\s+enum\s*\{(.*?)\}\s*(\w+)", text, flags=re.S):
        body, name = m.groups()
        members = {}
        for entry in body.split(","):
            mm = re.match(r"\s*(\w+)(?:\s+\w+)*\s*=\s*(-?\w+)\s*$", entry.strip())
            if mm:
                try:
                    members[mm.group(1)] = int(mm.group(2), 0)
                except ValueError:
                    pass
        out[name] = members
    return out


@pytest.fixture(scope="module")
def header_enums():
    text = _header_text()
    if text is None:
        pytest.skip("cudnn_graph_v9.h not found beside the loaded libcudnn")
    return _parse_enums(text)


# (python enum, C typedef, C name of a member)
_ENUM_MAP = [
    (B.DescriptorType, "cudnnBackendDescriptorType_t", lambda n: f"CUDNN_BACKEND_{n}_DESCRIPTOR"),
    (B.Attr, "cudnnBackendAttributeName_t", lambda n: f"CUDNN_ATTR_{n}"),
    (B.AttrType, "cudnnBackendAttributeType_t", lambda n: f"CUDNN_TYPE_{n}"),
    (B.HeurMode, "cudnnBackendHeurMode_t", lambda n: f"CUDNN_HEUR_MODE_{n}"),
    (B.BehaviorNote, "cudnnBackendBehaviorNote_t", lambda n: f"CUDNN_BEHAVIOR_NOTE_{n}"),
    (B.NumericalNote, "cudnnBackendNumericalNote_t", lambda n: f"CUDNN_NUMERICAL_NOTE_{n}"),
    (B.PointwiseMode, "cudnnPointwiseMode_t", lambda n: f"CUDNN_POINTWISE_{n}"),
    (B.KnobType, "cudnnBackendKnobType_t", lambda n: f"CUDNN_KNOB_TYPE_{n}"),
    (B.ConvMode, "cudnnConvolutionMode_t", lambda n: f"CUDNN_{n}"),
    (B.GenStatsMode, "cudnnGenStatsMode_t", lambda n: f"CUDNN_GENSTATS_{n}"),
    (B.BnFinalizeStatsMode, "cudnnBnFinalizeStatsMode_t",
     lambda n: f"CUDNN_BN_FINALIZE_STATISTICS_{n}"),
]


# members added after cuDNN 9.0 that an older header may lack (values are never renumbered)
_NEWER_THAN_9_0 = {B.KnobType.INPUT_TMA_ENABLE, B.KnobType.OUTPUT_TMA_ENABLE}


@pytest.mark.parametrize("enum_cls,typedef,cname", _ENUM_MAP, ids=[e[0].__name__ for e in _ENUM_MAP])
def test_enum_values_match_header(header_enums, enum_cls, typedef, cname):
    assert typedef in header_enums, f"{typedef} not found in the header"
    table = header_enums[typedef]
    assert len(table) >= min(2, len(enum_cls))
    checked = 0
    for member in enum_cls:
        name = cname(member.name)
        if member in _NEWER_THAN_9_0 and name not in table:
            checked += 1  # an older cuDNN's header (e.g. 9.19) does not list it yet
            continue
        assert name in table, f"{name} missing from {typedef}"
        assert table[name] == int(member), f"{name}: header {table[name]} != ours {int(member)}"
        checked += 1
    assert checked == len(enum_cls)


def test_enough_names_checked(header_enums):
    total = sum(len(e[0]) for e in _ENUM_MAP)
    assert total >= 40


def test_attribute_type_table_is_consistent():
    for attr, atype in B.ATTRIBUTE_TYPES.items():
        assert isinstance(attr, B.Attr) and isinstance(atype, B.AttrType)


# ---- descriptors ---------------------------------------------------------------------------

@pytest.fixture
def tensor_desc():
    try:
        d = B.BackendDescriptor(B.DescriptorType.TENSOR)
    except CudnnError as exc:
        pytest.skip(f"backend descriptors cannot be created here: {exc.status_name}")
    yield d
    d.close()


def test_create_close_and_live_count(tensor_desc):
    before = B.live_count()
    d = B.BackendDescriptor(B.DescriptorType.TENSOR)
    assert B.live_count() == before + 1
    assert B.live_counts_by_type().get("TENSOR", 0) >= 2
    assert not d.closed and d.ptr
    d.close()
    assert d.closed
    assert B.live_count() == before
    d.close()  # double close is harmless
    assert B.live_count() == before


def test_garbage_collection_frees(tensor_desc):
    before = B.live_count()
    for _ in range(50):
        B.BackendDescriptor(B.DescriptorType.CONVOLUTION)
    gc.collect()
    assert B.live_count() == before


def test_context_manager(tensor_desc):
    before = B.live_count()
    with B.BackendDescriptor(B.DescriptorType.POINTWISE) as d:
        assert B.live_count() == before + 1
        d.set_enum(B.Attr.POINTWISE_MODE, B.PointwiseMode.RELU_FWD)
    assert d.closed and B.live_count() == before
    with pytest.raises(B.ClosedDescriptorError):
        with d:
            pass


def test_use_after_close_raises_python_error(tensor_desc):
    d = B.BackendDescriptor(B.DescriptorType.TENSOR)
    d.close()
    with pytest.raises(B.ClosedDescriptorError, match="after close"):
        d.set_int64(B.Attr.TENSOR_UNIQUE_ID, 3)
    with pytest.raises(B.ClosedDescriptorError):
        d.finalize()
    with pytest.raises(B.ClosedDescriptorError):
        d.get_int64(B.Attr.TENSOR_UNIQUE_ID)
    with pytest.raises(B.ClosedDescriptorError):
        _ = d.ptr
    owner = B.BackendDescriptor(B.DescriptorType.OPERATIONGRAPH)
    with pytest.raises(B.ClosedDescriptorError):
        owner.set_descriptors(B.Attr.OPERATIONGRAPH_OPS, [d])
    owner.close()


def test_children_kept_alive_by_owner(tensor_desc):
    before = B.live_count()
    owner = B.BackendDescriptor(B.DescriptorType.OPERATION_CONVOLUTION_FORWARD)
    child = B.BackendDescriptor(B.DescriptorType.TENSOR)
    owner.set_descriptor(B.Attr.OPERATION_CONVOLUTION_FORWARD_X, child)
    del child
    gc.collect()
    assert B.live_count() == before + 2  # the child lives as long as its owner
    owner.close()
    gc.collect()
    assert B.live_count() == before


def test_finalize_without_gpu_reports_status(tensor_desc):
    from conftest import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present: finalize is covered by test_graph_gpu.py")
    tensor_desc.set_int64s(B.Attr.TENSOR_DIMENSIONS, [1, 2, 3, 4])
    with pytest.raises(CudnnError) as ei:
        tensor_desc.finalize()
    assert ei.value.function == "cudnnBackendFinalize"
    assert "TENSOR" in str(ei.value)


def test_setters_accept_good_values(tensor_desc):
    d = tensor_desc
    d.set_int64(B.Attr.TENSOR_UNIQUE_ID, 7)
    d.set_int64s(B.Attr.TENSOR_DIMENSIONS, (2, 3, 4, 5))
    d.set_int64s(B.Attr.TENSOR_STRIDES, G.nhwc_strides((2, 3, 4, 5)))
    d.set_int64(B.Attr.TENSOR_BYTE_ALIGNMENT, 16)
    d.set_data_type(B.Attr.TENSOR_DATA_TYPE, "bfloat16")
    d.set_bool(B.Attr.TENSOR_IS_VIRTUAL, False)
    d.set_bool(B.Attr.TENSOR_IS_BY_VALUE, False)
    conv = B.BackendDescriptor(B.DescriptorType.CONVOLUTION)
    conv.set_enum(B.Attr.CONVOLUTION_CONV_MODE, B.ConvMode.CROSS_CORRELATION)
    conv.set_data_type(B.Attr.CONVOLUTION_COMP_TYPE, "float32")
    op = B.BackendDescriptor(B.DescriptorType.OPERATION_CONVOLUTION_FORWARD)
    op.set_float(B.Attr.OPERATION_CONVOLUTION_FORWARD_ALPHA, 1.0)
    op.set_double(B.Attr.OPERATION_CONVOLUTION_FORWARD_BETA, 0.0)
    vp = B.BackendDescriptor(B.DescriptorType.VARIANT_PACK)
    vp.set_void_ptrs(B.Attr.VARIANT_PACK_DATA_POINTERS, [0x1000, 0x2000])
    vp.set_void_ptrs(B.Attr.VARIANT_PACK_WORKSPACE, [0])
    plan = B.BackendDescriptor(B.DescriptorType.EXECUTION_PLAN)
    plan.set_chars(B.Attr.EXECUTION_PLAN_JSON_REPRESENTATION, "{}")
    for x in (conv, op, vp, plan):
        x.close()


@pytest.mark.parametrize("call,exc,words", [
    (lambda d: d.set_int64(B.Attr.TENSOR_UNIQUE_ID, 1.5), TypeError, "TENSOR_UNIQUE_ID"),
    (lambda d: d.set_int64(B.Attr.TENSOR_UNIQUE_ID, True), TypeError, "TENSOR_UNIQUE_ID"),
    (lambda d: d.set_int64(B.Attr.TENSOR_UNIQUE_ID, 1 << 64), ValueError, "TENSOR_UNIQUE_ID"),
    (lambda d: d.set_int64s(B.Attr.TENSOR_DIMENSIONS, "1234"), TypeError, "TENSOR_DIMENSIONS"),
    (lambda d: d.set_int64s(B.Attr.TENSOR_DIMENSIONS, [1, 2.0]), TypeError, "TENSOR_DIMENSIONS"),
    (lambda d: d.set_int64(B.Attr.TENSOR_IS_VIRTUAL, 1), ValueError, "TENSOR_IS_VIRTUAL"),
    (lambda d: d.set_bool(B.Attr.TENSOR_IS_VIRTUAL, 1), TypeError, "TENSOR_IS_VIRTUAL"),
    (lambda d: d.set_bool(B.Attr.TENSOR_DIMENSIONS, True), ValueError, "TENSOR_DIMENSIONS"),
    (lambda d: d.set_data_type(B.Attr.TENSOR_DATA_TYPE, "int3"), TypeError, "TENSOR_DATA_TYPE"),
    (lambda d: d.set_data_type(B.Attr.TENSOR_DIMENSIONS, "float32"), ValueError, "TENSOR_DIMENSIONS"),
    (lambda d: d.set_enum(B.Attr.TENSOR_DIMENSIONS, 1), ValueError, "TENSOR_DIMENSIONS"),
    (lambda d: d.set_enum(B.Attr.POINTWISE_MODE, B.HeurMode.A), TypeError, "POINTWISE_MODE"),
    (lambda d: d.set_float(B.Attr.TENSOR_UNIQUE_ID, 1.0), ValueError, "TENSOR_UNIQUE_ID"),
    (lambda d: d.set_float(B.Attr.OPERATION_POINTWISE_ALPHA1, "x"), TypeError, "ALPHA1"),
    (lambda d: d.set_double(B.Attr.OPERATION_POINTWISE_ALPHA2, None), TypeError, "ALPHA2"),
    (lambda d: d.set_handle(B.Attr.OPERATIONGRAPH_HANDLE, 0), TypeError, "OPERATIONGRAPH_HANDLE"),
    (lambda d: d.set_handle(B.Attr.OPERATIONGRAPH_HANDLE, "h"), TypeError, "OPERATIONGRAPH_HANDLE"),
    (lambda d: d.set_void_ptrs(B.Attr.VARIANT_PACK_DATA_POINTERS, [-1]), ValueError, "DATA_POINTERS"),
    (lambda d: d.set_void_ptrs(B.Attr.VARIANT_PACK_DATA_POINTERS, 5), TypeError, "DATA_POINTERS"),
    (lambda d: d.set_descriptors(B.Attr.OPERATIONGRAPH_OPS, [123]), TypeError, "OPERATIONGRAPH_OPS"),
    (lambda d: d.set_descriptors(B.Attr.OPERATIONGRAPH_OPS, [None]), TypeError, "OPERATIONGRAPH_OPS"),
    (lambda d: d.set_descriptor(B.Attr.ENGINECFG_ENGINE, object()), TypeError, "ENGINECFG_ENGINE"),
    (lambda d: d.set_descriptors(B.Attr.TENSOR_DIMENSIONS, []), ValueError, "TENSOR_DIMENSIONS"),
    (lambda d: d.set_chars(B.Attr.EXECUTION_PLAN_JSON_REPRESENTATION, 5), TypeError, "JSON"),
    (lambda d: d.get_descriptors(B.Attr.ENGINEHEUR_RESULTS, B.DescriptorType.ENGINECFG, -1),
     ValueError, "count"),
    (lambda d: d.set_int64("TENSOR_UNIQUE_ID", 1), TypeError, "Attr"),
])
def test_setter_validation(tensor_desc, call, exc, words):
    before = B.live_count()
    with pytest.raises(exc, match=words):
        call(tensor_desc)
    assert B.live_count() == before


def test_wrong_c_type_is_refused_by_cudnn_with_reason(tensor_desc):
    # an attribute outside our table reaches cuDNN, which names the mismatch
    with pytest.raises(CudnnError) as ei:
        v = ctypes.c_float(1.0)
        tensor_desc._set(int(B.Attr.TENSOR_UNIQUE_ID), B.AttrType.FLOAT, 1, ctypes.byref(v))
    assert "TENSOR_UNIQUE_ID" in str(ei.value)


def test_json_only_on_plans(tensor_desc):
    with pytest.raises(ValueError, match="execution plans"):
        tensor_desc.get_json()


def test_descriptor_type_validation():
    with pytest.raises(TypeError):
        B.BackendDescriptor("TENSOR")
    with pytest.raises(TypeError):
        B.BackendDescriptor(True)


def test_threads_create_and_close(tensor_desc):
    before = B.live_count()
    errors = []

    def work():
        try:
            for _ in range(200):
                with B.BackendDescriptor(B.DescriptorType.TENSOR) as d:
                    d.set_int64(B.Attr.TENSOR_UNIQUE_ID, 1)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert B.live_count() == before


# ---- graph-level validation that needs no GPU ----------------------------------------------

def test_tensor_spec_validation():
    with pytest.raises(ValueError):
        G.TensorSpec(1, (1, 2, 3), (6, 3), "float32")
    with pytest.raises(ValueError):
        G.TensorSpec(1, (1, 0, 3, 3), (1, 1, 1, 1), "float32")
    with pytest.raises(TypeError):
        G.TensorSpec(-1, (1, 2, 3, 3), G.nchw_strides((1, 2, 3, 3)), "float32")
    with pytest.raises(TypeError):
        G.TensorSpec(1, (1, 2, 3, 3), G.nchw_strides((1, 2, 3, 3)), "int3")
    with pytest.raises(ValueError):
        G.TensorSpec(1, (1, 2, 3, 3), G.nchw_strides((1, 2, 3, 3)), "float32", alignment=12)
    t = G.TensorSpec(1, [2, 3, 4, 5], G.nhwc_strides((2, 3, 4, 5)), "float16")
    assert t.strides == (60, 1, 15, 3) and t.dtype == 2


def test_strides_helpers():
    assert G.nchw_strides((2, 3, 4, 5)) == (60, 20, 5, 1)
    assert G.nhwc_strides((2, 3, 4, 5)) == (60, 1, 15, 3)
    assert G.nhwc_strides((2, 3, 4, 5, 6)) == (360, 1, 90, 18, 3)
    b = G.bias_spec(9, 8, 4, "bfloat16")
    assert b.shape == (1, 8, 1, 1) and b.strides == (8, 1, 8, 8)


def test_graph_shape_errors_before_any_c_call():
    x = G.TensorSpec(1, (2, 4, 9, 9), G.nchw_strides((2, 4, 9, 9)), "float32")
    w = G.TensorSpec(2, (6, 2, 3, 3), G.nchw_strides((6, 2, 3, 3)), "float32")
    y_bad = G.TensorSpec(3, (2, 6, 8, 8), G.nchw_strides((2, 6, 8, 8)), "float32")
    with pytest.raises(ValueError, match="spatial dim"):
        G.build_convolution_graph(1, "forward", x, w, y_bad, 1, 1, 1)
    w_bad = G.TensorSpec(2, (6, 3, 3, 3), G.nchw_strides((6, 3, 3, 3)), "float32")
    y = G.TensorSpec(3, (2, 6, 9, 9), G.nchw_strides((2, 6, 9, 9)), "float32")
    with pytest.raises(ValueError, match="multiple"):
        G.build_convolution_graph(1, "forward", x, w_bad, y, 1, 1, 1)
    with pytest.raises(ValueError, match="direction"):
        G.build_convolution_graph(1, "sideways", x, w, y, 1, 1, 1)
    with pytest.raises(ValueError, match="epilogue"):
        G.build_convolution_graph(1, "backward_data", x, w, y, 1, 1, 1,
                                  epilogue=G.Epilogue(relu=True))
    with pytest.raises(ValueError, match="distinct"):
        G.build_convolution_graph(1, "forward", x, w, y.like(1), 1, 1, 1)
    with pytest.raises(ValueError, match="4-D or 5-D"):
        x3 = G.TensorSpec(1, (2, 4, 9), (36, 9, 1), "float32")
        G.build_convolution_graph(1, "forward", x3, x3.like(2), x3.like(3), 1, 1, 1)
    with pytest.raises(ValueError, match="alpha"):
        G.Epilogue(alpha=0.5)
    with pytest.raises(ValueError, match="alpha_mode"):
        G.Epilogue(alpha_mode="nope")


def test_filter_candidates_rules():
    NN = B.NumericalNote

    def cand(eid, *notes):
        return G.EngineConfig(descriptor=None, graph=None, engine_id=eid, knobs=(),
                              numerical_notes=tuple(notes), behavior_notes=())

    cs = [cand(0), cand(1, NN.TENSOR_CORE), cand(2, NN.DOWN_CONVERT_INPUTS),
          cand(3, NN.NONDETERMINISTIC), cand(4, NN.TENSOR_CORE, NN.NONDETERMINISTIC)]
    kept, dropped = G.filter_candidates(cs, "float32", allow_tf32=False, deterministic=True)
    assert [c.engine_id for c in kept] == [0]
    assert {c.engine_id for c, _ in dropped} == {1, 2, 3, 4}
    kept, _ = G.filter_candidates(cs, "float32", allow_tf32=True, deterministic=False)
    assert [c.engine_id for c in kept] == [0, 1, 3, 4]
    kept, _ = G.filter_candidates(cs, "bfloat16", allow_tf32=False, deterministic=False)
    assert [c.engine_id for c in kept] == [0, 1, 3, 4]
    kept, dropped = G.filter_candidates(cs, "float16", allow_tf32=False, deterministic=True)
    assert [c.engine_id for c in kept] == [0, 1]
    assert all(isinstance(r, str) and r for _, r in dropped)


def test_engine_config_key_and_tag():
    c = G.EngineConfig(None, None, 41, ((B.KnobType.TILE_SIZE, 3), (B.KnobType.SWIZZLE, 0)),
                       (), (B.BehaviorNote.RUNTIME_COMPILATION,))
    assert c.key == (41, ((1, 0), (2, 3)))
    assert c.tag == "eng41_k1=0_k2=3"
    assert c.runtime_compiled and not c.tensor_core
