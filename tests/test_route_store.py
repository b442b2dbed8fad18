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


def test_a_version_1_file_is_set_aside_unread(store):
    """Version 1's decisions came from a comparison that gave PyTorch one of pycudnn's timings:
    none of them is taken."""
    doc = {"format": "pycudnn-routes", "version": 1, "entries": [
        {"key": key(), "winner": "torch", "reason": "a biased duel", **FIGURES}]}
    os.makedirs(os.path.dirname(store.path()), mode=0o700, exist_ok=True)
    Path(store.path()).write_text(json.dumps(doc))
    os.chmod(store.path(), 0o600)
    with pytest.warns(Warning, match="corrupt|unusable|set aside|moved"):
        assert store.lookup(key()) is None
    assert not os.path.exists(store.path())


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


# ---- what a key holds ----------------------------------------------------------------------------

def test_the_key_holds_pycudnns_version_configuration_and_cudnn_enabled(store):
    import pycudnn
    from pycudnn.configuration import flags

    k = key()
    assert k["pycudnn"] == pycudnn.__version__ and k["cudnn_enabled"] is True
    assert k["config"] == {"engine": config.engine, "workspace_limit": None,
                           "benchmark_limit": config.benchmark_limit}
    store.store(k, "torch", FIGURES, "r")
    store.flush()
    store.forget()
    assert store.lookup(key())["winner"] == "torch"
    # a decision measured under another configuration, or with PyTorch's cuDNN off, is not it
    with flags(engine="v7"):
        assert store.lookup(key()) is None
    with flags(workspace_limit=1 << 20):
        assert store.lookup(key()) is None
    with flags(benchmark_limit=None):
        assert store.lookup(key()) is None
    off = route_store.decision_key(SIG, "forward", 0, True, False, "2.11.0+cu130", 91900,
                                   cudnn_enabled=False)
    assert store.lookup(off) is None
    other_version = dict(key(), pycudnn="0.0.1")
    assert store.lookup(other_version) is None


def test_a_key_without_the_newer_fields_is_kept_and_never_matched(store):
    old = {n: v for n, v in key().items() if n not in ("pycudnn", "config", "cudnn_enabled")}
    doc = {"format": "pycudnn-routes", "version": store.DOCUMENT[1], "entries": [
        {"key": old, "winner": "torch", "reason": "an older pycudnn's", **FIGURES}]}
    os.makedirs(os.path.dirname(store.path()), mode=0o700, exist_ok=True)
    Path(store.path()).write_text(json.dumps(doc))
    os.chmod(store.path(), 0o600)
    assert store.lookup(key()) is None
    store.store(key(), "pycudnn", FIGURES, "mine")
    store.flush()
    reasons = sorted(e["reason"] for e in json.loads(Path(store.path()).read_text())["entries"])
    assert reasons == ["an older pycudnn's", "mine"]


@pytest.mark.parametrize("bad", [{"engine": "cupy", "workspace_limit": None, "benchmark_limit": 10},
                                 {"engine": "graph", "workspace_limit": -1, "benchmark_limit": 10},
                                 {"engine": "graph", "workspace_limit": None},
                                 "graph"])
def test_a_key_with_a_bad_configuration_is_dropped(store, bad, caplog):
    store.store(dict(key(), config=bad), "torch", FIGURES, "r")
    store.flush()
    assert not os.path.exists(store.path())
    assert any("config" in r.getMessage() for r in caplog.records)


