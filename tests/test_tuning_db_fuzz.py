"""Fuzzing the tuning database's files: the file is untrusted input (another machine's export, a
shared directory, another user), so whatever it holds, the public functions of
:mod:`pycudnn.tuning.db` and ``pycudnn cache`` must

* never raise (``merge`` may refuse a file that is not a database with its documented
  ValueError) and never hang;
* give back only what checks out: ``lookup(params)`` is None or a record whose every field has the
  type and range its engine writes, ``entries()`` holds only well-formed entries;
* not let a bad entry spoil the good ones next to it, nor an imported record replace a local one;
* print nothing raw from the file (no terminal escape sequences, no unencodable text).

Documents are random JSON, valid-looking databases with one field wrong (wrong types, negative,
huge and non-finite numbers, strings with escapes, unknown dtypes, deep nesting spliced in as raw
text, records of the other engine) and near-miss records of other keys. The CPU tests seed the
GPU identity; the GPU test runs real convolutions against fuzzed records with guard bytes after
the output and around the inputs, and checks the result against a float64 NumPy reference.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import signal
import tempfile
import threading
import warnings
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pycudnn.cli import program
from pycudnn.tuning import db as tuning_db
from pycudnn.tuning import records as tuning_records
from pycudnn.configuration import config
from test_algos import make_params

H200 = {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}

#: lookup keys: both engines, every direction, strict float32 with a workspace limit
KEYS = [
    make_params(),
    make_params(engine="graph", alignments=(16, 16, 16)),
    make_params(deterministic=True, allow_tf32=False, workspace_limit=1 << 20),
    make_params(direction="backward_data", dtype="float16", engine="graph", alignments=(16, 8, 16),
                benchmark_limit=4),
    make_params(direction="backward_filter", dtype="bfloat16"),
]


def good_record(params: Any, time_ms: float = 0.25) -> dict[str, Any]:
    """A record that an engine's serialize() could have written for ``params``."""
    if params.engine == "v7":
        math_type = 3 if params.dtype == "float32" and not params.allow_tf32 else 1  # FMA / TENSOR_OP
        return {"algo": 1, "math_type": math_type, "workspace": 4096, "time_ms": time_ms,
                "deterministic": True}
    return {"graph": 0, "engine_id": 41, "knobs": [[3, 1], [17, 0]], "workspace": 0,
            "time_ms": time_ms, "tag": "eng41_k3=1_k17=0"}


def good_entry(params: Any, record: dict[str, Any] | None = None,
               gpu: dict[str, Any] = H200) -> dict[str, Any]:
    return {"schema": tuning_records.SCHEMA_VERSION, "gpu": copy.deepcopy(gpu),
            "cudnn_version": params.cudnn_version, "engine": params.engine,
            "params": tuning_records.params_to_dict(params),
            "record": good_record(params) if record is None else record,
            "created": "2025-01-01T00:00:00+00:00", "pycudnn": "0.1.0"}


# ---- what "checks out" means (independent of tuning_db's own checks) ----------------------------

#: the time_ms of the records stored under keys near KEYS (a lookup of KEYS must never give it)
OTHER_KEY = 987654.25

_V7_ALGOS = {"forward": 8, "backward_data": 6, "backward_filter": 7}  # cuDNN 9's algorithm counts


def _plain_int(v: Any, lo: int, hi: int = 2**63 - 1) -> bool:
    return type(v) is int and lo <= v <= hi


