"""The persistent tuning database: measured choices that survive the process.

Every choice measured with ``benchmark=True`` is written here (by `pycudnn.search.algos`,
through `store()`) and read back on the first use of the same key in a later process (`lookup()`),
so that process skips the search. A record is applied only where it is valid: the key holds the
GPU's identity (name, compute capability, SM count), the cuDNN version, pycudnn's record schema
version, the engine, and every field of the [`ConvolutionParams`][pycudnn.search.algos.ConvolutionParams]
except the device *ordinal*, which is replaced by the device's identity (an ordinal depends on
``CUDA_VISIBLE_DEVICES``; two GPUs of one model share their records). A record that no longer
rebuilds is dropped by the caller (`drop()`).

**The file.** One JSON document, data only (never pickle: a database file cannot run code):

```
{"format": "pycudnn-tuning-db", "version": 1, "entries": [
{"schema": 1, "gpu": {...}, "cudnn_version": 92800, "engine": "graph", "params": {...},
 "record": {...}, "created": "...", "pycudnn": "0.1.0"},
...
]}
```

one entry a line, so files diff and merge well and a team can ship one with its program
([`export()`][pycudnn.search.tuning_db.export], [`merge()`][pycudnn.search.tuning_db.merge]). ``record`` is what
the engine's ``serialize()`` returned.

**Untrusted input.** A database file may come from another machine, a shared directory or
another user, so nothing in it is believed until checked. Every entry is validated when it is
read, imported or written: its ``params`` are parsed as strictly as a call's arguments
(`params_from_dict()`: canonical dtype names, ranks, non-negative sizes, a geometry that
gives the stored output shape, ...), and its ``record`` must hold exactly the fields of the
engine's ``serialize()`` with the right types and ranges. An entry that does not validate is
dropped with a log line naming the file and the reason; `lookup()` only ever returns a
validated record (the engines still check that it fits the call before running it). A file that
does not parse at all (not JSON, nested too deep, not UTF-8, larger than
`MAX_FILE_BYTES`, not a regular file) is moved aside to ``<file>.corrupt-<timestamp>`` with
one warning, and the program carries on with an empty database. No public function of this
module raises because of what a file contains.

**The directory.** It is created with mode 0700 and files with mode 0600. A directory or database
file that belongs to another user, or that group or others may write, is refused: the database
is off for the rest of the process, with one
[`TuningDatabaseWarning`][pycudnn.search.tuning_db.TuningDatabaseWarning]. Files are opened without
following symbolic links and without blocking (a FIFO at the path cannot hang a call), through a
descriptor of the checked directory.

**Safety between writers.** Readers take no lock: writers replace the file atomically (a
temporary file in the same directory, ``fsync``, ``os.replace``), so a reader sees the old or the
new document, whole. Writers (`store()`, `drop()`, [`clear()`][pycudnn.search.tuning_db.clear],
[`merge()`][pycudnn.search.tuning_db.merge]) hold an exclusive ``flock`` on ``<file>.lock`` (and a lock per
process for threads) while they read the current file, change it and replace it, so several
processes and threads writing at once lose nothing.

**Where.** ``$PYCUDNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pycudnn``, else ``~/.cache/pycudnn``;
the file is ``tuning-db-v1.json`` there. ``PYCUDNN_TUNING_DB=0`` or
``pycudnn.config.tuning_db = False`` (or ``pycudnn.flags(tuning_db=False)``) turns reading and
writing off.

**Cost.** The file is read once per process (per path); a miss re-reads it at most once per key,
and only when the file changed, so a record written meanwhile by another process is found.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import errno
import json
import logging
import math
import os
import secrets
import stat
import threading
import time
import warnings
from typing import Any, Iterable, Iterator

from .._version import __version__
from .._types import BwdDataAlgo, BwdFilterAlgo, FwdAlgo, MathType
from ..configuration import config
from ..runtime.memory import check_cuda
from .problem import ConvolutionParams

__all__ = ["enabled", "lookup", "store", "drop", "path", "cache_dir", "entries", "clear", "export",
           "merge", "import_file", "read_file", "MergeReport", "refused", "forget", "device_identity", "params_to_dict",
           "params_from_dict", "validate_record", "entry_key", "TuningDatabaseWarning", "SCHEMA_VERSION", "FILE_NAME",
           "MAX_FILE_BYTES"]

log = logging.getLogger("pycudnn")

#: version of what a record means; part of every key (bump when a record's meaning changes)
SCHEMA_VERSION = 1
#: the file's layout version is in its name: a later layout uses a new file, never this one
FILE_NAME = "tuning-db-v1.json"
#: a database or import file larger than this is not read (set aside as unusable)
MAX_FILE_BYTES = 64 << 20
_FORMAT = "pycudnn-tuning-db"
_FORMAT_VERSION = 1
#: seconds a writer waits for another process's lock before giving up (an OSError)
LOCK_TIMEOUT_S = 60.0
_REQUIRED = ("schema", "gpu", "cudnn_version", "engine", "params", "record")
_OPTIONAL = ("created", "pycudnn")
_INT_MAX = 2**31 - 1      # cuDNN takes sizes, padding, strides of the v7 API, groups as C ints
_INT64_MAX = 2**63 - 1
#: log at most this many dropped entries one by one per read (then a count)
_LOG_DROPPED = 5


class TuningDatabaseWarning(UserWarning):
    """A tuning database file was unusable (set aside) or its directory was refused."""


# ---- switches and location ------------------------------------------------------------------------

def enabled() -> bool:
    """Whether measured choices are read from and written to disk (``pycudnn.config.tuning_db``,
    which ``PYCUDNN_TUNING_DB=0`` turns off and ``pycudnn.flags(tuning_db=...)`` overrides)."""

    return bool(config.tuning_db)


def cache_dir() -> str:
    """The directory of pycudnn's cache: ``$PYCUDNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pycudnn``,
    else ``~/.cache/pycudnn`` (it may not exist yet)."""
    explicit = os.environ.get("PYCUDNN_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "pycudnn")
    return os.path.join(os.path.expanduser("~"), ".cache", "pycudnn")


def path() -> str:
    """The tuning database file of this process (it may not exist yet)."""
    return os.path.join(cache_dir(), FILE_NAME)


# ---- keys -----------------------------------------------------------------------------------------

_identity_lock = threading.Lock()
_identities: dict[int, dict[str, Any]] = {}


def device_identity(device: int) -> dict[str, Any]:
    """``{"name", "compute_capability", "sm_count"}`` of CUDA device ``device``, asked once per
    device through ``cudaGetDeviceProperties`` (only called once a GPU has run a convolution).

    Raises:
        pycudnn.NoDeviceError, pycudnn.runtime.memory.CudaError: the runtime could not answer.
    """
    ident = _identities.get(device)
    if ident is not None:
        return ident
    from cuda.bindings import runtime as rt


    err, prop = rt.cudaGetDeviceProperties(device)
    check_cuda(err, f"cudaGetDeviceProperties({device})")
    name = prop.name
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).split(b"\0", 1)[0].decode("utf-8", "replace")
    ident = {"name": str(name).strip(), "compute_capability": [int(prop.major), int(prop.minor)],
             "sm_count": int(prop.multiProcessorCount)}
    with _identity_lock:
        _identities[device] = ident
    return ident


def _jsonable(value: Any) -> Any:
    """Plain JSON data: tuples as lists, numpy scalars as Python ones, non-finite floats as None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return _jsonable(value.item())
    raise TypeError(f"tuning database: {type(value).__name__} is not JSON data: {value!r}")