def test_a_channels_last_transposed_convolution_is_keyed_by_the_layout_it_runs_in(monkeypatch,
                                                                                 fresh_torch_calls):
    torch = pytest.importorskip("torch")
    from pycudnn.torch import calls, routing

    seen = []

    def prejudge(signature, direction, theirs, dev, stream, flags):
        seen.append(signature)
        return "torch"  # decided: neither side runs

    # the routing path of a transposed convolution's forward, on CPU tensors: only the checks
    # that need a GPU and PyTorch's call are stood in for
    monkeypatch.setattr(routing, "should_measure", lambda *a: True)
    monkeypatch.setattr(routing, "prejudge", prejudge)
    monkeypatch.setattr(calls, "caller_stream", lambda dev: 0)
    monkeypatch.setattr(calls, "check_transposed", lambda *a: (8, 16, 31, 31))
    monkeypatch.setattr(calls, "torch_backward",
                        lambda direction, a, b, other, geom: torch.zeros(other.shape))
    x = torch.randn(8, 32, 16, 16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(32, 16, 3, 3)
    geom = ((2, 2), (1, 1), (1, 1), 1)
    for xx in (x, x.contiguous()):
        shape_of, fmt, _, _, _ = calls.transposed_call("conv_transpose2d", xx, w, None, geom, (0, 0))
        calls.run_backward_data(xx.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt),
                                shape_of, fmt, geom)
    cl, contiguous = seen
    assert " channels_last " in cl and " contiguous " in contiguous


def test_a_forward_signature_names_its_bias():
    torch = pytest.importorskip("torch")
    from pycudnn.torch import calls

    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    geom = ((1, 1), (1, 1), (1, 1), 1)
    fmt = calls.memory_format(x, w)
    assert calls.describe_signature(x, w, geom, fmt, True) != calls.describe_signature(x, w, geom, fmt)


# ---- failures that must not lose decisions or fail a convolution ---------------------------------

def test_store_does_not_raise_when_no_thread_can_start(store, monkeypatch):
    import threading

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as m:
        m.setattr(threading.Timer, "start", no_thread)
        store.store(key("forward"), "torch", FIGURES, "r")  # must not raise
    assert store._timer is None  # no dead timer left in the way of the next decision
    assert store.lookup(key("forward"))["winner"] == "torch"  # kept, pending
    store.store(key("backward data"), "pycudnn", FIGURES, "r")  # threads again: a timer starts
    assert store._timer is not None
    store.flush()
    assert len(json.loads(Path(store.path()).read_text())["entries"]) == 2


def test_flush_keeps_the_file_when_its_read_fails(store, monkeypatch):
    for i in range(3):
        store.store(key(signature=f"other process layer {i}"), "torch", FIGURES, "theirs")
    store.flush()
    before = Path(store.path()).read_bytes()
    store.forget()
    real = route_store.read_database

    def unreadable(file):
        raise PermissionError(13, "Permission denied", file)

    monkeypatch.setattr(route_store, "read_database", unreadable)
    store.store(key(signature="this process layer"), "pycudnn", FIGURES, "mine")
    assert store.flush() is False
    assert Path(store.path()).read_bytes() == before  # not replaced by this process's decision
    monkeypatch.setattr(route_store, "read_database", real)
    assert store.flush() is True  # the decision was kept for the next write: merged now
    sigs = sorted(e["key"]["signature"] for e in json.loads(Path(store.path()).read_text())["entries"])
    assert sigs == [f"other process layer {i}" for i in range(3)] + ["this process layer"]


def test_lookup_does_not_set_aside_a_file_another_process_just_repaired(store, monkeypatch):
    from pycudnn.tuning import files as tuning_files

    good = route_store.document_text([route_store.checked_entry(
        {"key": key(), "winner": "torch", "reason": "other process", **FIGURES})[1]],
        document=route_store.DOCUMENT)
    os.makedirs(os.path.dirname(store.path()), mode=0o700, exist_ok=True)
    Path(store.path()).write_text('{"format": "pycudnn-routes", "version": 1, "entries": [')
    os.chmod(store.path(), 0o600)
    real = route_store.read_database
    calls = []

    def read_then_other_process_repairs(file):
        out = real(file)
        if not calls:  # the first, unlocked read got the corrupt bytes; then the repair lands
            tuning_files.write_database(file, good)
        calls.append(file)
        return out

    monkeypatch.setattr(route_store, "read_database", read_then_other_process_repairs)
    found = store.lookup(key())
    assert found is not None and found["reason"] == "other process"
    assert Path(store.path()).read_text() == good
    assert not [n for n in os.listdir(os.path.dirname(store.path())) if ".corrupt-" in n]


