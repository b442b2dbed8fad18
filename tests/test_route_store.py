"""Routing decisions on disk (CPU): round trips between processes, the checks on what a file
holds, batching of writes, clearing, and the store off with the tuning database.

The GPU identity is monkeypatched (``tuning_db.device_identity``) as in test_tuning_db.py; the
cuDNN version in a key is the real library's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pycudnn.configuration import config
from pycudnn.tuning import db as tuning_db
from pycudnn.tuning import routes as route_store

REPO = Path(__file__).resolve().parents[1]
H200 = {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}
FIGURES = {"pycudnn_gpu_us": 10.5, "torch_gpu_us": 10.2, "pycudnn_call_us": 31.0,
           "torch_call_us": 14.0}
SIG = "x[64, 64, 56, 56] w[64, 64, 3, 3] bfloat16 channels_last stride=(1, 1) padding=(1, 1) " \
      "dilation=(1, 1) groups=1"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYCUDNN_TUNING_DB", raising=False)
    monkeypatch.setattr(tuning_db, "device_identity", lambda device: H200)
    config.reset()
    route_store.forget()
    yield route_store
    route_store.flush()
    route_store.forget()
    config.reset()


def key(direction="forward", signature=SIG, tf32=True, torch_version="2.11.0+cu130"):
    return route_store.decision_key(signature, direction, 0, tf32, False, torch_version, 91900)


def test_a_decision_is_found_by_a_later_process(store):
    store.store(key(), "torch", FIGURES, "GPU time not 3% below PyTorch's")
    assert store.lookup(key())["winner"] == "torch"  # before the write, from this process
    store.flush()
    store.forget()  # a later process: nothing in memory
    got = store.lookup(key())
    assert got["winner"] == "torch" and got["reason"] == "GPU time not 3% below PyTorch's"
    assert got["torch_call_us"] == 14.0 and got["key"]["cudnn"] > 0
    # every field of the key matters: another direction, dtype, flag or PyTorch is not found
    assert store.lookup(key("backward data")) is None
    assert store.lookup(key(signature=SIG.replace("bfloat16", "float16"))) is None
    assert store.lookup(key(tf32=False)) is None
    assert store.lookup(key(torch_version="2.12.0")) is None


def test_decisions_of_one_process_are_written_together(store):
    for i in range(50):
        store.store(key(signature=SIG + f" #{i}"), "pycudnn" if i % 2 else "torch", FIGURES, "r")
    assert not os.path.exists(store.path())  # not yet: one write for all, a moment later
    store.flush()
    doc = json.loads(Path(store.path()).read_text())
    assert doc["format"] == "pycudnn-routes" and len(doc["entries"]) == 50
    assert oct(os.stat(store.path()).st_mode & 0o777) == "0o600"


def test_the_delayed_write_happens_without_a_flush(store):
    import time

    store.store(key(), "torch", FIGURES, "r")
    deadline = time.monotonic() + 10
    while not os.path.exists(store.path()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(json.loads(Path(store.path()).read_text())["entries"]) == 1


def test_another_process_merges_instead_of_replacing(store):
    store.store(key("forward"), "torch", FIGURES, "mine")
    store.flush()
    code = (
        "from pycudnn.tuning import db as tuning_db\n"
        "from pycudnn.tuning import routes as route_store\n"
        f"tuning_db.device_identity = lambda d: {H200!r}\n"
        "k = route_store.decision_key(" + repr(SIG) + ", 'backward data', 0, True, False, "
        "'2.11.0+cu130', 91900)\n"
        f"route_store.store(k, 'pycudnn', {FIGURES!r}, 'theirs')\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))  # written at its exit
    store.forget()
    assert store.lookup(key("forward"))["reason"] == "mine"
    assert store.lookup(key("backward data"))["winner"] == "pycudnn"


@pytest.mark.parametrize("bad, why", [
    ({"winner": "numpy"}, "winner"),
    ({"torch_call_us": float("nan")}, "torch_call_us"),
    ({"torch_call_us": -1.0}, "torch_call_us"),
    ({"reason": "x" * 500}, "reason"),
    ({"extra": 1}, "unknown"),
    ({"key": {"signature": SIG}}, "key"),
])
def test_entries_that_do_not_check_are_dropped_and_the_rest_kept(store, bad, why, caplog):
    store.store(key("forward"), "torch", FIGURES, "good")
    store.store(key("backward data"), "torch", FIGURES, "victim")
    store.flush()
    doc = json.loads(Path(store.path()).read_text())
    victim = next(e for e in doc["entries"] if e["reason"] == "victim")
    victim.update(bad)
    Path(store.path()).write_text(json.dumps(doc))
    store.forget()
    assert store.lookup(key("forward"))["reason"] == "good"
    assert store.lookup(key("backward data")) is None
    assert any(why in r.getMessage() for r in caplog.records)


def test_a_file_that_does_not_parse_is_set_aside(store):
    os.makedirs(os.path.dirname(store.path()), mode=0o700, exist_ok=True)
    Path(store.path()).write_text("{not json")
    os.chmod(store.path(), 0o600)
    with pytest.warns(Warning, match="corrupt|unusable|set aside|moved"):
        assert store.lookup(key()) is None
    assert not os.path.exists(store.path())
    assert any(".corrupt-" in n for n in os.listdir(os.path.dirname(store.path())))
    store.store(key(), "torch", FIGURES, "r")
    store.flush()
    store.forget()
    assert store.lookup(key())["winner"] == "torch"


def test_off_with_the_tuning_database(store):
    config.tuning_db = False
    store.store(key(), "torch", FIGURES, "r")
    store.flush()
    assert store.lookup(key()) is None and not os.path.exists(store.path())
    config.tuning_db = True
    assert store.lookup(key()) is None


def test_clear_removes_every_decision(store):
    store.store(key("forward"), "torch", FIGURES, "r")
    store.store(key("backward data"), "pycudnn", FIGURES, "r")
    store.flush()
    assert len(store.entries()) == 2
    assert store.clear() == 2
    assert store.entries() == [] and store.lookup(key("forward")) is None
    store.forget()
    assert store.lookup(key("forward")) is None


def test_routing_takes_a_stored_decision_without_running_either_side(store):
    torch = pytest.importorskip("torch")
    from pycudnn.torch import routing

    routing.clear_report()
    flags = (True, False)
    k = route_store.decision_key(SIG, "forward", 0, *flags, torch.__version__,
                                 torch.backends.cudnn.version() or 0)
    store.store(k, "torch", FIGURES, "slower back to back (host time)")

    def theirs():
        raise AssertionError("PyTorch's call ran")

    assert routing.prejudge(SIG, "forward", theirs, 0, 0, flags) == "torch"
    (d,) = routing.report()
    assert d["winner"] == "torch" and d["reason"] == "stored: slower back to back (host time)"
    assert d["torch_call_us"] == 14.0
    # nothing stored and no host cost learnt yet: undecided, and PyTorch's call does not run
    assert routing.prejudge(SIG, "backward data", theirs, 0, 0, flags) is None
    assert routing.host_floor("backward data") is None
    routing.clear_report()


def test_pycudnn_cache_lists_and_clears_the_decisions(store):
    store.store(key("forward"), "torch", FIGURES, "slower back to back (host time)")
    store.flush()
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "pycudnn", "cache", *argv], env=env,
                              cwd=REPO, capture_output=True, text=True, check=True).stdout

    out = cli("show")
    assert "1 routing decisions of pycudnn.torch (1 to PyTorch's convolution)" in out
    assert "slower back to back (host time)" in out and "x[64, 64, 56, 56]" in out
    assert json.loads(cli("show", "--json"))["routes"][0]["winner"] == "torch"
    info = subprocess.run([sys.executable, "-m", "pycudnn", "info"], env=env, cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    assert "1 decisions of pycudnn.torch, 1 to PyTorch's convolution" in info
    assert "removed 1 routing decisions" in cli("clear")
    store.forget()
    assert store.lookup(key("forward")) is None and "routing decisions" not in cli("show")