def record_problem(record: Any, params: Any) -> str | None:
    """Why ``record`` is not what ``params``'s engine writes (None when it is)."""
    if not isinstance(record, dict):
        return f"record is a {type(record).__name__}"
    if not _plain_int(record.get("workspace"), 0):
        return f"workspace {record.get('workspace')!r}"
    if "time_ms" in record:
        t = record["time_ms"]
        if type(t) not in (int, float) or not math.isfinite(t) or not (t >= 0 or t == -1):
            return f"time_ms {t!r}"
    if params.engine == "v7":
        if not _plain_int(record.get("algo"), 0, _V7_ALGOS[params.direction] - 1):
            return f"algo {record.get('algo')!r} for {params.direction}"
        if not _plain_int(record.get("math_type"), 0, 3):
            return f"math_type {record.get('math_type')!r}"
        if "deterministic" in record and type(record["deterministic"]) is not bool:
            return f"deterministic {record['deterministic']!r}"
        return None
    if not _plain_int(record.get("graph", 0), 0, 1):
        return f"graph {record.get('graph')!r}"
    if not _plain_int(record.get("engine_id"), 0, 2**31 - 1):
        return f"engine_id {record.get('engine_id')!r}"
    knobs = record.get("knobs", [])
    if not isinstance(knobs, list) or not all(
            isinstance(k, list) and len(k) == 2 and all(_plain_int(v, -2**63) for v in k)
            for k in knobs):
        return f"knobs {knobs!r}"
    for name in ("tag", "plan_json"):
        if name in record and not isinstance(record[name], str):
            return f"{name} {record[name]!r}"
    return None


def entry_problem(entry: Any) -> str | None:
    """Why an entry that entries() gave back is not well formed (None when it is)."""
    from pycudnn.engines.problem import ConvolutionParams

    if not isinstance(entry, dict):
        return f"entry is a {type(entry).__name__}"
    if type(entry.get("schema")) is not int or type(entry.get("cudnn_version")) is not int:
        return "schema or cudnn_version is not an int"
    if not isinstance(entry.get("gpu"), dict) or not isinstance(entry.get("params"), dict):
        return "gpu or params is not an object"
    p = dict(entry["params"])
    if p.get("direction") not in _V7_ALGOS or p.get("engine") not in ("v7", "graph"):
        return f"direction {p.get('direction')!r}, engine {p.get('engine')!r}"
    if p.get("dtype") not in ("float32", "float16", "bfloat16", "float64"):
        return f"dtype {p.get('dtype')!r}"  # e.g. "double": sizes would be computed wrong
    for name in ("input_shape", "weight_shape", "output_shape", "input_strides", "output_strides",
                 "padding", "stride", "dilation"):
        v = p.get(name)
        if not isinstance(v, list) or not all(_plain_int(n, 0) for n in v):
            return f"params.{name} {v!r}"
    if len(p["input_shape"]) not in (4, 5) or not _plain_int(p.get("groups"), 1):
        return "rank or groups"
    p.setdefault("device", 0)
    try:
        params = ConvolutionParams(**{k: tuple(v) if isinstance(v, list) else v for k, v in p.items()})
    except TypeError as exc:
        return f"params do not make ConvolutionParams: {exc}"
    if entry.get("engine") != params.engine:
        return "engine differs from params.engine"
    return record_problem(entry.get("record"), params)


# ---- documents --------------------------------------------------------------------------------------

#: text spliced in raw where a value goes (json.dumps cannot write these)
RAW_TOKENS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e400", "1" * 5000, "-" + "9" * 4400,
              "[" * 100_000 + "]" * 100_000, '{"a":' * 3000 + "0" + "}" * 3000,
              "[" * 900 + "]" * 900, '"\\ud800"', '"\\u001b[2J\\u001b]0;owned\\u0007"']

BAD_SCALARS = [None, True, False, 0, -1, -4096, 2**31, 2**63, 2**64, -2**63 - 1, 10**30, 0.5, -0.0,
               1.0, 1e308, "", "1", "4096", "double", "float", "int8", "v8", "FORWARD",
               "\x1b[31mred\x1b[0m", "\u202eevil", "\x00", "a\nb", "\ud800", "é" * 300, [], {},
               [1, 2], [[1, "a"]], {"a": 1}, [None], [3, [1]]]

