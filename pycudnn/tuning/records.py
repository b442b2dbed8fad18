"""What a tuning database entry is, checked: the key of a record (the parameters as data, the GPU's
identity, cuDNN, schema and engine), the strict validation of everything read from a file (a
file is untrusted input), and the JSON document (parsed with bounded nesting and integer size).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
from typing import Any, Callable, Iterable, Sequence

from .._version import __version__
from ..engines.problem import ConvolutionParams
from ..engines.registry import ENGINES, engine_for
from ..runtime.tensor.geometry import conv_output_size
from ..engines.stored import INT64_MAX as _INT64_MAX
from ..engines.stored import INT_MAX as _INT_MAX
from ..engines.stored import brief as _brief
from ..engines.stored import checked_bool as _bool
from ..engines.stored import checked_choice as _choice
from ..engines.stored import checked_int as _int
from ..engines.stored import checked_ints as _ints
from ..engines.stored import checked_real, checked_text

log = logging.getLogger("pycudnn")

#: version of what a record means; part of every key (bump when a record's meaning changes)
SCHEMA_VERSION = 1
_FORMAT = "pycudnn-tuning-db"
_FORMAT_VERSION = 1
_REQUIRED = ("schema", "gpu", "cudnn_version", "engine", "params", "record")
_OPTIONAL = ("created", "pycudnn")
#: log at most this many dropped entries one by one per read (then a count)
_LOG_DROPPED = 5


def jsonable(value: Any) -> Any:
    """Plain JSON data: tuples as lists, numpy scalars as Python ones, non-finite floats as None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return jsonable(value.item())
    raise TypeError(f"tuning database: {type(value).__name__} is not JSON data: {value!r}")


def params_to_dict(params: Any) -> dict[str, Any]:
    """Every field of a `ConvolutionParams` as JSON data (tuples
    as lists)."""
    out = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        # a tuple of plain ints (shapes, strides) is the common field: as a list without recursing
        if type(value) is tuple and all(type(v) is int for v in value):
            out[f.name] = list(value)
        else:
            out[f.name] = jsonable(value)
    return out


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


# The rules are those of a call (conv.py): a record whose parameters no call can produce is refused.
_DIRECTIONS = ("forward", "backward_data", "backward_filter")
_DTYPES = ("float32", "float16", "bfloat16", "float64")  # the names a call writes (numpy's)
_EPILOGUES = ("", "bias", "bias_relu", "add_relu")
_WEIGHT_FORMATS = ("NCHW", "NHWC")
_ALIGNMENTS = (1, 2, 4, 8, 16)


#: the fields of ConvolutionParams by name (read per stored entry)
_PARAMS_FIELDS = {f.name: f for f in dataclasses.fields(ConvolutionParams)}


