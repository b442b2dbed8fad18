"""The persistent tuning database (CPU): keys, round trips, corruption, export/merge, processes.

The GPU identity is monkeypatched (``tuning_db.device_identity``), so nothing here needs a GPU;
records are stored against real :class:`~pycudnn.engines.problem.ConvolutionParams` objects.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

from pycudnn.search import iterate
from pycudnn.tuning import db as tuning_db
from pycudnn.tuning import files as tuning_files
from pycudnn.tuning import records as tuning_records
from pycudnn.search.cache import BenchmarkCache
from pycudnn.search.iterate import try_all
from pycudnn.engines.problem import ConvolutionArgs, ConvolutionParams
from pycudnn.configuration import config, flags
from pycudnn.errors import CudnnNotSupportedError, NoDeviceError, TuningDatabaseWarning
from scripted_engine import ScriptedEngine
from test_algos import make_params

REPO = Path(__file__).resolve().parents[1]

H200 = {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}
V7_RECORD = {"algo": 1, "math_type": 1, "workspace": 4096, "time_ms": 0.25, "deterministic": True}
GRAPH_RECORD = {"graph": 0, "engine_id": 41, "knobs": [[3, 1], [17, 0]], "workspace": 0,
                "time_ms": 0.0123, "tag": "eng41_k3=1_k17=0"}


@pytest.fixture
def identity(monkeypatch):
    """Every device is an H200 unless a test changes ``identity[device]``."""
    table: dict[int, dict] = {}
    monkeypatch.setattr(tuning_db, "device_identity", lambda device: table.get(device, H200))
    return table


@pytest.fixture
def db(tmp_path, monkeypatch, identity):
    """A fresh database directory, the database on, and no in-memory state left behind."""
    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYCUDNN_TUNING_DB", raising=False)
    config.reset()
    tuning_db.forget()
    yield tuning_db
    tuning_db.forget()
    config.reset()


def new_process():
    """What a later process sees: nothing in memory, the file on disk."""
    tuning_db.forget()


def grouped(g: int, **over) -> ConvolutionParams:
    """make_params with ``g`` groups (the weight's input channels follow)."""
    return make_params(groups=g, weight_shape=(8, 4 // g, 3, 3), **over)


def wide(i: int, **over) -> ConvolutionParams:
    """make_params with input width 8 + i (the output and the strides follow): distinct keys."""
    w = 8 + i
    return make_params(input_shape=(2, 4, 8, w), input_strides=(32 * w, 8 * w, w, 1),
                       output_shape=(2, 8, 8, w), output_strides=(64 * w, 8 * w, w, 1), **over)


def graph_params(**over) -> ConvolutionParams:
    """make_params for the graph engine (which a call always gives the pointers' alignments)."""
    return make_params(**{"engine": "graph", "alignments": (16, 16, 16), **over})


# ---- location and switches ------------------------------------------------------------------------

def test_location_order(monkeypatch, tmp_path):
    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning_db.path() == str(tmp_path / "a" / tuning_db.FILE_NAME)
    monkeypatch.delenv("PYCUDNN_CACHE_DIR")
    assert tuning_db.path() == str(tmp_path / "xdg" / "pycudnn" / tuning_db.FILE_NAME)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tuning_db.path() == str(tmp_path / "home" / ".cache" / "pycudnn" / tuning_db.FILE_NAME)


def test_enabled_follows_config_and_flags(db):
    assert db.enabled()
    with flags(tuning_db=False):
        assert not db.enabled()
        db.store(make_params(), V7_RECORD)  # a no-op while off
        assert db.lookup(make_params()) is None
    assert not os.path.exists(db.path())
    config.tuning_db = False
    assert not db.enabled()
    config.tuning_db = True
    assert db.enabled()


def test_env_zero_turns_it_off(tmp_path):
    code = (
        "import os, json\n"
        "from pycudnn import config\nfrom pycudnn.tuning import db as tuning_db\n"
        "tuning_db.device_identity = lambda d: {'name': 'X', 'compute_capability': [9, 0], 'sm_count': 1}\n"
        "import sys; sys.path.insert(0, 'tests')\n"
        "from test_algos import make_params\n"
        "tuning_db.store(make_params(), {'algo': 1})\n"
        "print(json.dumps([config.tuning_db, tuning_db.enabled(), tuning_db.enabled() is False,\n"
        "                  tuning_db.lookup(make_params()), os.path.exists(tuning_db.path())]))\n")
    env = dict(os.environ, PYCUDNN_TUNING_DB="0", PYCUDNN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [False, False, True, None, False]


# ---- round trip -----------------------------------------------------------------------------------

def test_store_lookup_drop_round_trip(db):
    p = make_params()
    assert db.lookup(p) is None
    db.store(p, V7_RECORD)
    assert db.lookup(p) == V7_RECORD
    new_process()
    assert db.lookup(p) == V7_RECORD  # read back from the file
    db.drop(p)
    assert db.lookup(p) is None
    new_process()
    assert db.lookup(p) is None and db.entries() == []


def test_graph_record_kept_verbatim_with_metadata(db):
    import pycudnn

    p = make_params(engine="graph", dtype="bfloat16", alignments=(16, 16, 16, 16, 16),
                    epilogue="add_relu", z_strides=(512, 1, 64, 8), alpha=0.5)
    db.store(p, GRAPH_RECORD)
    new_process()
    assert db.lookup(p) == GRAPH_RECORD
    [entry] = db.entries()
    assert entry["record"] == GRAPH_RECORD
    assert entry["gpu"] == H200 and entry["engine"] == "graph"
    assert entry["cudnn_version"] == p.cudnn_version and entry["schema"] == tuning_records.SCHEMA_VERSION
    assert entry["pycudnn"] == pycudnn.__version__ and entry["created"]
    # every field of the parameters, tuples as lists
    assert set(entry["params"]) == {f.name for f in dataclasses.fields(ConvolutionParams)}
    assert entry["params"]["z_strides"] == [512, 1, 64, 8]
    assert entry["params"]["alignments"] == [16, 16, 16, 16, 16]
    assert entry["params"]["workspace_limit"] is None


def test_lookup_returns_a_copy(db):
    p = make_params()
    db.store(p, V7_RECORD)
    got = db.lookup(p)
    got["algo"] = 99
    assert db.lookup(p) == V7_RECORD


def test_store_replaces(db):
    p = make_params()
    db.store(p, V7_RECORD)
    db.store(p, dict(V7_RECORD, algo=6))
    assert db.lookup(p)["algo"] == 6 and len(db.entries()) == 1
    new_process()  # the file holds the new line, not the one written first
    assert db.lookup(p)["algo"] == 6 and len(db.entries()) == 1


def test_file_is_plain_json_one_entry_a_line(db):
    for g in (1, 2, 4):
        db.store(grouped(g), V7_RECORD)
    text = Path(db.path()).read_text()
    doc = json.loads(text)
    assert doc["format"] == "pycudnn-tuning-db" and doc["version"] == 1 and len(doc["entries"]) == 3
    assert len(text.splitlines()) == 2 + 3
    assert not glob.glob(db.path() + ".*.tmp") and not glob.glob(os.path.dirname(db.path()) + "/.*tmp")


def test_non_json_record_is_not_stored_and_does_not_raise(db):
    db.store(make_params(), {"algo": object()})
    assert db.lookup(make_params()) is None


@pytest.mark.parametrize("time_ms", [float("nan"), float("inf"), -1.0])
def test_unmeasured_or_non_finite_time_is_left_out(db, time_ms):
    db.store(make_params(), dict(V7_RECORD, time_ms=time_ms))
    assert db.lookup(make_params()) == {k: v for k, v in V7_RECORD.items() if k != "time_ms"}
    json.loads(Path(db.path()).read_text())  # strict JSON: no NaN


# ---- keys -----------------------------------------------------------------------------------------

#: one changed value for every field but ``device`` (a test below keeps this list complete)
CHANGES = {
    "direction": "backward_data", "cudnn_version": 92800, "dtype": "float16",
    "input_shape": (2, 4, 8, 9), "input_strides": (256, 1, 32, 4), "weight_shape": (8, 4, 1, 1),
    "weight_format": "NHWC", "output_shape": (2, 8, 8, 7), "output_strides": (512, 1, 64, 8),
    "padding": (0, 1), "stride": (2, 1), "dilation": (1, 2), "groups": 2, "deterministic": True,
    "allow_tf32": False, "workspace_limit": 1 << 20, "engine": "graph", "epilogue": "add_relu",
    "z_strides": (512, 64, 8, 1), "alpha": 0.5, "alignments": (16, 8, 16), "benchmark_limit": 4,
}


def test_changes_cover_every_field():
    names = {f.name for f in dataclasses.fields(ConvolutionParams)}
    assert set(CHANGES) == names - {"device"}, "a new ConvolutionParams field needs a key test"


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_any_param_field_separates(db, field):
    a = make_params()
    b = dataclasses.replace(a, **{field: CHANGES[field]})
    db.store(a, V7_RECORD)
    new_process()
    assert db.lookup(b) is None
    assert db.lookup(a) == V7_RECORD


@pytest.mark.parametrize("change", [
    {"name": "NVIDIA H100 80GB HBM3"}, {"compute_capability": [8, 0]}, {"sm_count": 114},
])
def test_gpu_identity_separates(db, identity, change):
    p = make_params()
    db.store(p, V7_RECORD)
    new_process()
    identity[0] = dict(H200, **change)
    assert db.lookup(p) is None


def test_device_ordinal_of_an_identical_gpu_shares_records(db, identity):
    db.store(make_params(device=0), V7_RECORD)
    new_process()
    assert db.lookup(make_params(device=1)) == V7_RECORD  # same model under another ordinal
    identity[2] = dict(H200, name="NVIDIA L40S", compute_capability=[8, 9], sm_count=142)
    assert db.lookup(make_params(device=2)) is None


def test_schema_version_separates(db, monkeypatch):
    db.store(make_params(), V7_RECORD)
    new_process()
    monkeypatch.setattr(tuning_records, "SCHEMA_VERSION", tuning_records.SCHEMA_VERSION + 1)
    assert db.lookup(make_params()) is None
    db.store(make_params(), dict(V7_RECORD, algo=2))  # both schemas live side by side
    assert len(db.entries()) == 2


def test_lookup_never_raises(db, monkeypatch):
    def no_gpu(device):
        raise NoDeviceError("no usable CUDA device")

    db.store(make_params(), V7_RECORD)
    monkeypatch.setattr(tuning_db, "device_identity", no_gpu)
    assert db.lookup(make_params()) is None
    db.store(make_params(), V7_RECORD)  # logged, not raised


# ---- cost and freshness ---------------------------------------------------------------------------

def test_file_read_once_and_refreshed_once_per_missing_key(db, monkeypatch):
    p, q = make_params(), make_params(groups=2)
    db.store(p, V7_RECORD)
    new_process()
    reads, stats = [], []  # opens and stats of the database file itself (not its directory or lock)
    real_open, real_stat = os.open, os.stat

    def counting_open(name, *args, **kwargs):
        if isinstance(name, str) and os.path.basename(name) == tuning_db.FILE_NAME:
            reads.append(name)
        return real_open(name, *args, **kwargs)

    def counting_stat(name, *args, **kwargs):
        if isinstance(name, str) and os.path.basename(name) == tuning_db.FILE_NAME:
            stats.append(name)
        return real_stat(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "stat", counting_stat)
    for _ in range(100):
        assert db.lookup(p) == V7_RECORD
    assert len(reads) == 1 and stats == []
    for _ in range(100):
        assert db.lookup(q) is None
    assert len(reads) == 1 and len(stats) == 1  # one stat for the new key; unchanged: no read


def test_miss_sees_a_record_another_process_stored(db, tmp_path):
    p, q = make_params(), grouped(2)
    assert db.lookup(p) is None  # this process has read the (empty) file
    _store_grouped_in_another_process()
    assert db.lookup(q) == OTHER_PROCESS_RECORD


#: what `_store_grouped_in_another_process` stores for ``grouped(2)``
OTHER_PROCESS_RECORD = {"algo": 7, "math_type": 0, "workspace": 0}


def _store_grouped_in_another_process() -> None:
    """A second Python process stores `OTHER_PROCESS_RECORD` for ``grouped(2)`` in the same
    database (``PYCUDNN_CACHE_DIR`` is inherited)."""
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from pycudnn.tuning import db as tuning_db\n"
        f"tuning_db.device_identity = lambda d: {H200!r}\n"
        "from test_algos import make_params\n"
        "tuning_db.store(make_params(groups=2, weight_shape=(8, 2, 3, 3)),\n"
        f"                {OTHER_PROCESS_RECORD!r})\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_stores_read_the_file_only_when_another_process_changed_it(db, monkeypatch):
    """A store holding the lock re-reads and re-checks the file only when its signature is not
    the one this process last read or wrote (every store used to parse every entry: 80 ms a store
    at 500 entries); another process's write in between is still merged."""
    parses = []
    real = tuning_db.parse_document
    monkeypatch.setattr(tuning_db, "parse_document", lambda *a, **k: parses.append(1) or real(*a, **k))
    for i in range(20):
        db.store(wide(i), V7_RECORD)
    assert len(parses) == 0  # no file at first, then only files this process wrote
    _store_grouped_in_another_process()
    db.store(wide(20), V7_RECORD)
    assert len(parses) == 1  # the other process's file, read once under the lock
    db.store(wide(21), V7_RECORD)
    assert len(parses) == 1
    new_process()
    assert all(db.lookup(wide(i)) == V7_RECORD for i in range(22))
    assert db.lookup(grouped(2)) == OTHER_PROCESS_RECORD
    doc = json.loads(Path(db.path()).read_text())
    assert len(doc["entries"]) == 23


def test_a_store_after_an_unreadable_file_does_not_overwrite_it(db, monkeypatch):
    """Where the file could not be read, this process's empty copy is not taken for the file's
    content: a store reads it again under the lock, and fails rather than replace it."""
    db.store(wide(0), V7_RECORD)
    new_process()
    real = tuning_files.read_database

    def unreadable(file):
        raise PermissionError(13, "Permission denied", file)
    monkeypatch.setattr(tuning_db, "read_database", unreadable)
    assert db.lookup(wide(1)) is None  # unreadable: carried on without it
    db.store(wide(1), V7_RECORD)  # cannot read it under the lock either: nothing written
    monkeypatch.setattr(tuning_db, "read_database", real)
    new_process()
    assert db.lookup(wide(0)) == V7_RECORD


# ---- corruption ---------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [
    b"this is not json", b"", b'{"format": "pycudnn-tuning-db", "version": 1, "entries": [{"sch',
    b"\xff\xfe garbage", b"[1, 2, 3]", b'{"format": "other", "version": 1, "entries": []}',
    b"null", b'"text"', b'{"format": "pycudnn-tuning-db", "version": 1, "entries": {}}',
    b'{"format": "pycudnn-tuning-db", "version": "1", "entries": []}',
    b'{"format": "pycudnn-tuning-db", "version": 1, "entries": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
    b'{"format": "pycudnn-tuning-db", "version": 1, "entries": [' + b"7" * 5000 + b"]}",
], ids=lambda c: repr(c[:30]))
def test_corrupt_file_is_set_aside_and_the_program_carries_on(db, content):
    os.makedirs(os.path.dirname(db.path()), exist_ok=True)
    Path(db.path()).write_bytes(content)
    with pytest.warns(TuningDatabaseWarning, match="moved it aside"):
        assert db.lookup(make_params()) is None
    aside = glob.glob(db.path() + ".corrupt-*")
    assert len(aside) == 1 and Path(aside[0]).read_bytes() == content
    assert not os.path.exists(db.path())
    db.store(make_params(), V7_RECORD)  # a fresh database
    new_process()
    assert db.lookup(make_params()) == V7_RECORD


def test_truncated_file_is_set_aside_when_storing(db):
    for g in (1, 2):
        db.store(grouped(g), V7_RECORD)
    data = Path(db.path()).read_bytes()
    Path(db.path()).write_bytes(data[: len(data) // 2])
    new_process()
    with pytest.warns(TuningDatabaseWarning):
        db.store(grouped(4), V7_RECORD)
    assert len(glob.glob(db.path() + ".corrupt-*")) == 1
    assert [e["params"]["groups"] for e in db.entries()] == [4]


def test_unusable_entries_are_skipped(db):
    db.store(make_params(), V7_RECORD)
    doc = json.loads(Path(db.path()).read_text())
    doc["entries"] += [{"schema": 1}, "junk", {**doc["entries"][0], "params": 5}]
    Path(db.path()).write_text(json.dumps(doc))
    new_process()
    assert db.lookup(make_params()) == V7_RECORD
    assert not glob.glob(db.path() + ".corrupt-*")


def test_unwritable_location_is_logged_never_raised(db, monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("PYCUDNN_CACHE_DIR", str(blocker / "sub"))
    assert db.lookup(make_params()) is None
    with caplog.at_level("WARNING", logger="pycudnn"):
        db.store(make_params(), V7_RECORD)
        db.drop(make_params())
    assert "could not store a record in" in caplog.text and str(blocker / "sub") in caplog.text
    assert db.entries() == [] and blocker.read_text() == "x"


# ---- export, merge, clear ---------------------------------------------------------------------------

def test_export_clear_merge(db, tmp_path):
    params = [grouped(g) for g in (1, 2, 4)]
    for p in params:
        db.store(p, V7_RECORD)
    out = tmp_path / "shipped.json"
    assert db.export(out) == 3
    assert json.loads(out.read_text())["format"] == "pycudnn-tuning-db"
    assert db.clear() == 3
    assert db.entries() == [] and all(db.lookup(p) is None for p in params)
    assert db.merge(out) == 3
    assert all(db.lookup(p) == V7_RECORD for p in params)
    assert db.merge(out) == 0  # nothing new


def test_merge_keeps_local_records_whatever_time_an_import_claims(db, tmp_path):
    p, q = make_params(), grouped(2)
    db.store(p, dict(V7_RECORD, time_ms=0.0, algo=2))  # "0 ms": a made-up time
    db.store(q, dict(V7_RECORD, algo=4))
    db.export(tmp_path / "imported.json")
    db.clear()
    db.store(p, dict(V7_RECORD, time_ms=0.3, algo=3))  # measured here
    report = db.import_file(tmp_path / "imported.json")
    assert report == db.MergeReport(added=1, replaced=0, kept=1, refused=0)
    assert db.lookup(p)["algo"] == 3 and db.lookup(q)["algo"] == 4
    assert db.merge(tmp_path / "imported.json") == 0  # nothing new
    # asked for explicitly, imported records replace local ones
    assert db.merge(tmp_path / "imported.json", prefer="imported") == 1
    assert db.lookup(p)["algo"] == 2
    with pytest.raises(ValueError, match="prefer"):
        db.merge(tmp_path / "imported.json", prefer="faster")


def test_merge_refuses_what_is_not_a_database(db, tmp_path):
    db.store(make_params(), V7_RECORD)
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="not a pycudnn tuning database"):
        db.merge(bad)
    assert bad.read_text() == "{nope"  # an import file is never moved aside
    with pytest.raises(FileNotFoundError):
        db.merge(tmp_path / "missing.json")
    assert len(db.entries()) == 1


# ---- many writers ---------------------------------------------------------------------------------

WRITER = r"""
import sys, json
sys.path.insert(0, "tests")
from pycudnn.tuning import db as tuning_db
tuning_db.device_identity = lambda d: {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}
from scripted_engine import ScriptedEngine
from test_algos import make_params
start, count, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
from test_tuning_db import wide
for i in range(start, start + count):
    tuning_db.store(wide(i), {"algo": 1, "math_type": 0, "workspace": i, "time_ms": 0.1})
print("done", tag)
"""


def test_four_processes_writing_overlapping_records(db):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(i * 15), "30", f"p{i}"], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    for out, err, rc in results:
        assert rc == 0 and out.startswith("done"), err
        assert "Warning" not in err, err
    doc = json.loads(Path(db.path()).read_text())  # not corrupt
    new_process()
    widths = sorted(e["params"]["input_shape"][3] - 8 for e in db.entries())
    assert widths == list(range(0, 75)), "a record was lost"
    for i in range(75):
        rec = db.lookup(wide(i))
        assert rec is not None and rec["workspace"] == i
    assert len(doc["entries"]) == 75
    assert not glob.glob(os.path.dirname(db.path()) + "/.*.tmp")


def test_threads_writing_at_once(db):
    errors = []

    def work(t):
        try:
            for i in range(10):
                db.store(wide(t * 10 + i), dict(V7_RECORD, workspace=t))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    new_process()
    assert len(db.entries()) == 60


# ---- with the search ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Rec:
    name: str
    workspace: int = 0
    source: str = "measured"

    def describe(self) -> str:
        return f"rec {self.name}"


class Persisting(ScriptedEngine):
    """A scripted engine with the tuning-database contract (serialize / restore)."""

    name = "scripted"

    def __init__(self, broken_restore: bool = False) -> None:
        self.searches = 0
        self.ran: list[str] = []
        self.restored: list[dict] = []
        self.broken_restore = broken_restore

    def candidates(self, args):
        self.searches += 1
        return [Rec("slow-fails"), Rec("best")] if args.benchmark else [Rec("heuristic")]

    def default_candidates(self, args):
        return [Rec("default")]

    def run(self, args, record):
        self.ran.append(record.name)
        if record.name == "slow-fails":
            raise CudnnNotSupportedError(9000, "cudnnBackendExecute", "CUDNN_STATUS_NOT_SUPPORTED", "", [])

    def serialize(self, record):  # the graph engine's fields (the name as the tag)
        return {"graph": 0, "engine_id": 3, "knobs": [], "workspace": 0, "tag": record.name}

    def restore(self, args, data):
        self.restored.append(data)
        if self.broken_restore:
            raise ValueError("engine gone")
        return Rec(data["tag"], source="tuning-db")


def stored(name: str) -> dict:
    return Persisting().serialize(Rec(name))


def _args(p: ConvolutionParams, benchmark: bool = True) -> ConvolutionArgs:
    return ConvolutionArgs(params=p, handle=0, stream=0, x=0, w=0, y=0, benchmark=benchmark)


def test_a_later_process_skips_the_search(db):
    p = graph_params()
    first = Persisting()
    assert try_all(_args(p), first, BenchmarkCache("forward")).name == "best"
    assert first.searches == 1
    assert db.lookup(p) == stored("best")
    new_process()
    later, cache = Persisting(), BenchmarkCache("forward")
    got = try_all(_args(p), later, cache)
    assert got.name == "best" and got.source == "tuning-db"
    assert later.searches == 0 and cache.searches == 0 and later.ran == ["best"]
    assert try_all(_args(p), later, cache) is got  # in memory from now on


def test_heuristic_choices_are_not_stored(db):
    p = make_params()
    try_all(_args(p, benchmark=False), Persisting(), BenchmarkCache("forward"))
    assert db.entries() == []


def test_a_record_that_no_longer_rebuilds_is_dropped_and_searched_again(db, caplog):
    p = graph_params()
    db.store(p, stored("gone"))
    new_process()
    s = Persisting(broken_restore=True)
    with caplog.at_level("WARNING", logger="pycudnn"):
        assert try_all(_args(p), s, BenchmarkCache("forward")).name == "best"
    assert s.searches == 1 and "dropping the record" in caplog.text
    assert db.lookup(p) == stored("best")  # the new search's choice replaced it


def test_no_warnings_on_the_happy_path(db):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        db.store(make_params(), V7_RECORD)
        new_process()
        assert db.lookup(make_params()) == V7_RECORD


# ---- preload's reading of entries (the GPU part is in test_tuning_db_gpu.py) ------------------------

#: for every field but ``device``, a change a call can make (with the fields that follow from it)
ROUND_TRIP = {
    "direction": {"direction": "backward_data"}, "cudnn_version": {"cudnn_version": 92800},
    "dtype": {"dtype": "float16"},
    "input_shape": {"input_shape": (2, 4, 8, 9), "input_strides": (288, 72, 9, 1),
                    "output_shape": (2, 8, 8, 9), "output_strides": (576, 72, 9, 1)},
    "input_strides": {"input_strides": (256, 1, 32, 4)},
    "weight_shape": {"weight_shape": (8, 4, 1, 1), "padding": (0, 0)},
    "weight_format": {"weight_format": "NHWC"},
    "output_shape": {"output_shape": (2, 8, 4, 4), "output_strides": (128, 16, 4, 1),
                     "stride": (2, 2)},
    "output_strides": {"output_strides": (512, 1, 64, 8)},
    "padding": {"padding": (0, 1), "output_shape": (2, 8, 6, 8)}, "stride": {"stride": (1, 1)},
    "dilation": {"dilation": (2, 2), "padding": (2, 2)},
    "groups": {"groups": 2, "weight_shape": (8, 2, 3, 3)}, "deterministic": {"deterministic": True},
    "allow_tf32": {"allow_tf32": False}, "workspace_limit": {"workspace_limit": 1 << 20},
    "engine": {"engine": "graph", "alignments": (16, 16, 16)},
    "epilogue": {"epilogue": "bias_relu", "engine": "graph", "alignments": (16, 16, 16, 16)},
    "z_strides": {"epilogue": "add_relu", "z_strides": (512, 64, 8, 1)},
    "alpha": {"epilogue": "add_relu", "z_strides": (512, 64, 8, 1), "alpha": 0.5},
    "alignments": {"engine": "graph", "alignments": (16, 8, 4)},
    "benchmark_limit": {"engine": "graph", "alignments": (16, 16, 16), "benchmark_limit": 4},
}


def test_round_trip_covers_every_field():
    names = {f.name for f in dataclasses.fields(ConvolutionParams)}
    assert set(ROUND_TRIP) == names - {"device"}, "a new ConvolutionParams field needs a rule"


@pytest.mark.parametrize("field", [None] + sorted(ROUND_TRIP))
def test_params_from_dict_inverts_params_to_dict(field):
    from pycudnn.search.preload import params_from_dict

    p = make_params(**ROUND_TRIP[field]) if field else make_params()
    data = json.loads(json.dumps(tuning_records.params_to_dict(p)))  # as read back from the file
    q = params_from_dict(data, p.device)
    assert q == p and hash(q) == hash(p)  # the same benchmark-cache key as the call's
    assert params_from_dict(data, 3) == dataclasses.replace(p, device=3)
    assert tuning_records.params_from_dict(data, 0) == p


#: values a call never gives, one field at a time (on make_params(); "graph:" on graph_params())
REFUSED_PARAMS = [
    ("pop dtype", "missing field 'dtype'"), ("future_field", "unknown field"),
    ("padding", ["1", 1], "padding must hold integers"),
    ("dtype", "double", "params.dtype"), ("dtype", "float", "params.dtype"),
    ("dtype", "FLOAT32", "params.dtype"), ("dtype", "half", "params.dtype"),
    ("dtype", "int8", "params.dtype"), ("dtype", 4, "params.dtype"),
    ("direction", "sideways", "params.direction"), ("engine", "scripted", "params.engine"),
    ("epilogue", "gelu", "params.epilogue"), ("weight_format", "nchw", "params.weight_format"),
    ("input_shape", [2, 4, 8], "4 or 5 sizes"), ("input_shape", [2, 4, 8, True], "integers"),
    ("input_shape", [2, 4, 8, 8.0], "integers"), ("input_shape", [-2, 4, 8, 8], "in \\[0"),
    ("input_shape", [2, 4, 8, 2**40], "in \\[0"), ("input_strides", [256, 64, 8], "4 values"),
    ("output_strides", [512, 64, 8, -1], "in \\[0"), ("weight_shape", [8, 4, 0, 3], "in \\[1"),
    ("padding", [1], "2 values"), ("padding", [1, -1], "in \\[0"), ("stride", [1, 0], "in \\[1"),
    ("dilation", [1, 1, 1], "2 values"), ("groups", 0, "in \\[1"), ("groups", True, "integer"),
    ("groups", 2, "do not fit"), ("output_shape", [2, 8, 8, 9], "is not the output"),
    ("output_shape", [3, 8, 8, 8], "is not the output"), ("deterministic", 1, "true or false"),
    ("workspace_limit", -1, "in \\[0"), ("workspace_limit", 1.5, "integer"),
    ("cudnn_version", "9.2", "integer"), ("z_strides", [512, 64, 8, 1], "exactly when"),
    ("alpha", 0.5, "only with the 'add_relu'"), ("alpha", "1", "a number"),
    ("alignments", [16, 16, 16], "0 values"), ("benchmark_limit", 4, "v7 engine takes none"),
    ("epilogue", "bias", "not fused by the v7 engine"), ("device", -1, "params.device"),
    ("graph:alignments", [16, 16], "3 values"), ("graph:alignments", [16, 16, 3], "powers of two"),
    ("graph:epilogue", "add_relu", "exactly when"),
    ("graph:direction", "backward_data", "forward direction only", {"epilogue": "bias",
                                                                    "alignments": [16] * 4}),
    ("graph:benchmark_limit", -1, "in \\[0"),
    ("dtype", "float64", "NCHW only", {"weight_format": "NHWC"}),
]


@pytest.mark.parametrize("case", REFUSED_PARAMS, ids=lambda c: f"{c[0]}={c[1]!r}"[:50])
def test_params_from_dict_refuses_what_no_call_writes(case):
    from pycudnn.search.preload import params_from_dict

    field, *rest = case
    graph = field.startswith("graph:")
    field = field.removeprefix("graph:")
    data = tuning_records.params_to_dict(graph_params() if graph else make_params())
    if field.startswith("pop "):
        data.pop(field[4:])
    elif len(rest) == 1:
        data[field] = 1
    else:
        data[field] = rest[0]
        if len(rest) == 3:
            data.update(rest[2])
    error = rest[-1] if len(rest) < 3 else rest[1]
    with pytest.raises((TypeError, ValueError), match=error):
        params_from_dict(data, 0)


def test_preload_without_a_gpu_names_the_reason():
    import pycudnn
    from conftest import has_gpu

    if has_gpu():
        pytest.skip("checks the refusal on a machine without a GPU")
    with pytest.raises(NoDeviceError, match="pycudnn.preload: no (usable CUDA device|NVIDIA driver found)"):
        pycudnn.preload()


@pytest.mark.parametrize("kwargs, error", [
    ({"max_bytes": -1}, "max_bytes: expected an int >= 0 or None, got -1"),
    ({"max_bytes": 1.5}, "max_bytes: expected an int"),
    ({"launch": "yes"}, "launch: expected a bool, got str"),
])
def test_preload_checks_its_arguments_first(kwargs, error):
    import pycudnn

    with pytest.raises((TypeError, ValueError), match=error):
        pycudnn.preload(**kwargs)


# ---- untrusted files: any content, any file type, any owner --------------------------------------

DEEP = ('{"format": "pycudnn-tuning-db", "version": 1, "entries": [' + "[" * 100_000
        + "]" * 100_000 + "]}")


def plant(db, content: str | bytes) -> Path:
    """Put ``content`` at the database path (the directory as pycudnn makes it)."""
    os.makedirs(os.path.dirname(db.path()), mode=0o700, exist_ok=True)
    f = Path(db.path())
    f.write_bytes(content.encode() if isinstance(content, str) else content)
    return f


def shipped_file(db, tmp_path, *params: ConvolutionParams) -> Path:
    """An exported database holding V7_RECORD for ``params`` (this database is left empty)."""
    for p in params:
        db.store(p, V7_RECORD)
    out = tmp_path / "shipped.json"
    db.export(out)
    db.clear()
    os.unlink(db.path())
    new_process()
    return out


class Serializing(ScriptedEngine):
    name = "v7"

    def serialize(self, record):
        return dict(V7_RECORD)


@pytest.mark.parametrize("call", ["lookup", "entries", "clear", "store", "drop", "merge",
                                  "end of a measured search"])
def test_a_deeply_nested_file_is_set_aside_by_every_function(db, tmp_path, call):
    p = make_params()
    good = shipped_file(db, tmp_path, grouped(2))
    plant(db, DEEP)
    run = {
        "lookup": lambda: db.lookup(p), "entries": db.entries, "clear": db.clear,
        "store": lambda: db.store(p, V7_RECORD), "drop": lambda: db.drop(p),
        "merge": lambda: db.merge(good),
        "end of a measured search": lambda: iterate.to_tuning_db(
            ConvolutionArgs(params=p, handle=0, stream=0, x=0, w=0, y=0, benchmark=True),
            Serializing(), object()),
    }[call]
    with pytest.warns(TuningDatabaseWarning, match="(RecursionError|nested more than 32 deep).*moved it aside"):
        run()  # no RecursionError
    [aside] = glob.glob(db.path() + ".corrupt-*")
    assert Path(aside).read_text() == DEEP
    db.store(p, V7_RECORD)  # a fresh database from here on
    new_process()
    assert db.lookup(p) == V7_RECORD
    assert db.lookup(grouped(2)) == (V7_RECORD if call == "merge" else None)


def test_an_import_file_nested_too_deep_is_refused_and_left_alone(db, tmp_path):
    bad = tmp_path / "deep.json"
    bad.write_text(DEEP)
    with pytest.raises(ValueError, match="not a pycudnn tuning database.*(RecursionError|nested more than 32 deep)"):
        db.merge(bad)
    assert bad.read_text() == DEEP


def test_an_oversized_file_is_set_aside_unread(db, monkeypatch):
    db.store(make_params(), V7_RECORD)
    size = os.path.getsize(db.path())
    new_process()
    monkeypatch.setattr(tuning_files, "MAX_FILE_BYTES", size - 1)
    with pytest.warns(TuningDatabaseWarning, match=f"{size} bytes, more than"):
        assert db.lookup(make_params()) is None
    assert len(glob.glob(db.path() + ".corrupt-*")) == 1


def _in_thread(fn, timeout=10.0, unblock=None):
    """(finished, result, warnings) of ``fn()`` run in a thread for at most ``timeout`` s;
    ``unblock()`` then lets a blocked thread go (it may hold the module's lock)."""
    out: dict = {}

    def work():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["result"] = fn()
        out["warnings"] = [str(w.message) for w in caught]

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout)
    finished = not t.is_alive()
    if not finished and unblock is not None:
        unblock()
        t.join(timeout)
    return finished, out.get("result"), out.get("warnings", [])


@pytest.mark.parametrize("call", ["lookup", "entries", "store", "clear"])
def test_a_fifo_at_the_path_never_blocks(db, call):
    p = make_params()
    os.makedirs(os.path.dirname(db.path()), mode=0o700)
    os.mkfifo(db.path())
    run = {"lookup": lambda: db.lookup(p), "entries": db.entries,
           "store": lambda: db.store(p, V7_RECORD), "clear": db.clear}[call]
    def unblock():  # a regular file at the path, then the blocked reader let go
        alias = db.path() + ".fifo"
        os.link(db.path(), alias)
        Path(db.path() + ".new").write_text('{"format": "pycudnn-tuning-db", "version": 1, "entries": []}')
        os.replace(db.path() + ".new", db.path())
        os.close(os.open(alias, os.O_WRONLY | os.O_NONBLOCK))

    finished, _, caught = _in_thread(run, unblock=unblock)
    assert finished, f"{call} blocked on a FIFO at the database path"
    assert any("not a regular file" in w and "moved it aside" in w for w in caught), caught
    [aside] = glob.glob(db.path() + ".corrupt-*")
    assert stat.S_ISFIFO(os.lstat(aside).st_mode)
    db.store(p, V7_RECORD)
    new_process()
    assert db.lookup(p) == V7_RECORD and stat.S_ISREG(os.lstat(db.path()).st_mode)


@pytest.mark.parametrize("target", ["a database elsewhere", "/dev/null"])
def test_a_symlink_at_the_path_is_never_followed(db, tmp_path, target):
    p = make_params()
    elsewhere = shipped_file(db, tmp_path, p)
    link_to = str(elsewhere) if target == "a database elsewhere" else target
    before = elsewhere.read_bytes()
    os.makedirs(os.path.dirname(db.path()), mode=0o700, exist_ok=True)
    os.symlink(link_to, db.path())
    finished, found, caught = _in_thread(lambda: db.lookup(p))
    assert finished and found is None  # the record behind the link was not read
    assert any("symbolic link" in w for w in caught), caught
    [aside] = glob.glob(db.path() + ".corrupt-*")
    assert os.readlink(aside) == link_to
    db.store(grouped(2), V7_RECORD)
    assert not os.path.islink(db.path()) and elsewhere.read_bytes() == before


def test_directory_is_created_0700_and_files_0600(db):
    db.store(make_params(), V7_RECORD)
    mode = lambda f: stat.S_IMODE(os.lstat(f).st_mode)  # noqa: E731
    assert mode(os.path.dirname(db.path())) == 0o700
    assert mode(db.path()) == 0o600 and mode(db.path() + ".lock") == 0o600


def test_a_file_an_earlier_version_wrote_0644_is_read_and_rewritten_0600(db):
    db.store(make_params(), V7_RECORD)
    os.chmod(db.path(), 0o644)
    new_process()
    assert db.lookup(make_params()) == V7_RECORD
    db.store(grouped(2), V7_RECORD)
    assert stat.S_IMODE(os.stat(db.path()).st_mode) == 0o600


def _chown_or_skip(f: str) -> None:
    try:
        os.chown(f, 4242, 4242, follow_symlinks=False)
    except PermissionError:
        pytest.skip("needs root to give a file to another user")


UNSAFE = {
    "directory writable by others": (lambda f: os.chmod(os.path.dirname(f), 0o777),
                                     "writable by group or others"),
    "sticky directory writable by all": (lambda f: os.chmod(os.path.dirname(f), 0o1777),
                                         "writable by group or others"),
    "directory writable by its group": (lambda f: os.chmod(os.path.dirname(f), 0o770),
                                        "writable by group or others"),
    "file writable by others": (lambda f: os.chmod(f, 0o666), "writable by group or others"),
    "file of another user": (_chown_or_skip, "belongs to uid 4242"),
    "directory of another user": (lambda f: _chown_or_skip(os.path.dirname(f)),
                                  "belongs to uid 4242"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_an_unsafe_directory_or_file_turns_the_database_off_with_one_warning(db, case):
    p = make_params()
    db.store(p, V7_RECORD)
    before = Path(db.path()).read_bytes()
    new_process()
    make_unsafe, why = UNSAFE[case]
    make_unsafe(db.path())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert db.lookup(p) is None  # the record is not believed
        assert db.lookup(p) is None
        db.store(grouped(2), V7_RECORD)
        db.drop(p)
        assert db.entries() == []
    msgs = [str(w.message) for w in caught if issubclass(w.category, TuningDatabaseWarning)]
    assert len(msgs) == 1 and "refused" in msgs[0] and why in msgs[0], msgs
    assert db.path() in msgs[0]
    assert why in db.refused()
    with pytest.raises(PermissionError, match="refused"):
        db.clear()
    assert Path(db.path()).read_bytes() == before  # nothing written, nothing moved
    assert not glob.glob(db.path() + ".corrupt-*")


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_an_odd_lock_file_turns_writing_off_without_blocking(db, tmp_path, kind):
    db.store(make_params(), V7_RECORD)
    lock = db.path() + ".lock"
    os.unlink(lock)
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        os.symlink(tmp_path / "elsewhere", lock)
    finished, _, caught = _in_thread(lambda: db.store(grouped(2), V7_RECORD))
    assert finished and any("lock file" in w and "refused" in w for w in caught), caught
    assert not (tmp_path / "elsewhere").exists()
    assert db.refused() is not None


# ---- entries that do not validate ----------------------------------------------------------------

def _rewrite_first_entry(db, change) -> None:
    doc = json.loads(Path(db.path()).read_text())
    change(doc["entries"][0])
    Path(db.path()).write_text(json.dumps(doc))


def _set(path: str, value):
    def change(entry):
        *parents, last = path.split(".")
        for k in parents:
            entry = entry[k]
        entry[last] = value
    return change


def _pop(path: str):
    def change(entry):
        *parents, last = path.split(".")
        for k in parents:
            entry = entry[k]
        del entry[last]
    return change


BAD_V7_ENTRIES = [
    _set("record.time_ms", -1.0), _set("record.time_ms", "0.1"), _set("record.time_ms", None),
    _set("record.time_ms", True), _set("record.algo", "1"), _set("record.algo", 99),
    _set("record.algo", 1.0), _set("record.math_type", 7), _set("record.workspace", -1),
    _set("record.workspace", 2**64), _set("record.deterministic", "yes"), _set("record.by", "x"),
    _pop("record.math_type"), _set("record", [1]), _set("gpu.name", "\x1b[2JNVIDIA H200"),
    _set("gpu.extra", 1), _set("gpu.sm_count", "132"), _set("cudnn_version", "9.2"),
    _set("cudnn_version", 1), _set("engine", "graph"), _set("params.dtype", "double"),
    _set("params.input_shape", [2, 4, 8, -8]), _set("schema", "1"), _set("schema", True),
    _set("created", 5), _set("created", "\x1b]0;x\x07"), _set("extra", 1), _pop("params"),
]


@pytest.mark.parametrize("change", BAD_V7_ENTRIES, ids=range(len(BAD_V7_ENTRIES)))
def test_an_entry_that_does_not_validate_is_dropped_with_a_log_line(db, caplog, change):
    p, q = make_params(), grouped(2)
    db.store(p, V7_RECORD)
    db.store(q, V7_RECORD)
    _rewrite_first_entry(db, change)
    new_process()
    with caplog.at_level("WARNING", logger="pycudnn"):
        assert db.lookup(p) is None
        assert db.lookup(q) == V7_RECORD
    assert f"tuning database {db.path()}: dropping entry 0" in caplog.text
    assert "\x1b" not in caplog.text  # reasons quote values escaped
    assert len(db.entries()) == 1 and not glob.glob(db.path() + ".corrupt-*")


BAD_GRAPH_RECORDS = [
    ("knobs", [[1]]), ("knobs", "x"), ("knobs", [[1, 2**70]]), ("knobs", [[-1, 0]]),
    ("knobs", [[1, 2]] * 65), ("graph", 1), ("graph", -1), ("engine_id", -1), ("engine_id", "7"),
    ("tag", "eng\x1b[31m"), ("plan_json", 5), ("workspace", 1.5), ("time_ms", float("inf")),
]


@pytest.mark.parametrize("field, value", BAD_GRAPH_RECORDS, ids=lambda v: repr(v)[:20])
def test_a_graph_record_with_a_field_out_of_its_type_or_range_is_dropped(db, field, value):
    p = graph_params()
    db.store(p, GRAPH_RECORD)
    text = Path(db.path()).read_text()
    if value == float("inf"):  # JSON has no infinity; 1e999 parses as one
        _rewrite_first_entry(db, _set("record.time_ms", 12345.5))
        Path(db.path()).write_text(Path(db.path()).read_text().replace("12345.5", "1e999"))
    else:
        _rewrite_first_entry(db, _set(f"record.{field}", value))
    assert Path(db.path()).read_text() != text
    new_process()
    assert db.lookup(p) is None and db.entries() == []


def test_lookup_returns_checked_types_and_leaves_out_stored_plan_json(db):
    p = graph_params()
    db.store(p, dict(GRAPH_RECORD, plan_json='{"engine": 41}'))
    new_process()
    got = db.lookup(p)
    assert got == GRAPH_RECORD  # a plan is rebuilt from engine id and knobs, never from JSON
    got["knobs"][0][1] = 99  # a deep copy
    assert db.lookup(p) == GRAPH_RECORD


def test_storing_a_record_that_does_not_validate_forgets_the_earlier_one(db, caplog):
    p = make_params()
    db.store(p, V7_RECORD)
    with caplog.at_level("WARNING", logger="pycudnn"):
        db.store(p, dict(V7_RECORD, algo="1"))
    assert "not storing a record" in caplog.text and "record.algo" in caplog.text
    assert db.lookup(p) is None and db.entries() == []


def test_import_validates_every_entry_and_counts_the_refused(db, tmp_path, caplog):
    p, q = make_params(), grouped(2)
    out = shipped_file(db, tmp_path, p, q)
    doc = json.loads(out.read_text())
    doc["entries"][1]["record"]["time_ms"] = "fast"
    doc["entries"].append({"schema": 1, "gpu": {"name": "\x1b]0;pwned\x07"}, "cudnn_version": "9.2"})
    out.write_text(json.dumps(doc))
    with caplog.at_level("WARNING", logger="pycudnn"), \
            pytest.warns(TuningDatabaseWarning, match="refused 2 entries"):
        report = db.import_file(out)
    assert report == db.MergeReport(added=1, replaced=0, kept=0, refused=2)
    assert f"tuning database {out}: dropping entry 1" in caplog.text
    assert len(db.entries()) == 1


@pytest.mark.parametrize("depth, corrupt", [(5, False), (32, False), (33, True), (5000, True)])
def test_a_document_nested_beyond_the_files_limit_is_corrupt_on_every_python(db, depth, corrupt):
    """Whether deep JSON parses depends on the Python version; the file's own depth limit does not."""
    nested = "[" * (depth - 2) + "]" * (depth - 2)
    text = '{"format": "pycudnn-tuning-db", "version": 1, "entries": [' + nested + "]}"
    os.makedirs(os.path.dirname(db.path()), exist_ok=True)
    Path(db.path()).write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert db.entries() == []
    aside = glob.glob(db.path() + ".corrupt-*")
    assert bool(aside) == corrupt, [str(w.message) for w in caught]


# ---- records owned by their engine -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _ToyChoice:
    """A registered engine's record identity: one level in [0, 7]."""

    level: int

    @classmethod
    def from_stored(cls, data, params):
        if not isinstance(data, dict) or set(data) != {"level"}:
            raise ValueError(f"record: expected exactly the field 'level', got {data!r}")
        if type(data["level"]) is not int or not 0 <= data["level"] <= 7:
            raise ValueError(f"record.level: expected an integer in [0, 7], got {data['level']!r}")
        return cls(data["level"])


class _ToyEngine(ScriptedEngine):
    """An engine the tuning database has never heard of, registered at run time."""

    name = "toy"

    def check_stored(self, data, params):
        return dataclasses.asdict(_ToyChoice.from_stored(data, params))

    def check_stored_params(self, params):
        super().check_stored_params(params)
        if params.workspace_limit is not None:
            raise ValueError("params.workspace_limit: the toy engine takes none")


@pytest.fixture
def toy(monkeypatch):
    from pycudnn.engines import registry

    monkeypatch.setitem(registry.ENGINES, "toy", _ToyEngine())


def test_a_registered_engine_keeps_records_that_it_checks_itself(db, toy):
    p = make_params(engine="toy")
    db.store(p, {"level": 3})
    new_process()
    assert db.lookup(p) == {"level": 3}
    entry, = db.entries()
    assert entry["engine"] == "toy" and entry["record"] == {"level": 3}


@pytest.mark.parametrize("record, why", [({"level": 9}, "record.level"),
                                         ({"level": 3, "algo": 1}, "exactly the field"),
                                         ({"algo": 1, "math_type": 0, "workspace": 0}, "exactly")])
def test_a_registered_engines_own_check_refuses_its_bad_records(db, toy, caplog, record, why):
    p = make_params(engine="toy")
    with caplog.at_level("WARNING", logger="pycudnn"):
        db.store(p, record)
    assert "not storing a record" in caplog.text and why in caplog.text
    assert db.lookup(p) is None and db.entries() == []


def test_a_registered_engines_parameter_rule_applies_to_stored_keys(toy):
    data = tuning_records.params_to_dict(make_params(engine="toy", workspace_limit=1 << 20))
    with pytest.raises(ValueError, match="the toy engine takes none"):
        tuning_records.params_from_dict(data, 0)
    data["workspace_limit"] = None
    assert tuning_records.params_from_dict(data, 0) == make_params(engine="toy")


def test_an_entry_of_an_engine_no_longer_registered_is_dropped_on_read(db, toy, monkeypatch):
    from pycudnn.engines import registry

    db.store(make_params(engine="toy"), {"level": 3})
    new_process()
    monkeypatch.delitem(registry.ENGINES, "toy")
    assert db.entries() == []


def test_the_tuning_package_names_no_engine_and_no_engines_record_field():
    """Its code (docstrings and comments aside) names no engine, engine class or record field."""
    import ast

    import pycudnn.tuning

    names = {"v7", "graph", "algo", "math_type", "engine_id", "knobs", "V7Engine", "GraphEngine",
             "V7Choice", "GraphChoice"}
    for path in Path(pycudnn.tuning.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.alias):
                used.update(node.name.split("."))
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings):
                used.update(re.findall(r"\w+", node.value))
        assert not used & names, (path.name, sorted(used & names))


def test_each_engines_stored_choice_round_trips_through_its_own_check():
    from pycudnn.engines.graph import GraphChoice, GraphEngine
    from pycudnn.engines.v7 import AlgoRecord, V7Engine

    v7 = V7Engine()
    data = v7.serialize(AlgoRecord(1, 1, 4096, 0.25, True, "forward", "find"))
    assert data == V7_RECORD and v7.check_stored(data, make_params()) == V7_RECORD
    unmeasured = v7.serialize(AlgoRecord(1, 1, 4096, -1.0, True, "forward", "heuristics"))
    assert "time_ms" not in unmeasured and v7.check_stored(unmeasured, make_params()) == unmeasured
    choice = GraphChoice.from_stored(dict(GRAPH_RECORD, plan_json="{}"), graph_params())
    assert choice.knobs == ((3, 1), (17, 0)) and choice.to_stored() == GRAPH_RECORD
    assert GraphEngine().check_stored(GRAPH_RECORD, graph_params()) == GRAPH_RECORD
    with pytest.raises(ValueError, match="record.graph"):  # one graph unless alpha needs two
        GraphChoice.from_stored(dict(GRAPH_RECORD, graph=1), graph_params())
    with pytest.raises(ValueError, match="for the v7 engine"):
        v7.check_stored(GRAPH_RECORD, make_params())