def params_to_dict(params: Any) -> dict[str, Any]:
    """Every field of a [`ConvolutionParams`][pycudnn.search.algos.ConvolutionParams] as JSON data (tuples
    as lists)."""
    return {f.name: _jsonable(getattr(params, f.name)) for f in dataclasses.fields(params)}


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


# ---- validation of what is read -------------------------------------------------------------------
# The rules are those of a call (conv.py): a record whose parameters no call can produce is refused.

_DIRECTIONS = ("forward", "backward_data", "backward_filter")
_DTYPES = ("float32", "float16", "bfloat16", "float64")  # the names a call writes (numpy's)
_ENGINES = ("v7", "graph")
_EPILOGUES = ("", "bias", "bias_relu", "add_relu")
_WEIGHT_FORMATS = ("NCHW", "NHWC")
_ALIGNMENTS = (1, 2, 4, 8, 16)


def _brief(value: Any, limit: int = 60) -> str:
    """``repr`` of an untrusted value for a message: escaped and cut to ``limit`` characters."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a message must never fail
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int(name: str, v: Any, lo: int, hi: int = _INT64_MAX) -> int:
    if type(v) is not int:  # bool is not an int here, nor is 1.0
        raise TypeError(f"{name}: expected an integer, got {_brief(v)}")
    if not lo <= v <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {v}")
    return v


def _ints(name: str, v: Any, length: int, lo: int, hi: int) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{name}: expected a list of {length} integers, got {_brief(v)}")
    if len(v) != length:
        raise ValueError(f"{name}: expected {length} values, got {len(v)}: {_brief(v)}")
    if not all(type(i) is int for i in v):
        raise TypeError(f"{name}: {name} must hold integers, got {_brief(v)}")
    if not all(lo <= i <= hi for i in v):
        raise ValueError(f"{name}: expected every value in [{lo}, {hi}], got {_brief(v)}")
    return tuple(v)


def _bool(name: str, v: Any) -> bool:
    if type(v) is not bool:
        raise TypeError(f"{name}: expected true or false, got {_brief(v)}")
    return v


def _choice(name: str, v: Any, allowed: tuple[Any, ...]) -> Any:
    if type(v) is not str or v not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, allowed))}, got {_brief(v)}")
    return v


def _real(name: str, v: Any, lo: float | None = None) -> float:
    if type(v) not in (int, float):
        raise TypeError(f"{name}: expected a number, got {_brief(v)}")
    f = float(v)
    if not math.isfinite(f) or (lo is not None and f < lo):
        raise ValueError(f"{name}: expected a finite number{'' if lo is None else f' >= {lo}'}, "
                         f"got {_brief(v)}")
    return f


def _text(name: str, v: Any, limit: int, printable: bool = True) -> str:
    if type(v) is not str:
        raise TypeError(f"{name}: expected a string, got {_brief(v)}")
    if len(v) > limit:
        raise ValueError(f"{name}: longer than {limit} characters")
    if printable and not v.isprintable():  # no control or escape characters: it gets displayed
        raise ValueError(f"{name}: holds non-printable characters: {_brief(v)}")
    return v


def params_from_dict(data: Any, device: int) -> Any:
    """The [`ConvolutionParams`][pycudnn.search.algos.ConvolutionParams] of a database entry's ``params``
    (the inverse of `params_to_dict()`), on device ``device``, parsed as strictly as a call's
    arguments: every value must be one that a call can produce (canonical dtype names, known
    directions, engines and epilogues, ranks, sizes and a geometry that gives the stored output
    shape).

    Raises:
        TypeError, ValueError: a field is missing, unknown, of the wrong kind or out of range.
    """

    fields = {f.name: f for f in dataclasses.fields(ConvolutionParams)}
    if not isinstance(data, dict):
        raise TypeError(f"params: expected an object, got {type(data).__name__}")
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"params: unknown field(s) {_brief(sorted(map(str, unknown)))}")
    for name, f in fields.items():
        if name != "device" and name not in data and f.default is dataclasses.MISSING:
            raise ValueError(f"params: missing field {name!r}")
    d = {name: data.get(name, f.default) for name, f in fields.items()}
    if "device" in data:
        _int("params.device", data["device"], 0, _INT_MAX)
    v: dict[str, Any] = {"device": _int("device", device, 0, _INT_MAX)}
    v["direction"] = _choice("params.direction", d["direction"], _DIRECTIONS)
    v["cudnn_version"] = _int("params.cudnn_version", d["cudnn_version"], 1, _INT_MAX)
    v["dtype"] = _choice("params.dtype", d["dtype"], _DTYPES)
    x = d["input_shape"]
    if not isinstance(x, (list, tuple)) or len(x) not in (4, 5):
        raise ValueError(f"params.input_shape: expected 4 or 5 sizes (1-D convolutions are stored "
                         f"as 2-D), got {_brief(x)}")
    rank, nd = len(x), len(x) - 2
    v["input_shape"] = xs = _ints("params.input_shape", x, rank, 0, _INT_MAX)
    v["weight_shape"] = ws = _ints("params.weight_shape", d["weight_shape"], rank, 1, _INT_MAX)
    v["output_shape"] = ys = _ints("params.output_shape", d["output_shape"], rank, 0, _INT_MAX)
    for name in ("input_strides", "output_strides"):
        v[name] = _ints(f"params.{name}", d[name], rank, 0, _INT64_MAX)
    v["weight_format"] = _choice("params.weight_format", d["weight_format"], _WEIGHT_FORMATS)
    if v["dtype"] == "float64" and v["weight_format"] != "NCHW":
        raise ValueError("params.weight_format: float64 convolutions run in NCHW only")
    v["padding"] = pad = _ints("params.padding", d["padding"], nd, 0, _INT_MAX)
    v["stride"] = st = _ints("params.stride", d["stride"], nd, 1, _INT_MAX)
    v["dilation"] = dil = _ints("params.dilation", d["dilation"], nd, 1, _INT_MAX)
    v["groups"] = g = _int("params.groups", d["groups"], 1, _INT_MAX)
    if ws[0] % g or xs[1] != ws[1] * g:
        raise ValueError(f"params: input {list(xs)}, weight {list(ws)} and groups={g} do not fit")
    spatial = tuple((i + 2 * p - dl * (k - 1) - 1) // s + 1
                    for i, k, s, p, dl in zip(xs[2:], ws[2:], st, pad, dil))
    if any(o < 1 for o in spatial) or ys != (xs[0], ws[0]) + spatial:
        raise ValueError(f"params.output_shape: {list(ys)} is not the output of input {list(xs)} "
                         f"and weight {list(ws)} with padding {list(pad)}, stride {list(st)}, "
                         f"dilation {list(dil)}")
    v["deterministic"] = _bool("params.deterministic", d["deterministic"])
    v["allow_tf32"] = _bool("params.allow_tf32", d["allow_tf32"])
    wl = d["workspace_limit"]
    v["workspace_limit"] = None if wl is None else _int("params.workspace_limit", wl, 0)
    v["engine"] = eng = _choice("params.engine", d["engine"], _ENGINES)
    v["epilogue"] = ep = _choice("params.epilogue", d["epilogue"], _EPILOGUES)
    if ep and v["direction"] != "forward":
        raise ValueError(f"params.epilogue: {ep!r} exists for the forward direction only")
    if ep in ("bias", "bias_relu") and eng != "graph":
        raise ValueError(f"params.epilogue: {ep!r} is fused by the graph engine only")
    zs = d["z_strides"]
    if (zs is not None) != (ep == "add_relu"):
        raise ValueError("params.z_strides: given exactly when the epilogue is 'add_relu'")
    v["z_strides"] = None if zs is None else _ints("params.z_strides", zs, rank, 0, _INT64_MAX)
    v["alpha"] = alpha = _real("params.alpha", d["alpha"])
    if ep != "add_relu" and alpha != 1.0:
        raise ValueError("params.alpha: other than 1.0 only with the 'add_relu' epilogue")
    n_align = 0 if eng == "v7" else {"": 3, "bias": 4, "bias_relu": 4, "add_relu": 5}[ep]
    al = _ints("params.alignments", d["alignments"], n_align, 1, 16)
    if any(a not in _ALIGNMENTS for a in al):
        raise ValueError(f"params.alignments: expected powers of two up to 16, got {list(al)}")
    v["alignments"] = al
    bl = d.get("benchmark_limit")
    if bl is not None and eng != "graph":
        raise ValueError("params.benchmark_limit: set for the graph engine only")
    v["benchmark_limit"] = None if bl is None else _int("params.benchmark_limit", bl, 0)
    unparsed = set(fields) - set(v)
    if unparsed:  # a field added to ConvolutionParams needs its rule here
        raise ValueError(f"params: no rule to read field(s) {sorted(unparsed)}")
    return ConvolutionParams(**v)


#: the fields of each engine's ``serialize()`` (algos.V7Search, graph_engine.GraphSearch):
#: name -> (required, check); a field not listed refuses the record
def _v7_algo(direction: str, v: Any) -> int:

    enum = {"forward": FwdAlgo, "backward_data": BwdDataAlgo, "backward_filter": BwdFilterAlgo}[direction]
    algo = _int("record.algo", v, 0, _INT_MAX)
    if algo not in set(e.value for e in enum):
        raise ValueError(f"record.algo: {algo} is not a {enum.__name__} value")
    return algo


def _math_type(v: Any) -> int:

    m = _int("record.math_type", v, 0, _INT_MAX)
    if m not in set(e.value for e in MathType):
        raise ValueError(f"record.math_type: {m} is not a cudnnMathType_t value")
    return m


def _knobs(v: Any) -> list[list[int]]:
    if not isinstance(v, list) or len(v) > 64:
        raise TypeError(f"record.knobs: expected a list of at most 64 [type, value] pairs, got "
                        f"{_brief(v)}")
    out = []
    for kv in v:
        t, value = _ints("record.knobs[]", kv, 2, -_INT64_MAX - 1, _INT64_MAX)
        out.append([_int("record.knobs[] type", t, 0, _INT_MAX), value])
    return out


def validate_record(record: Any, params: Any) -> dict[str, Any]:
    """A copy of ``record`` (what an engine's ``serialize()`` gave for ``params``) once every
    field has been checked: exactly the fields that engine writes, each of its type and range
    (``time_ms``, when present, a finite number >= 0).

    Raises:
        TypeError, ValueError: naming the first field that is wrong.
    """
    if not isinstance(record, dict):
        raise TypeError(f"record: expected an object, got {type(record).__name__}")
    checks: dict[str, tuple[bool, Any]]
    if params.engine == "v7":
        checks = {"algo": (True, lambda v: _v7_algo(params.direction, v)),
                  "math_type": (True, _math_type),
                  "workspace": (True, lambda v: _int("record.workspace", v, 0)),
                  "deterministic": (False, lambda v: _bool("record.deterministic", v))}
    else:
        graphs = 2 if params.epilogue == "add_relu" and params.alpha != 1.0 else 1
        checks = {"graph": (True, lambda v: _int("record.graph", v, 0, graphs - 1)),
                  "engine_id": (True, lambda v: _int("record.engine_id", v, 0, _INT_MAX)),
                  "knobs": (True, _knobs),
                  "workspace": (True, lambda v: _int("record.workspace", v, 0)),
                  "tag": (False, lambda v: _text("record.tag", v, 1024)),
                  # written by earlier versions; plans are rebuilt from engine id and knobs now,
                  # so it is accepted (a string) and left out of the checked record
                  "plan_json": (False, lambda v: _text("record.plan_json", v, 8 << 20,
                                                       printable=False))}
    checks["time_ms"] = (False, lambda v: _real("record.time_ms", v, 0.0))
    unknown = set(record) - set(checks)
    if unknown:
        raise ValueError(f"record: unknown field(s) {_brief(sorted(map(str, unknown)))} for the "
                         f"{params.engine} engine")
    out: dict[str, Any] = {}
    for name, (required, check) in checks.items():
        if name in record:
            out[name] = check(record[name])
        elif required:
            raise ValueError(f"record: missing field {name!r}")
    out.pop("plan_json", None)
    return out


def _validate_gpu(gpu: Any) -> dict[str, Any]:
    if not isinstance(gpu, dict) or set(gpu) != {"name", "compute_capability", "sm_count"}:
        raise ValueError(f"gpu: expected an object of name, compute_capability and sm_count, got "
                         f"{_brief(gpu)}")
    return {"name": _text("gpu.name", gpu["name"], 256),
            "compute_capability": list(_ints("gpu.compute_capability", gpu["compute_capability"],
                                             2, 0, 1000)),
            "sm_count": _int("gpu.sm_count", gpu["sm_count"], 0, 1 << 20)}


def _validate_entry(entry: Any) -> tuple[str, dict[str, Any]]:
    """(key, a checked copy of ``entry``); TypeError or ValueError naming what is wrong.

    Entries of another schema version (written by another pycudnn) are kept, checked only for
    their outline: they never match a key of this version, and
    [`pycudnn.preload()`][pycudnn.dispatch.preloading.preload] skips them.
    """
    if not isinstance(entry, dict):
        raise TypeError(f"expected an object, got {type(entry).__name__}")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    schema = _int("schema", entry["schema"], 1, _INT_MAX)
    if schema != SCHEMA_VERSION:
        if not all(isinstance(entry[k], dict) for k in ("gpu", "params", "record")):
            raise TypeError("gpu, params and record must be objects")
        params = dict(entry["params"])
        params.pop("device", None)
        key = _canonical({"schema": schema, "gpu": entry["gpu"], "cudnn": entry["cudnn_version"],
                          "engine": entry["engine"], "params": params})
        return key, json.loads(_canonical(entry))
    unknown = set(entry) - set(_REQUIRED) - set(_OPTIONAL)
    if unknown:
        raise ValueError(f"unknown field(s) {_brief(sorted(map(str, unknown)))}")
    raw = entry["params"]
    device = raw.get("device", 0) if isinstance(raw, dict) else 0
    p = params_from_dict(raw, device if type(device) is int and device >= 0 else 0)
    if _int("cudnn_version", entry["cudnn_version"], 1, _INT_MAX) != p.cudnn_version:
        raise ValueError(f"cudnn_version {entry['cudnn_version']} differs from the params' "
                         f"{p.cudnn_version}")
    if _choice("engine", entry["engine"], _ENGINES) != p.engine:
        raise ValueError(f"engine {entry['engine']!r} differs from the params' {p.engine!r}")
    out = {"schema": schema, "gpu": _validate_gpu(entry["gpu"]),
           "cudnn_version": p.cudnn_version, "engine": p.engine, "params": params_to_dict(p),
           "record": validate_record(entry["record"], p)}
    for k in _OPTIONAL:
        if k in entry:
            out[k] = _text(k, entry[k], 64)
    return entry_key(out), out


def entry_key(entry: dict[str, Any]) -> str:
    """The key of a stored entry: a canonical JSON string of schema, GPU identity, cuDNN version,
    engine and the parameters without the device ordinal.

    Raises:
        KeyError, TypeError, ValueError: the entry lacks a field or holds non-JSON data.
    """
    params = dict(entry["params"])
    params.pop("device", None)
    if not isinstance(entry["gpu"], dict) or not isinstance(entry["record"], dict):
        raise TypeError("gpu and record must be objects")
    return _canonical({"schema": entry["schema"], "gpu": entry["gpu"],
                       "cudnn": entry["cudnn_version"], "engine": entry["engine"],
                       "params": params})


def _new_entry(params: Any, record: dict[str, Any]) -> dict[str, Any]:

    rec = _jsonable(dict(record))
    t = rec.get("time_ms", 0.0)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0:
        rec.pop("time_ms", None)  # not measured (-1) or not finite: the engines read it as -1
    return {
        "schema": SCHEMA_VERSION,
        "gpu": device_identity(params.device),
        "cudnn_version": int(params.cudnn_version),
        "engine": str(params.engine),
        "params": params_to_dict(params),
        "record": rec,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "pycudnn": __version__,
    }


def _params_key(params: Any) -> str:
    return entry_key({"schema": SCHEMA_VERSION, "gpu": device_identity(params.device),
                      "cudnn_version": int(params.cudnn_version), "engine": str(params.engine),
                      "params": params_to_dict(params), "record": {}})


# ---- the file ---------------------------------------------------------------------------------------

class _Corrupt(Exception):
    """The file exists but is not a tuning database document (moved aside, never read)."""


class _Refused(Exception):
    """The directory or file is not safely this user's: the database is off for the process."""


#: digits of the longest integer a document may hold (int64 needs 19 and a sign); Python's own
#: limit (4300) can be lifted process-wide by other libraries, so the file's is set here
_MAX_INT_DIGITS = 24


def _bounded_int(text: str) -> int:
    if len(text) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


#: deepest nesting of arrays and objects a document may have (a valid one has 5); whether JSON
#: nested deeper parses at all depends on the Python version (3.11 raises RecursionError, 3.12
#: does not), so the file's own limit is checked after parsing
_MAX_DEPTH = 32


def _too_deep(doc: Any) -> bool:
    """Whether arrays and objects nest deeper than ``_MAX_DEPTH`` in ``doc`` (no recursion)."""
    level = [doc] if isinstance(doc, (list, dict)) else []
    for _ in range(_MAX_DEPTH):  # after k rounds: the containers k levels inside the document
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v)
                 if isinstance(c, (list, dict))]
        if not level:
            return False
    return True


