"""Routing decisions that survive the process: which library ran a convolution signature, on disk.

`pycudnn.torch.routing` (this module needs no PyTorch: ``pycudnn cache`` reads it) times pycudnn's
launch against PyTorch's convolution once per signature and direction. The decision depends on the
GPU, the two libraries' versions and configuration, not on the process, so it is kept beside the
tuning database (``routes-v1.json`` in `pycudnn.tuning.db.cache_dir()`) and read back by
the next process, which then neither times the two sides again nor, where PyTorch won, searches
pycudnn's own candidates. A decision's key is in `decision_key`.

The file is untrusted input as the tuning database is (`pycudnn.tuning.files` opens, locks
and replaces it): each entry is checked when read; a file that does not parse is set aside (under
its lock, after a second read). A process's decisions are written together, a moment after the
first of them, merged into the file; they stay pending until written, and the exit waits for a
write under way. ``PYCUDNN_TUNING_DB=0`` (``pycudnn.config.tuning_db``) turns the store off.
"""

from __future__ import annotations

import atexit
import datetime
import errno
import json
import logging
import os
import threading
from typing import Any

from ..engines.registry import ENGINES
from . import db as tuning_db
from .files import (
    LOCK_TIMEOUT_S,
    RefusedFile,
    file_signature,
    locked,
    move_aside,
    process_lock,
    read_database,
    warn,
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
#: the file's format name and version; version 1's decisions came from a comparison that gave
#: PyTorch one of pycudnn's timings (fixed in f3f10bd), so such a file is set aside unread
DOCUMENT = ("pycudnn-routes", 2)
_WHAT = "pycudnn routing decisions file"  # how warnings name the file
WINNERS = ("pycudnn", "torch")
_FIGURES = ("pycudnn_gpu_us", "torch_gpu_us", "pycudnn_call_us", "torch_call_us")
_KEY_FIELDS = {"gpu": dict, "cudnn": int, "torch": str, "torch_cudnn": int, "signature": str,
               "direction": str, "allow_tf32": bool, "deterministic": bool}
#: fields of every key `decision_key` makes; a stored key without them (an older pycudnn's) is
#: kept in the file and never matches one of this pycudnn's
_KEY_FIELDS_ADDED = {"pycudnn": str, "config": dict, "cudnn_enabled": bool}
#: pycudnn's flags that change what its launch of a signature costs (the figures a decision
#: compares): the engine that runs it, and the search's bounds
_CONFIG_FLAGS = ("engine", "workspace_limit", "benchmark_limit")
#: seconds between a process's first unwritten decision and the write
WRITE_DELAY_S = 0.5
#: seconds the exit waits for a write under way in another thread (it may wait for the lock)
_EXIT_WAIT_S = LOCK_TIMEOUT_S + 10.0

_lock = threading.Lock()  # the in-memory state below
_write_lock = threading.Lock()  # one write at a time in this process; held for the whole write
_entries: dict[str, dict[str, Any]] | None = None  # key -> entry, this process's copy
_loaded_from: str | None = None
_pending: dict[str, dict[str, Any]] = {}  # key -> entry not yet written (removed once written)
_timer: threading.Timer | None = None
_refused: dict[str, str] = {}  # file -> why it was refused


def path() -> str:
    """The file of this process's stored decisions (it may not exist yet)."""
    return os.path.join(tuning_db.cache_dir(), FILE_NAME)


def decision_key(signature: str, direction: str, device: int, allow_tf32: bool,
                 deterministic: bool, torch_version: str, torch_cudnn: int, *,
                 cudnn_enabled: bool = True) -> dict[str, Any]:
    """The key of a decision for ``signature`` in ``direction`` on CUDA device ``device``: the
    GPU's identity (name, compute capability, SM count), pycudnn's version, its cuDNN version and
    its configuration in effect (engine, workspace_limit, benchmark_limit), PyTorch's version,
    its cuDNN version and its flags (allow_tf32, deterministic, ``torch.backends.cudnn.enabled``:
    off, PyTorch's side is its native kernel)."""
    from .._version import __version__
    from ..configuration import config
    from ..ffi.library import version

    flags = config.resolve({})
    return {"gpu": tuning_db.device_identity(device), "cudnn": int(version()),
            "pycudnn": __version__, "config": {n: flags[n] for n in _CONFIG_FLAGS},
            "torch": str(torch_version), "torch_cudnn": int(torch_cudnn),
            "cudnn_enabled": bool(cudnn_enabled), "signature": signature,
            "direction": direction, "allow_tf32": bool(allow_tf32),
            "deterministic": bool(deterministic)}


def _check_config(value: dict[str, Any]) -> None:
    if set(value) != set(_CONFIG_FLAGS):
        raise ValueError(f"key.config: expected the fields {sorted(_CONFIG_FLAGS)}")
    if value["engine"] not in ENGINES:
        raise ValueError(f"key.config.engine: expected one of {sorted(ENGINES)}, got "
                         f"{str(value['engine'])[:40]!r}")
    for name in ("workspace_limit", "benchmark_limit"):
        v = value[name]
        if v is not None and (type(v) is not int or v < 0):
            raise ValueError(f"key.config.{name}: expected None or a non-negative int, got "
                             f"{str(v)[:40]!r}")


def checked_entry(entry: Any) -> tuple[str, dict[str, Any]]:
    """(key text, a checked copy of ``entry``); TypeError or ValueError naming what is wrong.
    Public as a seam for tests and tooling."""
    if not isinstance(entry, dict):
        raise TypeError(f"expected an object, got {type(entry).__name__}")
    key = entry.get("key")
    if (not isinstance(key, dict) or not set(_KEY_FIELDS) <= set(key)
            or not set(key) <= set(_KEY_FIELDS) | set(_KEY_FIELDS_ADDED)):
        raise ValueError(f"key: expected the fields {sorted(_KEY_FIELDS)} and any of "
                         f"{sorted(_KEY_FIELDS_ADDED)}")
    for name, kind in {**_KEY_FIELDS, **_KEY_FIELDS_ADDED}.items():
        if name in key and type(key[name]) is not kind:
            raise TypeError(f"key.{name}: expected {kind.__name__}, got {type(key[name]).__name__}")
    validate_gpu(key["gpu"])
    if "config" in key:
        _check_config(key["config"])
    for name in ("signature", "torch", "direction", "pycudnn"):
        if name in key:
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


def _parse(file: str) -> dict[str, dict[str, Any]]:
    """The file's checked entries ({} when it is missing).

    Raises:
        RefusedFile: the directory or file is not safely this user's.
        CorruptFile: it does not parse (or is not a regular file, or is too large).
        OSError: it cannot be read.
    """
    text, _ = read_database(file)
    if text is None:
        return {}
    return parse_document(text, file, document=DOCUMENT, validate=checked_entry,
                          what="routing decisions")[0]


def _set_aside(file: str, why: str) -> None:
    move_aside(file, why, what=_WHAT, empty="no stored decisions")


def _read_locked(file: str) -> dict[str, dict[str, Any]]:
    """The file's checked entries, read holding its lock: an unusable file is set aside here.

    Raises:
        RefusedFile, OSError: as `_parse` (an unreadable file is not set aside: it may hold
            other processes' decisions).
    """
    try:
        return _parse(file)
    except CorruptFile as exc:
        _set_aside(file, str(exc))
        return {}


def _read(file: str) -> dict[str, dict[str, Any]]:
    """The file's checked entries without the lock; {} when it is missing or unusable. Only
    when it looks unusable is the lock taken and the file read again before it is set aside:
    another process may have replaced it meanwhile.

    Raises:
        RefusedFile: the directory or file is not safely this user's.
    """
    try:
        return _parse(file)
    except CorruptFile:
        try:
            with process_lock(), locked(file):
                return _read_locked(file)
        except RefusedFile:
            raise
        except OSError as exc:
            log.warning("routing decisions %s are unusable and could not be locked (%s); carrying "
                        "on without them", file, exc)
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
    with _lock:
        if file in _refused:
            return
        _refused[file] = str(exc)
    warn(f"{_WHAT} {file} refused: {exc}; decisions are not stored in this process (the directory "
         f"must be this user's and writable by no one else)")


def lookup(key: dict[str, Any]) -> dict[str, Any] | None:
    """The decision stored for ``key`` (`decision_key`), checked, or None. Never raises."""
    global _entries, _loaded_from
    file = _usable()
    if file is None:
        return None
    try:
        k = canonical_json(key)
        with _lock:
            e = _pending.get(k)
            if e is None and _entries is not None and _loaded_from == file:
                e = _entries.get(k)
                loaded = True
            else:
                loaded = e is not None
        if not loaded:  # read outside _lock: a read may wait for the file's lock
            found = _read(file)
            with _lock:
                if _entries is None or _loaded_from != file:
                    _entries, _loaded_from = found, file
                e = _pending.get(k) or _entries.get(k)
    except RefusedFile as exc:
        _refuse(file, exc)
        return None
    except Exception as exc:  # noqa: BLE001 - a lookup must never fail a convolution
        log.warning("routing decisions: lookup failed (%s: %s)", type(exc).__name__, exc)
        return None
    return None if e is None else dict(e)


def store(key: dict[str, Any], winner: str, figures: dict[str, float], reason: str) -> None:
    """Keep a decision for ``key``: written with the others of this process a moment later (and
    at exit). Never raises: a decision that does not check is logged and not kept; where no
    thread can start, the decisions wait for the next store or the exit."""
    global _timer
    if _usable() is None:
        return
    try:
        entry = {"key": key, "winner": winner, "reason": reason[:200],
                 **{n: float(figures[n]) for n in _FIGURES},
                 "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        k, checked = checked_entry(entry)
    except Exception as exc:  # noqa: BLE001
        log.warning("routing decisions: not storing one (%s: %s)", type(exc).__name__, exc)
        return
    with _lock:
        _pending[k] = checked
        if _timer is not None:
            return
        try:
            timer = threading.Timer(WRITE_DELAY_S, _flush_from_timer)
            timer.daemon = True
            timer.start()
        except Exception as exc:  # noqa: BLE001 - RuntimeError: a process at its thread limit
            log.warning("routing decisions: no thread to write them (%s: %s); written later",
                        type(exc).__name__, exc)
            return
        _timer = timer


def _flush_from_timer() -> None:
    global _timer
    with _lock:
        if _timer is threading.current_thread():
            _timer = None
    flush()


def flush(timeout: float | None = None) -> bool:
    """Write this process's unwritten decisions now, merged into the file under its lock; a
    write under way in another thread is waited for first (at most ``timeout`` seconds when
    given). Whether nothing is left unwritten. Never raises: a decision that could not be written
    (the file unreadable, the disk read-only, the lock held too long) stays pending, and the next
    flush writes it."""
    global _timer, _entries, _loaded_from
    if not _write_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
        log.warning("routing decisions: a write under way did not end within %.0f s", timeout)
        return False
    try:
        with _lock:
            pending = dict(_pending)
            if _timer is not None and _timer is not threading.current_thread():
                _timer.cancel()
                _timer = None
        file = _usable()
        if file is None:
            with _lock:
                _pending.clear()
            return True
        if not pending:
            return True
        try:
            with process_lock(), locked(file):
                current = _read_locked(file)  # OSError: nothing written, the file kept
                current.update(pending)
                write_database(file, document_text(current.values(), document=DOCUMENT))
        except RefusedFile as exc:
            _refuse(file, exc)
            with _lock:
                _pending.clear()
            return False
        except Exception as exc:  # noqa: BLE001 - OSError mostly (unreadable file, read-only disk, lock timeout)
            log.warning("routing decisions: could not write %s (%s: %s); %d kept for the next "
                        "write", file, type(exc).__name__, exc, len(pending))
            return False
        with _lock:
            for k, e in pending.items():
                if _pending.get(k) is e:  # a newer decision for k is written next time
                    del _pending[k]
            _entries, _loaded_from = current, file
            return not _pending
    finally:
        _write_lock.release()


def _flush_at_exit() -> None:
    flush(timeout=_EXIT_WAIT_S)


def entries(*, set_aside: bool = True) -> list[dict[str, Any]]:
    """Every stored decision of this process's file, and its unwritten ones (copies); with
    ``set_aside=False`` an unusable file is only named in a warning, not moved (a read-only
    listing)."""
    file = _usable()
    if file is None:
        return []
    try:
        if set_aside:
            found = _read(file)
        else:
            try:
                found = _parse(file)
            except CorruptFile as exc:
                warn(f"{_WHAT} {file} is unusable ({exc}); left as it is")
                found = {}
            except OSError as exc:
                log.warning("routing decisions %s are unreadable (%s)", file, exc)
                found = {}
    except RefusedFile as exc:
        _refuse(file, exc)
        return []
    with _lock:
        found.update(_pending)
    return [dict(e) for e in found.values()]


def refused() -> str | None:
    """Why this process's file of decisions was refused (its directory, file or lock file is
    another user's, open to others or not a regular file), or None when it was not."""
    return _refused.get(path())


def clear() -> int:
    """Remove every stored decision (the file stays, empty; an unusable one is set aside) and
    this process's unwritten ones; how many there were on disk.

    Raises:
        PermissionError: the file was refused (its directory, file or lock file is another
            user's, open to others or not a regular file); nothing on disk was changed.
        OSError: the file could not be read or written; nothing on disk was changed.
    """
    global _entries, _loaded_from
    with _write_lock:
        with _lock:
            _pending.clear()
            _entries, _loaded_from = None, None
        file = path()
        if file_signature(file) is None:
            return 0
        try:
            with process_lock(), locked(file):
                n = len(_read_locked(file))
                if file_signature(file) is not None:
                    write_database(file, document_text((), document=DOCUMENT))
        except RefusedFile as exc:
            _refuse(file, exc)
            raise PermissionError(errno.EACCES, f"the routing decisions file {file} was refused: "
                                  f"{exc}") from None
    return n


def forget() -> None:
    """Forget this process's copy of the file (tests that change the cache directory)."""
    global _entries, _loaded_from
    with _lock:
        _entries, _loaded_from = None, None
        _refused.clear()


def _after_fork_in_child() -> None:
    """A forked child starts with fresh locks (a parent's thread may have held one) and no
    timer (the parent's thread is not in the child); the decisions it inherited stay pending."""
    global _lock, _write_lock, _timer
    _lock = threading.Lock()
    _write_lock = threading.Lock()
    _timer = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_at_exit)