def params_from_dict(data: Any, device: int) -> Any:
    """The `ConvolutionParams` of a database entry's ``params``
    (the inverse of `params_to_dict()`), on device ``device``, parsed as strictly as a call's
    arguments: every value must be one that a call can produce (canonical dtype names, known
    directions, engines and epilogues, ranks, sizes and a geometry that gives the stored output
    shape); the engine the params name checks what only its calls write (its epilogues,
    alignments, benchmark limit).

    Raises:
        TypeError, ValueError: a field is missing, unknown, of the wrong kind or out of range.
    """

    fields = _PARAMS_FIELDS
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
    spatial = conv_output_size(xs[2:], ws[2:], st, pad, dil)
    if any(o < 1 for o in spatial) or ys != (xs[0], ws[0]) + spatial:
        raise ValueError(f"params.output_shape: {list(ys)} is not the output of input {list(xs)} "
                         f"and weight {list(ws)} with padding {list(pad)}, stride {list(st)}, "
                         f"dilation {list(dil)}")
    v["deterministic"] = _bool("params.deterministic", d["deterministic"])
    v["allow_tf32"] = _bool("params.allow_tf32", d["allow_tf32"])
    wl = d["workspace_limit"]
    v["workspace_limit"] = None if wl is None else _int("params.workspace_limit", wl, 0)
    v["engine"] = eng = _choice("params.engine", d["engine"], tuple(sorted(ENGINES)))
    v["epilogue"] = ep = _choice("params.epilogue", d["epilogue"], _EPILOGUES)
    if ep and v["direction"] != "forward":
        raise ValueError(f"params.epilogue: {ep!r} exists for the forward direction only")
    zs = d["z_strides"]
    if (zs is not None) != (ep == "add_relu"):
        raise ValueError("params.z_strides: given exactly when the epilogue is 'add_relu'")
    v["z_strides"] = None if zs is None else _ints("params.z_strides", zs, rank, 0, _INT64_MAX)
    v["alpha"] = alpha = checked_real("params.alpha", d["alpha"])
    if ep != "add_relu" and alpha != 1.0:
        raise ValueError("params.alpha: other than 1.0 only with the 'add_relu' epilogue")
    al = d["alignments"]  # how many: the engine's rule (check_stored_params), below
    al = _ints("params.alignments", al, len(al) if isinstance(al, (list, tuple)) else 0, 1, 16)
    if any(a not in _ALIGNMENTS for a in al):
        raise ValueError(f"params.alignments: expected powers of two up to 16, got {list(al)}")
    v["alignments"] = al
    bl = d.get("benchmark_limit")
    v["benchmark_limit"] = None if bl is None else _int("params.benchmark_limit", bl, 0)
    unparsed = set(fields) - set(v)
    if unparsed:  # a field added to ConvolutionParams needs its rule here
        raise ValueError(f"params: no rule to read field(s) {sorted(unparsed)}")
    params = ConvolutionParams(**v)
    engine_for(eng).check_stored_params(params)  # what only this engine's calls write
    return params


def validate_record(record: Any, params: Any) -> dict[str, Any]:
    """A copy of ``record`` (what an engine's ``serialize()`` gave for ``params``) once every
    field has been checked by that engine (`Engine.check_stored`): exactly the fields it writes,
    each of its type and range (``time_ms``, when present, a finite number >= 0).

    Raises:
        TypeError, ValueError: naming the first field that is wrong.
    """
    return engine_for(params.engine).check_stored(record, params)


def validate_gpu(gpu: Any) -> dict[str, Any]:
    """A checked copy of a stored GPU identity (`tuning_db.device_identity`'s fields);
    ValueError naming what is wrong."""
    if not isinstance(gpu, dict) or set(gpu) != {"name", "compute_capability", "sm_count"}:
        raise ValueError(f"gpu: expected an object of name, compute_capability and sm_count, got "
                         f"{_brief(gpu)}")
    return {"name": checked_text("gpu.name", gpu["name"], 256),
            "compute_capability": list(_ints("gpu.compute_capability", gpu["compute_capability"],
                                             2, 0, 1000)),
            "sm_count": _int("gpu.sm_count", gpu["sm_count"], 0, 1 << 20)}


