"""The documentation stays true: docs/troubleshooting.md quotes the messages pycudnn really raises
(reproduced here without a GPU), and the pages mkdocs.yml names exist."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import pycudnn

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TROUBLE = (DOCS / "troubleshooting.md").read_text()


def T(shape, dtype="float32", strides=None):
    return pycudnn.tensor_from_pointer(0x10000, shape, dtype, strides=strides)


class NegativeStrides:
    __cuda_array_interface__ = {"shape": (2, 2), "typestr": "<f4", "data": (0x10000, False),
                                "strides": (-16, 4), "version": 2}


def _cupy_compat(**kw):
    from pycudnn import cupy_compat as cc

    args = dict(auto_tune=False, tensor_core="auto")
    args.update(kw)
    cc.convolution_forward(T((2, 3, 8, 8)), T((4, 3, 3, 3)), None, T((2, 4, 6, 6)), (0, 0), (1, 1),
                           (1, 1), 1, **args)


def _descriptor(shape, **kw):
    from pycudnn.cudnn.descriptors import TensorDescriptor

    TensorDescriptor(shape, "float32", **kw)


CASES = {
    "host array": lambda: pycudnn.as_tensor(__import__("numpy").zeros(3)),
    "dtype": lambda: pycudnn.tensor_from_pointer(0x10000, (3,), "int32"),
    "negative strides": lambda: pycudnn.as_tensor(NegativeStrides()),
    "channels": lambda: pycudnn.convolution(T((2, 3, 8, 8)), T((4, 5, 3, 3))),
    "kernel too big": lambda: pycudnn.convolution(T((2, 3, 2, 2)), T((4, 3, 3, 3))),
    "dtype mismatch": lambda: pycudnn.convolution(T((2, 3, 8, 8)), T((4, 3, 3, 3), "float16")),
    "out shape": lambda: pycudnn.convolution(T((2, 3, 8, 8)), T((4, 3, 3, 3)), out=T((2, 4, 8, 8))),
    "backward data shape": lambda: pycudnn.convolution_backward_data(
        T((2, 4, 7, 7)), T((4, 3, 3, 3)), (2, 3, 8, 8)),
    "padding": lambda: pycudnn.convolution(T((2, 3, 8, 8)), T((4, 3, 3, 3)), padding=(1, 1, 1)),
    "bias": lambda: pycudnn.convolution(T((2, 3, 8, 8)), T((4, 3, 3, 3)), T((5,))),
    "flag": lambda: pycudnn.convolution(T((2, 3, 8, 8)), T((4, 3, 3, 3)), benchmarks=True),
    "stream": lambda: pycudnn.convolution(T((2, 3, 8, 8)), T((4, 3, 3, 3)), stream="s"),
    "tensor_core": lambda: _cupy_compat(tensor_core="on"),
    "layout": lambda: _cupy_compat(d_layout=2),
    "2^31 span": lambda: _descriptor((2**30, 2, 1, 1)),
    "out overlaps input": lambda: pycudnn.convolution(T((2, 3, 8, 8)), T((4, 3, 3, 3)),
                                                      out=T((2, 4, 6, 6))),
    "sample size": lambda: pycudnn.convolution(T((1, 1, 50000, 50000)), T((1, 1, 1, 1))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_troubleshooting_quotes_real_messages(name):
    with pytest.raises(Exception) as info:
        CASES[name]()
    message = str(info.value)
    assert message in TROUBLE, f"docs/troubleshooting.md does not quote:\n{message}"


def test_cudnn_reason_format():
    with pytest.raises(pycudnn.CudnnBadParamError) as info:
        _descriptor((1, -1, 4, 4), validate=False)
    first, second = str(info.value).split("\n")[:2]
    # cuDNN 9.28 words its reason differently from 9.19: compare what pycudnn controls
    assert first.split(":")[0] + ":" in TROUBLE
    assert second in TROUBLE


def test_library_not_found_hint():
    from pycudnn.ffi import library as _lib

    assert _lib.INSTALL_HINT in TROUBLE
    assert "could not load libcudnn; tried, in order:" in TROUBLE


def test_no_device_message():
    from conftest import gpu_reason

    if gpu_reason() is None:
        pytest.skip("this machine has a GPU")
    with pytest.raises(pycudnn.NoDeviceError) as info:
        pycudnn.from_numpy(np.zeros(4, np.float32))
    if "no NVIDIA driver found" not in str(info.value):
        pytest.skip(f"another reason here: {info.value}")
    assert str(info.value) in TROUBLE


def test_docstrings_use_markdown_cross_references_not_sphinx_roles():
    """The API reference renders Markdown: a cross-reference is [`name`][pycudnn.module.name]
    (or plain `name` for what the reference does not show), never a Sphinx role."""
    role = re.compile(r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj|const):`")
    found = [f"{path.name}:{n}: {line.strip()}"
             for path in sorted((ROOT / "pycudnn").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if role.search(line)]
    assert not found, "\n".join(found)


def test_every_page_in_the_nav_exists():
    nav = re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert nav, "mkdocs.yml has no nav"
    for page in nav:
        assert (DOCS / page).is_file(), page
    for page in sorted(p.name for p in DOCS.glob("*.md")):
        assert page in nav, f"docs/{page} is missing from mkdocs.yml's nav (readers cannot reach it)"


def test_install_instructions_name_our_distribution():
    """The package index's "pycudnn" is another project: no page tells users to install it."""
    for path in [ROOT / "README.md", *DOCS.glob("*.md")]:
        text = path.read_text()
        for bad in ('install "pycudnn[', "install 'pycudnn[", "install pycudnn[", "install pycudnn\n",
                    "install pycudnn "):
            assert bad not in text, f"{path.name} says {bad!r}"


def test_api_reference_docstrings_render_without_sphinx_roles():
    """tools/griffe_docstrings.py (loaded by mkdocs.yml) turns every Sphinx role left in a
    docstring into inline code and splits shared parameter lines, so the reference shows neither
    a raw role nor "stride, padding, dilation" as one required parameter."""
    import importlib.util
    import inspect

    spec = importlib.util.spec_from_file_location("griffe_docstrings",
                                                  ROOT / "tools" / "griffe_docstrings.py")
    if importlib.util.find_spec("griffe") is None:
        pytest.skip("could not import 'griffe' (not installed)")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    assert ext.convert(":func:`~pycudnn.search.iterate.try_all` and :class:`pycudnn.Tensor`") == \
        "`try_all()` and `pycudnn.Tensor`"
    assert ext.convert("Args:\n    stride, padding: an int\n        or a tuple.\n") == \
        "Args:\n    stride: an int\n        or a tuple.\n    padding: an int\n        or a tuple.\n"
    import pycudnn.api.conv

    for name in ("convolution", "conv_transpose", "convolution_backward_data"):
        doc = ext.convert(inspect.getdoc(getattr(pycudnn.api.conv, name)) or "")
        assert ":func:`" not in doc and ":class:`" not in doc and "stride, padding" not in doc