def test_lookup_still_sets_aside_a_file_that_is_corrupt_under_the_lock(store):
    os.makedirs(os.path.dirname(store.path()), mode=0o700, exist_ok=True)
    Path(store.path()).write_text("{not json")
    os.chmod(store.path(), 0o600)
    with pytest.warns(Warning) as caught:
        assert store.lookup(key()) is None
    (w,) = [w for w in caught if "unusable" in str(w.message)]
    text = str(w.message)
    assert text.startswith(f"pycudnn routing decisions file {store.path()} is unusable (not JSON")
    assert "carrying on with no stored decisions" in text and "tuning database" not in text
    assert any(".corrupt-" in n for n in os.listdir(os.path.dirname(store.path())))


EXIT_DURING_WRITE = r'''
import sys, time
from pycudnn.tuning import db as tuning_db, routes as route_store
tuning_db.device_identity = lambda d: %r
real = route_store.write_database
def slow_write(file, text):
    time.sleep(1.5)  # a slow disk: the program ends while the timer thread writes
    real(file, text)
route_store.write_database = slow_write
k = route_store.decision_key(%r, "forward", 0, True, False, "2.11.0+cu130", 91900)
route_store.store(k, "torch", %r, "measured")
time.sleep(route_store.WRITE_DELAY_S + 0.2)
'''


def test_the_exit_waits_for_a_write_under_way(store):
    code = EXIT_DURING_WRITE % (H200, SIG, FIGURES)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(Path(store.path()).read_text())["entries"]) == 1
    assert not [n for n in os.listdir(os.path.dirname(store.path())) if n.endswith(".tmp")]


def test_a_decision_stored_after_a_write_began_is_written_too(store, monkeypatch):
    import threading

    real = route_store.write_database
    started, release = threading.Event(), threading.Event()

    def held_write(file, text):
        started.set()
        release.wait(10)
        real(file, text)

    monkeypatch.setattr(route_store, "write_database", held_write)
    store.store(key("forward"), "torch", FIGURES, "first")
    writer = threading.Thread(target=store.flush)
    writer.start()
    assert started.wait(10)
    store.store(key("backward data"), "pycudnn", FIGURES, "during the write")
    store.store(key("forward"), "pycudnn", FIGURES, "newer")  # replaces the one being written
    release.set()
    writer.join(10)
    assert store.flush() is True
    found = {(e["key"]["direction"], e["reason"])
             for e in json.loads(Path(store.path()).read_text())["entries"]}
    assert found == {("forward", "newer"), ("backward data", "during the write")}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_the_store_is_locked_can_use_it(store):
    store.store(key("forward"), "torch", FIGURES, "parent's")
    with route_store._lock, route_store._write_lock:  # another thread inside the store at fork
        pid = os.fork()
        if pid == 0:  # the child: its calls must not wait for the parent's thread
            import signal

            signal.alarm(30)  # a deadlocked child ends, and the parent sees it fail
            code = 1
            try:
                route_store.store(key("backward data"), "pycudnn", FIGURES, "child's")
                ok = route_store.lookup(key("forward")) is not None and route_store.flush(timeout=10)
                code = 0 if ok else 2
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.forget()
    assert store.lookup(key("backward data"))["reason"] == "child's"


def test_routing_keys_a_decision_by_torch_backends_cudnn_enabled(store, monkeypatch):
    torch = pytest.importorskip("torch")
    from pycudnn.torch import routing

    monkeypatch.setattr(torch.backends.cudnn, "enabled", False)
    off = routing.stored_key(SIG, "forward", 0, (True, False))
    monkeypatch.setattr(torch.backends.cudnn, "enabled", True)
    on = routing.stored_key(SIG, "forward", 0, (True, False))
    assert off["cudnn_enabled"] is False and on["cudnn_enabled"] is True
    store.store(off, "torch", FIGURES, "PyTorch's native kernel")
    assert store.lookup(on) is None and store.lookup(off)["winner"] == "torch"