def validate_entry(entry: Any) -> tuple[str, dict[str, Any]]:
    """(key, a checked copy of ``entry``); TypeError or ValueError naming what is wrong.

    Entries of another schema version (written by another pycudnn) are kept, checked only for
    their outline: they never match a key of this version, and
    `pycudnn.preload()` skips them.
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
        key = canonical_json({"schema": schema, "gpu": entry["gpu"], "cudnn": entry["cudnn_version"],
                          "engine": entry["engine"], "params": params})
        return key, json.loads(canonical_json(entry))
    unknown = set(entry) - set(_REQUIRED) - set(_OPTIONAL)
    if unknown:
        raise ValueError(f"unknown field(s) {_brief(sorted(map(str, unknown)))}")
    raw = entry["params"]
    device = raw.get("device", 0) if isinstance(raw, dict) else 0
    p = params_from_dict(raw, device if type(device) is int and device >= 0 else 0)
    if _int("cudnn_version", entry["cudnn_version"], 1, _INT_MAX) != p.cudnn_version:
        raise ValueError(f"cudnn_version {entry['cudnn_version']} differs from the params' "
                         f"{p.cudnn_version}")
    if _choice("engine", entry["engine"], tuple(sorted(ENGINES))) != p.engine:
        raise ValueError(f"engine {entry['engine']!r} differs from the params' {p.engine!r}")
    out = {"schema": schema, "gpu": validate_gpu(entry["gpu"]),
           "cudnn_version": p.cudnn_version, "engine": p.engine, "params": params_to_dict(p),
           "record": validate_record(entry["record"], p)}
    for k in _OPTIONAL:
        if k in entry:
            out[k] = checked_text(k, entry[k], 64)
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
    return canonical_json({"schema": entry["schema"], "gpu": entry["gpu"],
                       "cudnn": entry["cudnn_version"], "engine": entry["engine"],
                       "params": params})


def new_entry(params: Any, record: dict[str, Any], gpu: dict[str, Any]) -> dict[str, Any]:
    """The entry that keeps ``record`` (what the engine's ``serialize()`` returned) for
    ``params`` measured on ``gpu`` (its identity), with a timestamp and pycudnn's version; a
    ``time_ms`` below zero (not measured) or not finite is left out."""
    rec = jsonable(dict(record))
    t = rec.get("time_ms", 0.0)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0:
        rec.pop("time_ms", None)  # not measured (-1) or not finite: the engines read it as -1
    return {
        "schema": SCHEMA_VERSION,
        "gpu": gpu,
        "cudnn_version": int(params.cudnn_version),
        "engine": str(params.engine),
        "params": params_to_dict(params),
        "record": rec,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "pycudnn": __version__,
    }


def params_key(params: Any, gpu: dict[str, Any]) -> str:
    """The key of the record for ``params`` on ``gpu`` (its identity), as `entry_key` gives it."""
    return entry_key({"schema": SCHEMA_VERSION, "gpu": gpu,
                      "cudnn_version": int(params.cudnn_version), "engine": str(params.engine),
                      "params": params_to_dict(params), "record": {}})


class CorruptFile(Exception):
    """The file exists but is not a tuning database document (moved aside, never read)."""


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


def parse_document(text: str | bytes, where: str, *, document: tuple[str, int] = (_FORMAT, _FORMAT_VERSION),
                   validate: Callable[[Any], tuple[str, dict[str, Any]]] = validate_entry,
                   what: str = "tuning database") -> tuple[dict[str, dict[str, Any]], int]:
    """(key -> checked entry, number of entries dropped) of a ``document`` (format name and
    version: the tuning database's unless told) whose entries ``validate`` checks (`validate_entry`
    unless told); CorruptFile when the document is broken. ``what`` names the file in the log."""
    fmt, version = document
    try:
        doc = json.loads(text, parse_int=_bounded_int)
        if _too_deep(doc):
            raise ValueError(f"nested more than {_MAX_DEPTH} deep")
    except (ValueError, RecursionError, MemoryError) as exc:  # ValueError: JSON, UTF-8, int digits
        raise CorruptFile(f"not JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if (not isinstance(doc, dict) or doc.get("format") != fmt
            or doc.get("version") != version or not isinstance(doc.get("entries"), list)):
        raise CorruptFile(f"not a version-{version} {fmt} document")
    out: dict[str, dict[str, Any]] = {}
    dropped = 0
    for i, entry in enumerate(doc["entries"]):
        try:
            key, checked = validate(entry)
        except (KeyError, TypeError, ValueError, RecursionError, OverflowError) as exc:
            dropped += 1
            if dropped <= _LOG_DROPPED:
                log.warning("%s %s: dropping entry %d (%s: %s)", what, where, i,
                            type(exc).__name__, exc)
            continue
        out[key] = checked
    if dropped > _LOG_DROPPED:
        log.warning("%s %s: dropped %d unusable entries in all", what, where, dropped)
    return out, dropped


def document_from_lines(lines: Sequence[str], *,
                        document: tuple[str, int] = (_FORMAT, _FORMAT_VERSION)) -> str:
    """The file text of entries already made lines by `canonical_json`, in a ``document``."""
    head = json.dumps({"format": document[0], "version": document[1]})[:-1]
    return head + ', "entries": [\n' + ",\n".join(lines) + ("\n" if lines else "") + "]}\n"


def document_text(entries_: Iterable[dict[str, Any]], *,
                  document: tuple[str, int] = (_FORMAT, _FORMAT_VERSION)) -> str:
    """The file text of ``entries_``: one entry a line, in a ``document`` (format name and
    version: the tuning database's unless told)."""
    return document_from_lines([canonical_json(e) for e in entries_], document=document)
