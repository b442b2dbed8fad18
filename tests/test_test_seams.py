"""Tests reach pycudnn through its public names and documented seams: tools/private_access.py
counts what still reaches a private name, and the count may only go down."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("private_access", REPO / "tools" / "private_access.py")
private_access = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(private_access)

#: what is left, each for a reason a seam would not serve better: the handle finalizer's lock-free
#: queueing (test_live) and the route store's locks held across a fork need the locks themselves;
#: the descriptor finalizer's bound function and counter are asserted by identity; the driver
#: fake's per-thread contexts, GraphEngine's graph builder, pycudnn.torch's multi-GPU flag and
#: routing's host-cost floor are patched where no public name sets them
MAX_PRIVATE_ACCESSES = 12
PKG = "pycudnn"


def test_tests_reach_no_more_private_names_than_before():
    counts = private_access.count()
    total = sum(counts.values())
    assert total <= MAX_PRIVATE_ACCESSES, (
        f"{total} private pycudnn names reached from tests (at most {MAX_PRIVATE_ACCESSES}): "
        f"give the package a documented seam instead; per file: {counts}")


def test_every_form_of_private_access_is_counted(tmp_path):
    # PKG for the package's name: this file's own scan must not read the sample as a child's code
    (tmp_path / "test_forms.py").write_text('''
import PKG.runtime.handle as H
import PKG
from PKG.torch import calls
from PKG.ops.hardtanh import _hidden, mask_terms
from PKG import _types

H._pool_lock                                      # a module's private name
PKG.runtime.handle._created                   # the dotted path
calls._FWD.items()                                # counted once, at its first private name
H.get_handle.__name__                             # a dunder: not counted
_types.DataType                                   # a private module by its public names: not counted
from PKG.engines import graph
graph.GraphEngine._graphs                         # a class's private name

def test_x(monkeypatch):
    monkeypatch.setattr("PKG.torch.calls._stream", None)
    monkeypatch.setattr(calls, "_BWD", {})
    monkeypatch.setattr(calls, "describe_signature", None)   # public: not counted
    for name in ("_a", "_b"):
        monkeypatch.setattr(H, name, None)
    for module, name in ((H, "_c"),):
        monkeypatch.setattr(module, name, None)

CHILD = """
from PKG.tuning import routes
routes._lock
"""
'''.replace("PKG", "pycudnn"))
    found = private_access.private_accesses(tmp_path / "test_forms.py")
    assert [what for _, what in found] == [
        f"from {PKG}.ops.hardtanh import _hidden",  # an f-string: not read as a child's code
        "pycudnn.runtime.handle._pool_lock",
        "pycudnn.runtime.handle._created",
        "pycudnn.torch.calls._FWD",
        "pycudnn.engines.graph.GraphEngine._graphs",
        "monkeypatch pycudnn.torch.calls._stream",
        "monkeypatch pycudnn.torch.calls._BWD",
        "monkeypatch pycudnn.runtime.handle._a",
        "monkeypatch pycudnn.runtime.handle._b",
        "monkeypatch pycudnn.runtime.handle._c",
        "pycudnn.tuning.routes._lock",
    ]
    assert private_access.count(tmp_path) == {"test_forms.py": 11}


def test_the_tool_prints_per_file_counts_and_the_total():
    out = subprocess.run([sys.executable, str(REPO / "tools" / "private_access.py")],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    counts = private_access.count()
    assert out[-1].split() == [str(sum(counts.values())), "total"]
    assert {line.split()[1].removeprefix("tests/"): int(line.split()[0])
            for line in out[:-1]} == counts
