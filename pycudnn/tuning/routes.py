"""Routing decisions that survive the process: which library ran a convolution signature, on disk.

`pycudnn.torch.routing` times pycudnn's launch against PyTorch's convolution once per signature
and direction. The decision depends on the GPU, the two libraries' versions and PyTorch's flags,
not on the process, so it is kept beside the tuning database (``routes-v1.json`` in
`pycudnn.tuning.db.cache_dir()`) and the next process neither times the two sides again nor,
where PyTorch won, searches pycudnn's candidates. This module imports no PyTorch: ``pycudnn
cache`` reads it.

A key: the GPU's identity (name, compute capability, SM count), pycudnn's cuDNN version,
PyTorch's version and its cuDNN version, the signature, the direction, and PyTorch's TF32 and
determinism flags. The file is untrusted as the tuning database is (`pycudnn.tuning.files`
opens, locks and replaces it; each entry is checked when read). One process's decisions are
written together, a moment after the first and at exit, so a model's first step does not write
the file once per layer; ``PYCUDNN_TUNING_DB=0`` turns it off.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import threading
from typing import Any

from . import db as tuning_db
from .files import (
    RefusedFile,
    file_signature,
    locked,
    move_aside,
    process_lock,
    read_database,
    write_database,
)
from .records import (
    CorruptFile,
    canonical_json,
    checked_real,
    checked_text,
    document_text,
    parse_document,
    validate_gpu,
)

__all__ = ["FILE_NAME", "clear", "decision_key", "entries", "flush", "lookup", "path", "store"]

log = logging.getLogger("pycudnn")

FILE_NAME = "routes-v1.json"
_DOCUMENT = ("pycudnn-routes", 1)  # the file's format name and version
WINNERS = ("pycudnn", "torch")
_FIGURES = ("pycudnn_gpu_us", "torch_gpu_us", "pycudnn_call_us", "torch_call_us")
_KEY_FIELDS = {"gpu": dict, "cudnn": int, "torch": str, "torch_cudnn": int, "signature": str,
               "direction": str, "allow_tf32": bool, "deterministic": bool}
#: seconds between a process's first unwritten decision and the write
_WRITE_DELAY_S = 0.5

_lock = threading.Lock()
_entries: dict[str, dict[str, Any]] | None = None  # key -> entry, this process's copy
_loaded_from: str | None = None
_pending: dict[str, dict[str, Any]] = {}
_timer: threading.Timer | None = None
_refused: set[str] = set()


def path() -> str:
    """The file of this process's stored decisions (it may not exist yet)."""
    return os.path.join(tuning_db.cache_dir(), FILE_NAME)


def decision_key(signature: str, direction: str, device: int, allow_tf32: bool,
                 deterministic: bool, torch_version: str, torch_cudnn: int) -> dict[str, Any]:
    """The key of a decision for ``signature`` in ``direction`` on CUDA device ``device``, with
    PyTorch's version, its cuDNN version and its flags."""
    from ..ffi.library import version

    return {"gpu": tuning_db.device_identity(device), "cudnn": int(version()),
            "torch": str(torch_version), "torch_cudnn": int(torch_cudnn),
            "signature": signature, "direction": direction, "allow_tf32": bool(allow_tf32),
            "deterministic": bool(deterministic)}


def _checked(entry: Any) -> tuple[str, dict[str, Any]]:
    """(key text, a checked copy of ``entry``); TypeError or ValueError naming what is wrong."""
    if not isinstance(entry, dict):
        raise TypeError(f"expected an object, got {type(entry).__name__}")
    key = entry.get("key")
    if not isinstance(key, dict) or set(key) != set(_KEY_FIELDS):
        raise ValueError(f"key: expected the fields {sorted(_KEY_FIELDS)}")
    for name, kind in _KEY_FIELDS.items():
        if type(key[name]) is not kind:
            raise TypeError(f"key.{name}: expected {kind.__name__}, got {type(key[name]).__name__}")
    validate_gpu(key["gpu"])
    for name in ("signature", "torch", "direction"):
        checked_text(f"key.{name}", key[name], 512)
    if entry.get("winner") not in WINNERS:
        raise ValueError(f"winner: expected one of {list(WINNERS)}, got {str(entry.get('winner'))[:40]!r}")
    out: dict[str, Any] = {"key": json.loads(canonical_json(key)), "winner": entry["winner"],
           "reason": checked_text("reason", entry.get("reason", ""), 200)}
    for name in _FIGURES:
        out[name] = checked_real(name, entry.get(name), 0.0)
    if "created" in entry:
        out["created"] = checked_text("created", entry["created"], 64)
    unknown = set(entry) - set(out)
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(map(str, unknown))[:4]}")
    return canonical_json(out["key"]), out