def _parse(text: str | bytes, where: str) -> tuple[dict[str, dict[str, Any]], int]:
    """(key -> checked entry, number of entries dropped); _Corrupt when the document is broken."""
    try:
        doc = json.loads(text, parse_int=_bounded_int)
        if _too_deep(doc):
            raise ValueError(f"nested more than {_MAX_DEPTH} deep")
    except (ValueError, RecursionError, MemoryError) as exc:  # ValueError: JSON, UTF-8, int digits
        raise _Corrupt(f"not JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if (not isinstance(doc, dict) or doc.get("format") != _FORMAT
            or doc.get("version") != _FORMAT_VERSION or not isinstance(doc.get("entries"), list)):
        raise _Corrupt(f"not a version-{_FORMAT_VERSION} {_FORMAT} document")
    out: dict[str, dict[str, Any]] = {}
    dropped = 0
    for i, entry in enumerate(doc["entries"]):
        try:
            key, checked = _validate_entry(entry)
        except (KeyError, TypeError, ValueError, RecursionError, OverflowError) as exc:
            dropped += 1
            if dropped <= _LOG_DROPPED:
                log.warning("tuning database %s: dropping entry %d (%s: %s)", where, i,
                            type(exc).__name__, exc)
            continue
        out[key] = checked
    if dropped > _LOG_DROPPED:
        log.warning("tuning database %s: dropped %d unusable entries in all", where, dropped)
    return out, dropped