_text = st.text(st.characters(), max_size=12) | st.sampled_from(
    ["\x1b[2J", "\x07", "\u0085", "\ud800", "\\u0000"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12)
bad_values = st.sampled_from(BAD_SCALARS) | json_values


class Raw(str):
    """A value written as raw text in the document."""


raw_values = st.sampled_from(RAW_TOKENS).map(Raw)

_PARAM_FIELDS = list(tuning_records.params_to_dict(KEYS[0]))
_RECORD_FIELDS = ["algo", "math_type", "workspace", "time_ms", "deterministic", "graph",
                  "engine_id", "knobs", "tag", "plan_json", "extra"]


@st.composite
def one_field_wrong(draw) -> dict[str, Any]:
    """A valid entry for one of KEYS with one field replaced, removed, or added."""
    params = draw(st.sampled_from(KEYS))
    entry = good_entry(params)
    where = draw(st.sampled_from(["top", "gpu", "params", "record", "record", "record", "swap"]))
    if where == "swap":  # the record of the other engine
        other = KEYS[1] if params.engine == "v7" else KEYS[0]
        entry["record"] = good_record(other)
        return entry
    target, fields = {
        "top": (entry, list(entry) + ["extra"]),
        "gpu": (entry["gpu"], list(H200) + ["extra"]),
        "params": (entry["params"], _PARAM_FIELDS + ["extra"]),
        "record": (entry["record"], _RECORD_FIELDS),
    }[where]
    name = draw(st.sampled_from(fields))
    if draw(st.integers(0, 9)) == 0:
        target.pop(name, None)
    else:
        target[name] = draw(bad_values | raw_values)
    return entry


@st.composite
def other_key(draw) -> dict[str, Any]:
    """A valid entry for a key near one of KEYS (one key field differs), with a marked record."""
    params = draw(st.sampled_from(KEYS))
    entry = good_entry(params, good_record(params, time_ms=OTHER_KEY))  # marks "another key's"
    change = draw(st.sampled_from(["shape", "dtype", "cudnn", "gpu", "schema", "engine", "padding",
                                   "deterministic", "workspace_limit", "direction", "groups"]))
    p = entry["params"]
    if change == "shape":
        p["input_shape"][-1] += 1
    elif change == "dtype":
        p["dtype"] = "float64" if p["dtype"] != "float64" else "float32"
    elif change == "cudnn":
        entry["cudnn_version"] += 100
        p["cudnn_version"] += 100
    elif change == "gpu":
        entry["gpu"] = dict(H200, sm_count=114, name="NVIDIA H100")
    elif change == "schema":
        entry["schema"] += 1
    elif change == "engine":
        entry["engine"] = p["engine"] = "graph" if p["engine"] == "v7" else "v7"
    elif change == "padding":
        p["padding"] = [0, 0]
    elif change == "deterministic":
        p["deterministic"] = not p["deterministic"]
    elif change == "workspace_limit":
        p["workspace_limit"] = 0 if p["workspace_limit"] is None else None
    elif change == "direction":
        p["direction"] = "backward_data" if p["direction"] != "backward_data" else "forward"
    else:
        p["groups"] = 2
    return entry


def render(doc: Any) -> str:
    """JSON text of ``doc`` with every Raw value spliced in as written."""
    raws: list[str] = []

    def sub(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(str(v))
            return f"@@RAW{len(raws) - 1}@@"
        if isinstance(v, dict):
            return {k: sub(x) for k, x in v.items()}
        if isinstance(v, list):
            return [sub(x) for x in v]
        return v

    text = json.dumps(sub(doc), allow_nan=True)
    for i, r in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', r, 1)
    return text


@st.composite
def database_documents(draw) -> tuple[bytes, bool]:
    """(file bytes, whether it is strict JSON with an intact header): a database document whose
    entries are good, wrong in one field, or of another key, possibly damaged as a whole."""
    entries = draw(st.lists(st.one_of(one_field_wrong(), other_key(),
                                      st.sampled_from(KEYS).map(good_entry), json_values),
                            min_size=1, max_size=5))
    doc: dict[str, Any] = {"format": "pycudnn-tuning-db", "version": 1, "entries": entries}
    intact = True
    damage = draw(st.sampled_from(["none"] * 6 + ["header", "truncate", "bytes", "bom"]))
    if damage == "header":
        doc[draw(st.sampled_from(["format", "version", "entries"]))] = draw(bad_values)
        intact = False
    text = render(doc)
    data = text.encode("utf-8", "surrogatepass")
    if damage == "truncate":
        data = data[:draw(st.integers(0, max(len(data) - 1, 0)))]
        intact = False
    elif damage == "bytes":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80"])) + data[at:]
        intact = False
    elif damage == "bom":
        data = b"\xef\xbb\xbf" + data
        intact = False
    if intact:
        try:
            parsed = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
        except (ValueError, RecursionError):  # NaN, huge ints, deep nesting, lone surrogates
            intact = False
        else:  # the file format's own limit, the same on every Python
            intact = _depth(parsed) <= 32
    return data, intact


def _depth(v: Any) -> int:
    """How deep lists and dicts nest in ``v`` (a scalar is 0), without recursion."""
    deepest, todo = 0, [(v, 1)]
    while todo:
        node, d = todo.pop()
        if isinstance(node, (list, dict)):
            deepest = max(deepest, d)
            todo.extend((c, d + 1) for c in (node.values() if isinstance(node, dict) else node))
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)


random_documents = st.one_of(
    json_values.map(lambda v: render(v).encode("utf-8", "surrogatepass")),
    st.binary(max_size=64),
    raw_values.map(lambda r: str(r).encode("utf-8", "surrogatepass")),
    st.builds(lambda v: render({"format": "pycudnn-tuning-db", "version": 1, "entries": v})
              .encode("utf-8", "surrogatepass"), json_values))


# ---- running the public functions -------------------------------------------------------------------

class Hang(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Hang in this (main) thread after ``seconds``: a blocking open or a lock wait ends.
    In another thread (SIGALRM reaches only the main one) nothing is armed: a hang there is
    reported by the run's faulthandler timeout instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def fresh_db(seed_identity: bool = True) -> Iterator[str]:
    """A new private cache directory (0700, ours) as PYCUDNN_CACHE_DIR, the database on, nothing
    in memory; device 0 is an H200 unless ``seed_identity`` is False (a real GPU)."""
    saved = {k: os.environ.get(k) for k in ("PYCUDNN_CACHE_DIR", "PYCUDNN_TUNING_DB")}
    with tempfile.TemporaryDirectory(prefix="pycudnn-fuzz-") as d:
        os.environ["PYCUDNN_CACHE_DIR"] = d
        os.environ.pop("PYCUDNN_TUNING_DB", None)
        config.reset()
        tuning_db.forget()
        real_identity = tuning_db.device_identity
        if seed_identity:  # device 0 answers as an H200; any other device asks the runtime
            tuning_db.device_identity = lambda device: dict(H200) if device == 0 else real_identity(device)
        try:
            yield d
        finally:
            tuning_db.device_identity = real_identity
            tuning_db.forget()
            config.reset()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def new_process() -> None:
    """What a later process sees: nothing in memory, the file on disk (the device identity that
    `fresh_db` set stays)."""
    tuning_db.forget()


def run_cli(*args: str) -> tuple[int, str, str]:
    """``pycudnn ARGS`` in this process, printing to strict UTF-8 streams as a terminal would;
    ``--debug`` lets an unexpected exception out (a crash, not a one-line error)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = program.main(["--debug", *args])
    out.flush()
    err.flush()
    return rc, out.buffer.getvalue().decode(), err.buffer.getvalue().decode()  # type: ignore[attr-defined]


def printable(text: str) -> bool:
    return all(c in "\n\t" or c.isprintable() for c in text)


def check_lookups(where: str) -> None:
    for params in KEYS:
        rec = tuning_db.lookup(params)
        if rec is not None:
            problem = record_problem(rec, params)
            assert problem is None, f"{where}: lookup({params.short()}) gave {rec!r}: {problem}"
            assert rec.get("time_ms") != OTHER_KEY, f"{where}: lookup gave another key's record {rec!r}"


def check_entries(where: str) -> list[dict[str, Any]]:
    rows = tuning_db.entries()
    assert isinstance(rows, list)
    for e in rows:
        problem = entry_problem(e)
        assert problem is None, f"{where}: entries() holds {e!r}: {problem}"
    return rows


def check_show(where: str, as_json: bool = False) -> None:
    rc, out, err = run_cli("cache", "show", *(["--json"] if as_json else []))
    assert rc == 0, f"{where}: cache show exited {rc}: {err}"
    assert printable(out) and printable(err), f"{where}: cache show printed raw control characters"
    if as_json:
        json.loads(out)


def exercise(data: bytes, intact: bool) -> None:
    """Every public function against a database file holding ``data``."""
    db_file = tuning_db.path()
    with open(db_file, "wb") as f:
        f.write(data)
    imported = os.path.join(os.path.dirname(db_file), "import.json")
    with open(imported, "wb") as f:
        f.write(data)
    new_process()

    check_lookups("fuzzed file")
    rows = check_entries("fuzzed file")
    if intact:  # a bad entry must not spoil the good ones next to it
        doc = json.loads(data.decode("utf-8"))
        # compared as JSON text: in Python 1.0 == 1 == True, in a key they differ
        texts = {json.dumps(e, sort_keys=True) for e in doc["entries"]}
        good = [p for p in KEYS if json.dumps(good_entry(p), sort_keys=True) in texts]
        new_process()
        for params in good:
            assert tuning_db.lookup(params) is not None, (
                f"a good entry for {params.short()} was lost next to bad ones")
        assert len(rows) >= len(good)
    check_show("fuzzed file", as_json=True)

    # import: a file that is not a database is refused as documented, anything else merges
    try:
        tuning_db.merge(imported)
    except ValueError:
        pass
    rc, _, err = run_cli("cache", "import", imported)
    assert rc in (0, 2) and printable(err), f"cache import exited {rc}: {err}"
    check_lookups("after import")
    check_entries("after import")
    check_show("after import")

    # a local record is kept, and an import does not replace it (whatever its time_ms)
    local = good_record(KEYS[0], time_ms=0.5)
    tuning_db.store(KEYS[0], local)
    assert tuning_db.lookup(KEYS[0]) == local
    with contextlib.suppress(ValueError):
        tuning_db.merge(imported)
    new_process()
    assert tuning_db.lookup(KEYS[0]) == local, "an imported record replaced a local one"

    exported = os.path.join(os.path.dirname(db_file), "export.json")
    assert tuning_db.export(exported) >= 1
    tuning_db.drop(KEYS[0])
    assert tuning_db.lookup(KEYS[0]) is None
    tuning_db.drop(KEYS[1])
    rc, _, err = run_cli("cache", "clear")
    assert rc == 0, err
    assert tuning_db.entries() == []
    assert tuning_db.clear() == 0


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Warnings and log lines about bad files are expected here."""
    import logging

    logger = logging.getLogger("pycudnn")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.CRITICAL)
    logger.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
        logger.propagate = propagate


#: a fixed derandomized set by default (CI stays reproducible); PYCUDNN_FUZZ_RANDOM=1 draws fresh
#: examples, as tests/test_fuzz.py does
FUZZ = settings(max_examples=120, deadline=None, database=None,
                derandomize=os.environ.get("PYCUDNN_FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])


@FUZZ
@given(database_documents())
def test_fuzzed_database_documents(doc):
    data, intact = doc
    with quiet(), fresh_db(), time_limit(20):
        exercise(data, intact)


@settings(FUZZ, max_examples=60)
@given(random_documents)
def test_random_files_at_the_database_path(data):
    with quiet(), fresh_db(), time_limit(20):
        exercise(data, False)


def test_good_entries_round_trip():
    """The positive control: what the fuzzer's checks accept is what a database really holds."""
    data = render({"format": "pycudnn-tuning-db", "version": 1,
                   "entries": [good_entry(p) for p in KEYS]}).encode()
    with fresh_db():
        with open(tuning_db.path(), "wb") as f:
            f.write(data)
        new_process()
        for params in KEYS:
            assert tuning_db.lookup(params) == good_record(params)
        assert len(check_entries("good file")) == len(KEYS)
    with quiet(), fresh_db():
        exercise(data, True)


# ---- on the GPU: fuzzed records against real convolutions, with guard bytes -------------------------

GUARD = 4096  # bytes after each buffer
PATTERN = np.frombuffer(b"\xa5\x5a\xc3\x3c" * (GUARD // 4), np.uint8)


def guarded(host: np.ndarray) -> tuple[Any, Any]:
    """(buffer, view): ``host`` uploaded to the front of a device buffer followed by GUARD bytes
    of PATTERN; the view covers the front only."""
    import pycudnn

    raw = np.concatenate([np.ascontiguousarray(host).view(np.uint8).ravel(), PATTERN])
    buf = pycudnn.from_numpy(raw.view(np.float32))  # float32 so that from_numpy takes it
    view = pycudnn.tensor_from_pointer(buf.ptr, host.shape, host.dtype, device=buf.device, owner=buf)
    return buf, view


def guard_intact(buf: Any, host: np.ndarray, front_unchanged: bool) -> str | None:
    """None when the guard bytes (and, for an input, the data) are as written."""
    got = buf.numpy().view(np.uint8)
    n = host.nbytes
    if not np.array_equal(got[n:], PATTERN):
        return f"{int(np.count_nonzero(got[n:] != PATTERN))} guard bytes changed"
    if front_unchanged and not np.array_equal(got[:n], np.ascontiguousarray(host).view(np.uint8).ravel()):
        return "an input was written"
    return None


class _Redzone:
    """Every allocation pycudnn makes for itself while active (workspaces, search scratch) gets
    GUARD more bytes filled with a pattern on its stream; when pycudnn frees it, the pattern is
    read back (TensorFlow's autotuner keeps such redzones). Counts buffers checked and bytes that
    changed."""

    def __init__(self, monkeypatch: Any) -> None:
        import sys

        from pycudnn.runtime import memory

        self.checked = 0
        self.changed = 0
        self.live: list[Any] = []
        self._memory = memory
        real_allocate, real_fast = memory.allocate, memory.allocate_fast

        def allocate(nbytes, device=None, stream=None, **kw):
            return self._guard(real_allocate(nbytes + GUARD, device, stream, **kw), nbytes, stream)

        def allocate_fast(nbytes, device, stream, *a, **kw):
            return self._guard(real_fast(nbytes + GUARD, device, stream, *a, **kw), nbytes, stream)

        # every module that bound the allocators by name (engines, search, replay, preloading)
        patched = 0
        for module in list(sys.modules.values()):
            if not getattr(module, "__name__", "").startswith("pycudnn."):
                continue
            for name, stand_in, real in (("allocate", allocate, real_allocate),
                                         ("allocate_fast", allocate_fast, real_fast)):
                if module.__dict__.get(name) is real:
                    monkeypatch.setattr(module, name, stand_in)
                    patched += 1
        assert patched >= 4, patched  # memory's own two, and the engines' (a renamed import escapes)

    def _guard(self, buf: Any, nbytes: int, stream: Any) -> Any:
        memory = self._memory
        s = 0 if stream is None else stream
        memory.copy_host_to_device(buf.ptr + nbytes, PATTERN, s)
        zone = self
        requested = nbytes

        class Guarded:
            ptr = buf.ptr
            size = requested  # what pycudnn asked for: it must never reuse the guard as its own

            @property
            def nbytes(self) -> int:
                return self.size

            def __getattr__(self, name: str) -> Any:
                return getattr(buf, name)

            def check(self) -> None:
                memory.synchronize()
                tail = np.empty(GUARD, np.uint8)
                memory.copy_device_to_host(tail, buf.ptr + nbytes, 0)
                zone.checked += 1
                zone.changed += int(np.count_nonzero(tail != PATTERN))

            def close(self, stream: Any = None) -> None:
                if self in zone.live:
                    zone.live.remove(self)
                    self.check()
                buf.close(stream) if stream is not None else buf.close()

            def free_synchronously(self) -> None:  # a per-thread workspace evicted from its cache
                if self in zone.live:
                    zone.live.remove(self)
                    self.check()
                buf.free_synchronously()

        guarded = Guarded()
        self.live.append(guarded)
        return guarded

    def check_live(self) -> None:
        """Check the buffers pycudnn still holds (per-thread workspaces it keeps for reuse)."""
        for g in list(self.live):
            g.check()


@st.composite
def fuzzed_real_entries(draw, real: dict[str, Any]) -> list[dict[str, Any]]:
    """The real entry of the key under test with one record field wrong, near-misses of it, or
    records of the other engine, plus random entries."""
    entries = []
    for _ in range(draw(st.integers(1, 3))):
        e = copy.deepcopy(real)
        kind = draw(st.sampled_from(["field", "field", "engine_knobs", "swap", "params"]))
        rec = e["record"]
        if kind == "field":
            rec[draw(st.sampled_from(_RECORD_FIELDS))] = draw(bad_values)
        elif kind == "engine_knobs":  # another engine or knob choice: may not run this graph
            rec["engine_id"] = draw(st.integers(0, 80))
            rec["knobs"] = draw(st.lists(st.lists(st.integers(0, 30), min_size=2, max_size=2),
                                         max_size=3))
            rec["algo"] = draw(st.integers(0, 7))
            rec["math_type"] = draw(st.integers(0, 3))
            rec["workspace"] = draw(st.sampled_from([0, 1, 2**20, 2**40, 2**63 - 1]))
            rec["time_ms"] = 0.0
        elif kind == "swap":
            e["record"] = good_record(KEYS[1] if e["engine"] == "v7" else KEYS[0], time_ms=0.0)
        else:
            e["params"][draw(st.sampled_from(_PARAM_FIELDS))] = draw(bad_values)
        entries.append(e)
    entries += draw(st.lists(json_values, max_size=2))
    return entries


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["graph", "v7"])
def test_fuzzed_records_never_touch_memory_outside_the_output(engine, monkeypatch):
    """Guard bytes after the output, the inputs and every workspace and scratch buffer pycudnn
    allocates stay unchanged, and the result stays right, whatever record the file holds."""
    import pycudnn
    import reference as R

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((12, 8, 3, 3)).astype(np.float32)
    ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)
    stats = {"cases": 0, "calls": 0}

    with quiet(), fresh_db(seed_identity=False):
        xbuf, xv = guarded(x)
        wbuf, wv = guarded(w)

        def run() -> np.ndarray:
            init = np.full(ref.shape, np.nan, np.float32)
            obuf, out = guarded(init)
            y = pycudnn.convolution(xv, wv, padding=1, engine=engine, benchmark=True,
                                    allow_tf32=False, out=out)
            assert y.ptr == out.ptr
            stats["calls"] += 1
            for buf, host, is_input in ((obuf, init, False), (xbuf, x, True), (wbuf, w, True)):
                problem = guard_intact(buf, host, is_input)
                assert problem is None, problem
            return y.numpy()

        def err(got: np.ndarray) -> float:
            return float(np.abs(got - ref).max() / np.abs(ref).max())

        zone = _Redzone(monkeypatch)
        assert err(run()) < 2e-5  # measures and stores the real record of this key
        real = [e for e in tuning_db.entries() if e["engine"] == engine]
        assert len(real) == 1, tuning_db.entries()

        @settings(max_examples=25, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(fuzzed_real_entries(real[0]))
        def check(entries):
            stats["cases"] += 1
            doc = {"format": "pycudnn-tuning-db", "version": 1, "entries": entries}
            with open(tuning_db.path(), "wb") as f:
                f.write(render(doc).encode("utf-8", "surrogatepass"))
            pycudnn.clear_caches()  # a later process: nothing in memory, the fuzzed file on disk
            new_process()
            with time_limit(120):
                assert err(run()) < 2e-5

        # in a thread of its own: its per-thread workspaces are made (guarded) by these calls
        errors: list[BaseException] = []

        def body() -> None:
            try:
                check()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
        t = threading.Thread(target=body)
        t.start()
        t.join()
        if errors:
            raise errors[0]
        zone.check_live()
    assert stats["cases"] >= 10, stats
    assert zone.checked > 0 and zone.changed == 0, (zone.checked, zone.changed)
    print(f"\ntuning-db GPU fuzz ({engine}): {stats['cases']} fuzzed files, {stats['calls']} calls, "
          f"{zone.checked} internal buffers checked, {zone.changed} guard bytes changed")