def _read(file: str, set_aside: bool = True) -> dict[str, dict[str, Any]]:
    """The file's checked entries ({} when it is missing or unusable; an unusable one is set
    aside when ``set_aside``).

    Raises:
        RefusedFile: the directory or file is not safely this user's.
    """
    try:
        text, _ = read_database(file)
        if text is None:
            return {}
        return parse_document(text, file, document=_DOCUMENT, validate=_checked,
                              what="routing decisions")[0]
    except CorruptFile as exc:
        if set_aside:
            move_aside(file, str(exc))
        else:
            log.warning("routing decisions %s are unusable (%s)", file, exc)
    except OSError as exc:
        log.warning("routing decisions %s are unreadable (%s); carrying on without them", file, exc)
    return {}


def _usable() -> str | None:
    """The file of this process when the store is on and the file was not refused."""
    if not tuning_db.enabled():
        return None
    file = path()
    return None if file in _refused else file


def _refuse(file: str, exc: RefusedFile) -> None:
    _refused.add(file)
    log.warning("routing decisions %s refused (%s); not stored in this process", file, exc)


def lookup(key: dict[str, Any]) -> dict[str, Any] | None:
    """The decision stored for ``key`` (`decision_key`), checked, or None. Never raises."""
    global _entries, _loaded_from
    file = _usable()
    if file is None:
        return None
    try:
        k = canonical_json(key)
        with _lock:
            if k in _pending:
                return dict(_pending[k])
            if _entries is None or _loaded_from != file:
                _entries, _loaded_from = _read(file), file
            e = _entries.get(k)
    except RefusedFile as exc:
        _refuse(file, exc)
        return None
    except Exception as exc:  # noqa: BLE001 - a lookup must never fail a convolution
        log.warning("routing decisions: lookup failed (%s: %s)", type(exc).__name__, exc)
        return None
    return None if e is None else dict(e)


def store(key: dict[str, Any], winner: str, figures: dict[str, float], reason: str) -> None:
    """Keep a decision for ``key``: written with the others of this process a moment later (and
    at exit). Never raises: a decision that does not check is logged and not kept."""
    global _timer
    if _usable() is None:
        return
    try:
        entry = {"key": key, "winner": winner, "reason": reason[:200],
                 **{n: float(figures[n]) for n in _FIGURES},
                 "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        k, checked = _checked(entry)
    except Exception as exc:  # noqa: BLE001
        log.warning("routing decisions: not storing one (%s: %s)", type(exc).__name__, exc)
        return
    with _lock:
        _pending[k] = checked
        if _timer is None:
            _timer = threading.Timer(_WRITE_DELAY_S, flush)
            _timer.daemon = True
            _timer.start()


def flush() -> None:
    """Write this process's unwritten decisions now (merged into the file under its lock)."""
    global _timer, _entries, _loaded_from
    with _lock:
        pending = dict(_pending)
        _pending.clear()
        if _timer is not None:
            _timer.cancel()
            _timer = None
    file = _usable()
    if not pending or file is None:
        return
    try:
        with process_lock(), locked(file):
            current = _read(file)
            current.update(pending)
            write_database(file, document_text(current.values(), document=_DOCUMENT))
        with _lock:
            _entries, _loaded_from = current, file
    except RefusedFile as exc:
        _refuse(file, exc)
    except Exception as exc:  # noqa: BLE001 - OSError mostly (read-only disk, lock timeout)
        log.warning("routing decisions: could not write %s (%s: %s)", file, type(exc).__name__, exc)


def entries(*, set_aside: bool = True) -> list[dict[str, Any]]:
    """Every stored decision of this process's file, and its unwritten ones (copies); with
    ``set_aside=False`` an unusable file is only logged, not moved (a read-only listing)."""
    file = _usable()
    if file is None:
        return []
    try:
        found = _read(file, set_aside)
    except RefusedFile as exc:
        _refuse(file, exc)
        return []
    with _lock:
        found.update(_pending)
    return [dict(e) for e in found.values()]


def clear() -> int:
    """Remove every stored decision (the file and this process's copy); how many there were."""
    global _entries, _loaded_from
    with _lock:
        _pending.clear()
        _entries, _loaded_from = None, None
    file = path()
    if file_signature(file) is None:
        return 0
    try:
        with process_lock(), locked(file):
            n = len(_read(file))
            write_database(file, document_text((), document=_DOCUMENT))
    except RefusedFile as exc:
        _refuse(file, exc)
        return 0
    return n


def forget() -> None:
    """Forget this process's copy of the file (tests that change the cache directory)."""
    global _entries, _loaded_from
    with _lock:
        _entries, _loaded_from = None, None
        _refused.clear()


atexit.register(flush)