def _document(entries_: Iterable[dict[str, Any]]) -> str:
    lines = [json.dumps(e, sort_keys=True, separators=(",", ":"), allow_nan=False) for e in entries_]
    head = json.dumps({"format": _FORMAT, "version": _FORMAT_VERSION})[:-1]
    return head + ', "entries": [\n' + ",\n".join(lines) + ("\n" if lines else "") + "]}\n"


_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_O_SAFE = getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _check_ownership(st: os.stat_result, what: str) -> None:
    """_Refused unless ``st`` belongs to this user and neither group nor others may write it."""
    uid = os.geteuid()
    if st.st_uid != uid:
        raise _Refused(f"{what} belongs to uid {st.st_uid}, not to this user (uid {uid})")
    if st.st_mode & 0o022:
        raise _Refused(f"{what} is writable by group or others (mode "
                       f"{stat.S_IMODE(st.st_mode):04o})")


@contextlib.contextmanager
def _directory(file: str, create: bool) -> Iterator[int | None]:
    """A descriptor of ``file``'s directory once it is checked (created 0700 when ``create``);
    None when it does not exist and ``create`` is false. Later opens go through it, so the
    directory cannot be swapped after the check."""
    directory = os.path.dirname(file) or "."
    if create:
        parent = os.path.dirname(directory)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
    try:
        fd = os.open(directory, _O_DIR)
    except (FileNotFoundError, NotADirectoryError):  # missing, or a component is a file
        if create:
            raise
        yield None
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise _Refused(f"{directory} is not a directory")
        _check_ownership(st, f"the directory {directory}")
        yield fd
    finally:
        os.close(fd)


def _open_regular(name: str, dir_fd: int | None, what: str) -> tuple[int, os.stat_result]:
    """(fd, fstat) of a regular file opened for reading without following a link or blocking.

    Raises:
        FileNotFoundError; _Corrupt for a link, FIFO, device, directory or an oversized file.
    """
    try:
        fd = os.open(name, os.O_RDONLY | _O_SAFE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Corrupt("it is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Corrupt("it is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise _Corrupt(f"{st.st_size} bytes, more than the {MAX_FILE_BYTES} a database may hold")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_fd(fd: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > MAX_FILE_BYTES:  # grew after the fstat
            raise _Corrupt(f"more than the {MAX_FILE_BYTES} bytes a database may hold")
        chunks.append(chunk)


def _signature(file: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(file, follow_symlinks=False)  # never opens it: a FIFO cannot block this
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read(file: str) -> tuple[str | None, tuple[int, int, int] | None]:
    """(text, signature) of the database ``file``; (None, None) when it does not exist.

    Raises:
        _Refused: the directory or file is not safely this user's.
        _Corrupt: not a regular file, too large, or not UTF-8.
        OSError: it cannot be read.
    """
    with _directory(file, create=False) as dfd:
        if dfd is None:
            return None, None
        try:
            fd, st = _open_regular(os.path.basename(file), dfd, file)
        except FileNotFoundError:
            return None, None
        try:
            _check_ownership(st, f"the file {file}")
            data = _read_fd(fd)
        finally:
            os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Corrupt(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    return text, (st.st_ino, st.st_mtime_ns, st.st_size)


def _write_db(file: str, text: str) -> None:
    """Replace the database ``file`` by ``text`` atomically, mode 0600 (through the checked
    directory's descriptor; the temporary file is created exclusively, never through a link)."""
    data = text.encode("utf-8")
    base = os.path.basename(file)
    with _directory(file, create=True) as dfd:
        assert dfd is not None
        tmp = f".{base}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_SAFE, 0o600, dir_fd=dfd)
        try:
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def _atomic_write(file: str, text: str) -> None:
    """Write ``text`` to a file the user named (an export) so that readers see the old or the new
    content, whole; a new file gets the usual mode (0644 less the umask)."""
    import tempfile

    directory = os.path.dirname(file) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(file) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = os.stat(file).st_mode & 0o777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o644 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _warn(msg: str) -> None:
    """A TuningDatabaseWarning attributed to the first caller outside this module."""
    import sys

    level = 2
    frame: Any = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    warnings.warn(msg, TuningDatabaseWarning, stacklevel=level)


def _set_aside(file: str, why: str) -> str | None:
    """Rename the unusable ``file`` to ``<file>.corrupt-<timestamp>`` (a rename never follows a
    link nor opens a FIFO) and warn once."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    base = os.path.basename(file)
    target: str | None = f"{file}.corrupt-{stamp}"
    try:
        with _directory(file, create=False) as dfd:
            if dfd is None:
                return None
            os.replace(base, f"{base}.corrupt-{stamp}", src_dir_fd=dfd, dst_dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        target = None
        msg = (f"pycudnn tuning database {file} is unusable ({why}) and could not be moved aside "
               f"({exc}); carrying on without its records")
    else:
        msg = (f"pycudnn tuning database {file} is unusable ({why}); moved it aside to {target} "
               f"and carrying on with an empty database")
    _warn(msg)
    return target


_thread_lock = threading.RLock()  # writers of this process (flock is per open file description)
#: database files refused for this process (path -> reason): one warning, then off
_refused: dict[str, str] = {}


def _after_fork_in_child() -> None:
    global _thread_lock
    _thread_lock = threading.RLock()  # a thread of the parent may have held it at fork time


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _refuse(file: str, why: str) -> None:
    """Turn the database ``file`` off for this process, with one warning."""
    with _thread_lock:
        if file in _refused:
            return
        _refused[file] = why
    _warn(f"pycudnn tuning database {file} refused: {why}; running without it in this process "
          f"(the directory must be this user's and writable by no one else)")


def refused() -> str | None:
    """Why the database file of this process was refused (its directory or file belongs to
    another user or is writable by others), or None when it is usable. A refused database is off
    for the rest of the process."""
    return _refused.get(path())


@contextlib.contextmanager
def _locked(file: str, timeout: float | None = None) -> Iterator[None]:
    """Exclusive lock between threads and processes on ``<file>.lock``."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: pycudnn supports Linux only
        raise OSError(errno.ENOSYS, "the tuning database needs fcntl file locks (Linux)") from None
    limit = LOCK_TIMEOUT_S if timeout is None else timeout
    with _thread_lock:
        with _directory(file, create=True) as dfd:
            lock_name = os.path.basename(file) + ".lock"
            try:
                fd = os.open(lock_name, os.O_RDWR | os.O_CREAT | _O_SAFE, 0o600, dir_fd=dfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _Refused(f"the lock file {file}.lock is a symbolic link") from None
                raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Refused(f"the lock file {file}.lock is not a regular file")
            _check_ownership(st, f"the lock file {file}.lock")
            deadline = time.monotonic() + limit
            delay = 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise
                    if time.monotonic() > deadline:
                        raise OSError(errno.ETIMEDOUT, f"timed out after {limit:.0f} s waiting for "
                                      f"the lock {file}.lock held by another process") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


# ---- the in-memory view -----------------------------------------------------------------------------

class _State:
    """This process's copy of one file: entries by key, the file signature they came from, and
    the keys already looked up again after a miss."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.entries: dict[str, dict[str, Any]] | None = None
        self.signature: tuple[int, int, int] | None = None
        self.refreshed: set[str] = set()


_states: dict[str, _State] = {}


def _state(file: str | None = None) -> _State:
    file = file or path()
    st = _states.get(file)
    if st is None:
        with _thread_lock:
            st = _states.setdefault(file, _State(file))
    return st


def _load_locked(st: _State) -> dict[str, dict[str, Any]]:
    """Read the file (holding the write lock): an unusable file is set aside here.

    Raises:
        _Refused, OSError: as `_read()`.
    """
    try:
        text, sig = _read(st.file)
        entries_ = {} if text is None else _parse(text, st.file)[0]
    except _Corrupt as exc:
        _set_aside(st.file, str(exc))
        entries_, sig = {}, None
    st.entries, st.signature = entries_, sig
    return entries_


def _load(st: _State) -> dict[str, dict[str, Any]]:
    """Read the file without the lock; only when it looks unusable take the lock to set it aside
    (another process may have replaced it meanwhile, so it is read again under the lock).

    Raises:
        _Refused: the directory or file is not safely this user's.
    """
    try:
        text, sig = _read(st.file)
        entries_ = {} if text is None else _parse(text, st.file)[0]
    except _Corrupt:
        try:
            with _locked(st.file):
                return _load_locked(st)
        except OSError as exc:
            log.warning("tuning database %s is unusable and could not be locked (%s); carrying on "
                        "without it", st.file, exc)
            st.entries, st.signature = {}, _signature(st.file)
            return st.entries
    except OSError as exc:  # unreadable (permissions, I/O): run without it, never fail a call
        log.warning("tuning database %s is unreadable (%s); carrying on without it", st.file, exc)
        st.entries, st.signature = {}, None
        return st.entries
    st.entries, st.signature = entries_, sig
    return entries_


def _write_locked(st: _State, entries_: dict[str, dict[str, Any]]) -> None:
    _write_db(st.file, _document(entries_.values()))
    st.entries, st.signature = entries_, _signature(st.file)


def forget() -> None:
    """Forget what this process holds in memory about the database: its copies of the files,
    the files it refused and the device identities it asked for; what a later process would see.
    Nothing on disk changes (`clear()` empties the file).

    For tests and tools that change the database directory or the GPU within one process.
    """
    with _thread_lock:
        _states.clear()
        _refused.clear()
    with _identity_lock:
        _identities.clear()


# ---- what the search calls --------------------------------------------------------------------------

def lookup(params: Any) -> dict | None:
    """The record stored for ``params`` by an earlier process (a copy of what the engine's
    ``serialize()`` returned, every field checked: see `validate_record()`), or None. Never
    raises: a database that cannot be read, or was refused, is a miss."""
    if not enabled():
        return None
    st = _state()
    try:
        key = _params_key(params)
        if st.file in _refused:
            return None
        # st.entries is replaced, never changed in place: a hit needs no lock
        entries_ = st.entries
        if entries_ is None:
            with _thread_lock:
                entries_ = st.entries if st.entries is not None else _load(st)
        entry = entries_.get(key)
        if entry is None and key not in st.refreshed:
            with _thread_lock:
                # another process may have stored it since this one read the file: look once more
                if len(st.refreshed) >= 8192:  # bounded: forgetting only costs another stat
                    st.refreshed.clear()
                st.refreshed.add(key)
                if _signature(st.file) != st.signature:
                    entry = _load(st).get(key)
    except _Refused as exc:
        _refuse(st.file, str(exc))
        return None
    except Exception as exc:  # noqa: BLE001 - a lookup must never fail a convolution
        log.warning("tuning database: lookup failed (%s: %s); searching instead",
                    type(exc).__name__, exc)
        return None
    if entry is None:
        return None
    return copy.deepcopy(entry["record"])


def store(params: Any, record: dict) -> None:
    """Keep ``record`` (what the engine's ``serialize()`` returned) for ``params``, replacing any
    earlier one, with the GPU's identity, a timestamp and pycudnn's version. A ``time_ms`` below
    zero (not measured) or not finite is left out. Never raises: a record that does not validate,
    a database that cannot be written (read-only or full disk, lock timeout) or was refused is
    logged and the call carries on."""
    if not enabled():
        return
    what = getattr(params, "short", lambda: params)
    try:
        key, entry = _validate_entry(_new_entry(params, record))
        _canonical(entry)  # refuse non-JSON data before touching the file
    except Exception as exc:  # noqa: BLE001
        log.warning("tuning database: not storing a record for %s (%s: %s)", what(),
                    type(exc).__name__, exc)
        drop(params)  # it was to replace the earlier record: that one is no longer the choice
        return
    st = _state()
    if st.file in _refused:
        return
    try:
        with _locked(st.file):
            entries_ = dict(_load_locked(st))
            entries_[key] = entry
            _write_locked(st, entries_)
    except _Refused as exc:
        _refuse(st.file, str(exc))
        return
    except Exception as exc:  # noqa: BLE001 - OSError mostly: never fail a convolution for it
        log.warning("tuning database: could not store a record in %s (%s: %s)", st.file,
                    type(exc).__name__, exc)
        return
    log.debug("tuning database: stored %s", what())


def drop(params: Any) -> None:
    """Forget the record for ``params`` (it no longer rebuilds or runs here). Never raises."""
    try:
        key = _params_key(params)
    except Exception as exc:  # noqa: BLE001
        log.warning("tuning database: cannot drop a record (%s: %s)", type(exc).__name__, exc)
        return
    st = _state()
    if st.file in _refused:
        return
    try:
        with _locked(st.file):
            entries_ = dict(_load_locked(st))
            if entries_.pop(key, None) is not None:
                _write_locked(st, entries_)
    except _Refused as exc:
        _refuse(st.file, str(exc))
    except Exception as exc:  # noqa: BLE001
        log.warning("tuning database: could not drop a record from %s (%s: %s)", st.file,
                    type(exc).__name__, exc)
        if st.entries is not None:
            st.entries = {k: v for k, v in st.entries.items() if k != key}


# ---- the public API ---------------------------------------------------------------------------------

def entries(*, set_aside: bool = True) -> list[dict[str, Any]]:
    """Every valid entry of the database file (fresh from disk, copies; empty when there is none
    or the database was refused). Entries that do not validate are left out and logged.

    Args:
        set_aside: False makes it a reading only (``pycudnn cache show``, ``pycudnn info``): no
            lock file is made and nothing on disk changes; a file unusable as a whole (not
            JSON, say) gives a TuningDatabaseWarning and no entries, and stays where it is.
            True: such a file is set aside, as every other function of this module does.
    """
    st = _state()
    if st.file in _refused:
        return []
    try:
        with _thread_lock:
            if set_aside:
                return [copy.deepcopy(e) for e in _load(st).values()]
            try:
                text, _ = _read(st.file)
                found = {} if text is None else _parse(text, st.file)[0]
            except _Corrupt as exc:
                _warn(f"pycudnn tuning database {st.file} is unusable ({exc}); left as it is")
                return []
            except OSError as exc:
                log.warning("tuning database %s is unreadable (%s)", st.file, exc)
                return []
            return [copy.deepcopy(e) for e in found.values()]
    except _Refused as exc:
        _refuse(st.file, str(exc))
        return []


def _check_not_refused(st: _State) -> None:
    why = _refused.get(st.file)
    if why is not None:
        raise PermissionError(errno.EACCES, f"the tuning database {st.file} was refused: {why}")


def clear() -> int:
    """Remove every record (the file stays, empty); returns how many there were. An unusable
    file is moved aside first.

    Raises:
        PermissionError: the database was refused (its directory or file is another user's or
            writable by others); nothing was changed.
        OSError: the file could not be written.
    """
    st = _state()
    _check_not_refused(st)
    try:
        with _locked(st.file):
            entries_ = _load_locked(st)
            n = len(entries_)
            if n or _signature(st.file) is not None:
                _write_locked(st, {})
            st.refreshed.clear()
    except _Refused as exc:
        _refuse(st.file, str(exc))
        _check_not_refused(st)
    return n


def export(file: str | os.PathLike) -> int:
    """Write the database to ``file`` (same JSON format, atomically); returns the entry count.

    Ship the file with a program and [`merge()`][pycudnn.search.tuning_db.merge] it on the target machines.

    Raises:
        PermissionError: the database was refused.
        OSError: ``file`` could not be written.
    """
    st = _state()
    _check_not_refused(st)
    with _thread_lock:
        try:
            entries_ = _load(st)
        except _Refused as exc:
            _refuse(st.file, str(exc))
            _check_not_refused(st)
        _atomic_write(os.fspath(file), _document(entries_.values()))
        return len(entries_)


@dataclasses.dataclass(frozen=True)
class MergeReport:
    """What [`import_file()`][pycudnn.search.tuning_db.import_file] did with the entries of a file."""

    #: keys this database did not have
    added: int = 0
    #: local records replaced (only with ``prefer="imported"``)
    replaced: int = 0
    #: keys both had: the local record was kept (or was the same)
    kept: int = 0
    #: entries that did not validate (logged one by one, then counted)
    refused: int = 0

    @property
    def merged(self) -> int:
        return self.added + self.replaced


def _read_import(file: str) -> str:
    """The text of a file to import (the user named it: a link is followed, but a FIFO or device
    is never opened for blocking reads and the size is capped)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise ValueError(f"{file} is not a pycudnn tuning database: it is a directory") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{file} is not a pycudnn tuning database: not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{file} is not a pycudnn tuning database: {st.st_size} bytes, more "
                             f"than {MAX_FILE_BYTES}")
        try:
            data = _read_fd(fd)
        except _Corrupt as exc:
            raise ValueError(f"{file} is not a pycudnn tuning database: {exc}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{file} is not a pycudnn tuning database: not UTF-8") from None


def read_file(file: str | os.PathLike) -> list[dict[str, Any]]:
    """The valid entries of a database file such as an export (copies; nothing is changed, here
    or in this database).

    ``file`` is read as [`import_file()`][pycudnn.search.tuning_db.import_file] reads it (a FIFO or device
    is never opened for blocking reads, the size is capped at `MAX_FILE_BYTES`) and every entry is
    validated as when the database is read: entries that do not validate are left out, logged one by
    one and counted in one [`TuningDatabaseWarning`][pycudnn.search.tuning_db.TuningDatabaseWarning]. No
    entry, however odd, makes this raise.

    Raises:
        FileNotFoundError: ``file`` does not exist.
        ValueError: ``file`` is not a tuning database (not JSON, another format, not a regular
            file, too large, not UTF-8).
    """
    file = os.fspath(file)
    try:
        incoming, refused_n = _parse(_read_import(file), file)
    except _Corrupt as exc:
        raise ValueError(f"{file} is not a pycudnn tuning database: {exc}") from None
    if refused_n:
        _warn(f"{file}: left out {refused_n} entr{'y' if refused_n == 1 else 'ies'} that did not "
              f"validate (see the log)")
    return list(incoming.values())


def import_file(file: str | os.PathLike, *, prefer: str = "local") -> MergeReport:
    """Add the records of an exported ``file`` to this database.

    Every entry is validated as when the database is read; those that do not validate are
    refused (logged, counted). For a key this database already holds, the local record is kept:
    a record from elsewhere never replaces one measured here (its ``time_ms`` was measured on
    another machine, or made up), unless ``prefer="imported"``.

    Raises:
        FileNotFoundError: ``file`` does not exist.
        ValueError: ``file`` is not a tuning database (it is left untouched), or ``prefer`` is
            neither "local" nor "imported".
        PermissionError: this database was refused.
        OSError: this database could not be written.
    """
    if prefer not in ("local", "imported"):
        raise ValueError(f"prefer: expected 'local' or 'imported', got {prefer!r}")
    file = os.fspath(file)
    try:
        incoming, refused_n = _parse(_read_import(file), file)
    except _Corrupt as exc:
        raise ValueError(f"{file} is not a pycudnn tuning database: {exc}") from None
    st = _state()
    _check_not_refused(st)
    added = replaced = kept = 0
    try:
        with _locked(st.file):
            entries_ = dict(_load_locked(st))
            for key, entry in incoming.items():
                old = entries_.get(key)
                if old is None:
                    added += 1
                elif prefer == "imported" and old["record"] != entry["record"]:
                    replaced += 1
                else:
                    kept += 1
                    continue
                entries_[key] = entry
            if added or replaced:
                _write_locked(st, entries_)
            st.refreshed.clear()
    except _Refused as exc:
        _refuse(st.file, str(exc))
        _check_not_refused(st)
    if refused_n:
        _warn(f"{file}: refused {refused_n} entr{'y' if refused_n == 1 else 'ies'} that did not "
              f"validate (see the log)")
    return MergeReport(added, replaced, kept, refused_n)


def merge(file: str | os.PathLike, *, prefer: str = "local") -> int:
    """Add the records of an exported ``file`` to this database; returns how many were added or
    replaced. See [`import_file()`][pycudnn.search.tuning_db.import_file] (local records win unless
    ``prefer="imported"``)."""
    return import_file(file, prefer=prefer).merged
