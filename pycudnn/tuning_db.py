"""The persistent tuning database: measured choices that survive the process.

Every choice measured with ``benchmark=True`` is written here (by :mod:`pycudnn.algos`, through
:func:`store`) and read back on the first use of the same key in a later process
(:func:`lookup`), so that process skips the search. A record is applied only where it is valid:
the key holds the GPU's identity (name, compute capability, SM count), the cuDNN version,
pycudnn's record schema version, the engine, and every field of the
:class:`~pycudnn.algos.ConvolutionParams` except the device *ordinal*, which is replaced by the
device's identity (an ordinal depends on ``CUDA_VISIBLE_DEVICES``; two GPUs of one model share
their records). A record that no longer rebuilds is dropped by the caller (:func:`drop`).

**The file.** One JSON document, data only (never pickle: a database file cannot run code):

```
{"format": "pycudnn-tuning-db", "version": 1, "entries": [
{"schema": 1, "gpu": {...}, "cudnn_version": 92800, "engine": "graph", "params": {...},
 "record": {...}, "created": "...", "pycudnn": "0.1.0"},
...
]}
```

one entry a line, so files diff and merge well and a team can ship one with its program
(:func:`export`, :func:`merge`). ``record`` is what the engine's ``serialize()`` returned, kept
verbatim.

**Safety.** Readers take no lock: writers replace the file atomically (a temporary file in the
same directory, ``fsync``, ``os.replace``), so a reader sees the old or the new document, whole.
Writers (:func:`store`, :func:`drop`, :func:`clear`, :func:`merge`) hold an exclusive ``flock``
on ``<file>.lock`` (and a lock per process for threads) while they read the current file, change
it and replace it, so several processes and threads writing at once lose nothing. A file that
does not parse (corrupt, truncated, hand-edited) is moved aside to ``<file>.corrupt-<timestamp>``
with a warning and the program carries on with an empty database.

**Where.** ``$PYCUDNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pycudnn``, else ``~/.cache/pycudnn``;
the file is ``tuning-db-v1.json`` there. ``PYCUDNN_TUNING_DB=0`` or
``pycudnn.config.tuning_db = False`` (or ``pycudnn.flags(tuning_db=False)``) turns reading and
writing off.

**Cost.** The file is read once per process (per path); a miss re-reads it at most once per key,
and only when the file changed, so a record written meanwhile by another process is found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import math
import os
import tempfile
import threading
import time
import warnings
from typing import Any, Iterable, Iterator

__all__ = ["enabled", "lookup", "store", "drop", "path", "cache_dir", "entries", "clear", "export",
           "merge", "device_identity", "params_to_dict", "entry_key", "TuningDatabaseWarning",
           "SCHEMA_VERSION", "FILE_NAME"]

log = logging.getLogger("pycudnn")

#: version of what a record means; part of every key (bump when a record's meaning changes)
SCHEMA_VERSION = 1
#: the file's layout version is in its name: a later layout uses a new file, never this one
FILE_NAME = "tuning-db-v1.json"
_FORMAT = "pycudnn-tuning-db"
_FORMAT_VERSION = 1
#: seconds a writer waits for another process's lock before giving up (an OSError)
LOCK_TIMEOUT_S = 60.0
_REQUIRED = ("schema", "gpu", "cudnn_version", "engine", "params", "record")


class TuningDatabaseWarning(UserWarning):
    """A tuning database file was unusable (set aside) or held unusable entries."""


# ---- switches and location ------------------------------------------------------------------------

def enabled() -> bool:
    """Whether measured choices are read from and written to disk (``pycudnn.config.tuning_db``,
    which ``PYCUDNN_TUNING_DB=0`` turns off and ``pycudnn.flags(tuning_db=...)`` overrides)."""
    from .configuration import config

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
        pycudnn.NoDeviceError, pycudnn.memory.CudaError: the runtime could not answer.
    """
    ident = _identities.get(device)
    if ident is not None:
        return ident
    from cuda.bindings import runtime as rt

    from .memory import check_cuda

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
    """Every field of a :class:`~pycudnn.algos.ConvolutionParams` as JSON data (tuples as lists)."""
    return {f.name: _jsonable(getattr(params, f.name)) for f in dataclasses.fields(params)}


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


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
    from . import __version__

    p = params_to_dict(params)
    return {
        "schema": SCHEMA_VERSION,
        "gpu": device_identity(params.device),
        "cudnn_version": int(params.cudnn_version),
        "engine": str(params.engine),
        "params": p,
        "record": _jsonable(dict(record)),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "pycudnn": __version__,
    }


def _params_key(params: Any) -> str:
    return entry_key({"schema": SCHEMA_VERSION, "gpu": device_identity(params.device),
                      "cudnn_version": int(params.cudnn_version), "engine": str(params.engine),
                      "params": params_to_dict(params), "record": {}})


# ---- the file ---------------------------------------------------------------------------------------

class _Corrupt(Exception):
    """The file exists but is not a tuning database document."""


def _parse(text: str, where: str) -> tuple[dict[str, dict[str, Any]], int]:
    """(key -> entry, number of unusable entries skipped); _Corrupt when the document is broken."""
    try:
        doc = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError upstream
        raise _Corrupt(f"not JSON ({exc})") from None
    if (not isinstance(doc, dict) or doc.get("format") != _FORMAT
            or doc.get("version") != _FORMAT_VERSION or not isinstance(doc.get("entries"), list)):
        raise _Corrupt(f"not a version-{_FORMAT_VERSION} {_FORMAT} document")
    out: dict[str, dict[str, Any]] = {}
    skipped = 0
    for entry in doc["entries"]:
        try:
            if not isinstance(entry, dict) or any(k not in entry for k in _REQUIRED):
                raise KeyError("missing fields")
            key = entry_key(entry)
        except (KeyError, TypeError, ValueError):
            skipped += 1
            continue
        out[key] = entry
    if skipped:
        log.warning("tuning database %s: skipped %d unusable entr%s", where, skipped,
                    "y" if skipped == 1 else "ies")
    return out, skipped


def _document(entries_: Iterable[dict[str, Any]]) -> str:
    lines = [json.dumps(e, sort_keys=True, separators=(",", ":"), allow_nan=False) for e in entries_]
    head = json.dumps({"format": _FORMAT, "version": _FORMAT_VERSION})[:-1]
    return head + ', "entries": [\n' + ",\n".join(lines) + ("\n" if lines else "") + "]}\n"


def _signature(file: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(file)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read(file: str) -> tuple[str | None, tuple[int, int, int] | None]:
    """(text, signature) of ``file``; (None, None) when it does not exist."""
    try:
        with open(file, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
    except FileNotFoundError:
        return None, None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = "\0"  # parses as corrupt
    return text, (st.st_ino, st.st_mtime_ns, st.st_size)


def _atomic_write(file: str, text: str) -> None:
    """Write ``text`` to ``file`` so that readers see the old or the new content, whole."""
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
            mode = 0o644
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
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    target: str | None = f"{file}.corrupt-{stamp}"
    try:
        os.replace(file, str(target))
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


def _after_fork_in_child() -> None:
    global _thread_lock
    _thread_lock = threading.RLock()  # a thread of the parent may have held it at fork time


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def _locked(file: str, timeout: float | None = None) -> Iterator[None]:
    """Exclusive lock between threads and processes on ``<file>.lock``."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: pycudnn supports Linux only
        raise OSError(errno.ENOSYS, "the tuning database needs fcntl file locks (Linux)") from None
    limit = LOCK_TIMEOUT_S if timeout is None else timeout
    with _thread_lock:
        os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
        fd = os.open(file + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
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
    """Read the file (holding the write lock): a corrupt file is set aside here."""
    text, sig = _read(st.file)
    if text is None:
        entries_: dict[str, dict[str, Any]] = {}
    else:
        try:
            entries_, _ = _parse(text, st.file)
        except _Corrupt as exc:
            _set_aside(st.file, str(exc))
            entries_, sig = {}, None
    st.entries, st.signature = entries_, sig
    return entries_


def _load(st: _State) -> dict[str, dict[str, Any]]:
    """Read the file without the lock; only when it looks corrupt take the lock to set it aside
    (another process may have replaced it meanwhile, so it is read again under the lock)."""
    try:
        text, sig = _read(st.file)
    except OSError as exc:  # unreadable (permissions, I/O): run without it, never fail a convolution
        log.warning("tuning database %s is unreadable (%s); carrying on without it", st.file, exc)
        st.entries, st.signature = {}, None
        return st.entries
    if text is None:
        st.entries, st.signature = {}, None
        return st.entries
    try:
        entries_, _ = _parse(text, st.file)
    except _Corrupt:
        try:
            with _locked(st.file):
                return _load_locked(st)
        except OSError as exc:
            log.warning("tuning database %s is corrupt and could not be locked (%s); carrying on "
                        "without it", st.file, exc)
            st.entries, st.signature = {}, sig
            return st.entries
    st.entries, st.signature = entries_, sig
    return entries_


def _write_locked(st: _State, entries_: dict[str, dict[str, Any]]) -> None:
    _atomic_write(st.file, _document(entries_.values()))
    st.entries, st.signature = entries_, _signature(st.file)


def _reset_for_tests() -> None:
    """Forget every in-memory copy and device identity (tests change directories and GPUs)."""
    with _thread_lock:
        _states.clear()
    with _identity_lock:
        _identities.clear()


# ---- what the search calls --------------------------------------------------------------------------

def lookup(params: Any) -> dict | None:
    """The record stored for ``params`` by an earlier process (a copy of what the engine's
    ``serialize()`` returned), or None. Never raises: a database that cannot be read is a miss."""
    if not enabled():
        return None
    try:
        key = _params_key(params)
        st = _state()
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
    except Exception as exc:  # noqa: BLE001 - a lookup must never fail a convolution
        log.warning("tuning database: lookup failed (%s: %s); searching instead",
                    type(exc).__name__, exc)
        return None
    if entry is None:
        return None
    return dict(entry["record"])


def store(params: Any, record: dict) -> None:
    """Keep ``record`` (what the engine's ``serialize()`` returned) for ``params``, replacing any
    earlier one, with the GPU's identity, a timestamp and pycudnn's version.

    Raises:
        OSError: the file cannot be written (read-only or full disk, lock timeout); the caller
            logs it and carries on. Anything else is logged here and swallowed.
    """
    if not enabled():
        return
    try:
        entry = _new_entry(params, record)
        key = entry_key(entry)
        _canonical(entry)  # refuse non-JSON data before touching the file
    except Exception as exc:  # noqa: BLE001
        log.warning("tuning database: not storing a record for %s (%s: %s)",
                    getattr(params, "short", lambda: params)(), type(exc).__name__, exc)
        return
    st = _state()
    with _locked(st.file):
        entries_ = dict(_load_locked(st))
        entries_[key] = entry
        _write_locked(st, entries_)
    log.debug("tuning database: stored %s", getattr(params, "short", lambda: params)())


def drop(params: Any) -> None:
    """Forget the record for ``params`` (it no longer rebuilds or runs here)."""
    try:
        key = _params_key(params)
    except Exception as exc:  # noqa: BLE001
        log.warning("tuning database: cannot drop a record (%s: %s)", type(exc).__name__, exc)
        return
    st = _state()
    try:
        with _locked(st.file):
            entries_ = dict(_load_locked(st))
            if entries_.pop(key, None) is not None:
                _write_locked(st, entries_)
    except OSError as exc:
        log.warning("tuning database: could not drop a record from %s (%s)", st.file, exc)
        if st.entries is not None:
            st.entries = {k: v for k, v in st.entries.items() if k != key}


# ---- the public API ---------------------------------------------------------------------------------

def entries() -> list[dict[str, Any]]:
    """Every entry of the database file, as stored (fresh from disk; empty when there is none)."""
    st = _state()
    with _thread_lock:
        return [json.loads(json.dumps(e)) for e in _load(st).values()]


def clear() -> int:
    """Remove every record (the file stays, empty); returns how many there were."""
    st = _state()
    with _locked(st.file):
        entries_ = _load_locked(st)
        n = len(entries_)
        if n or os.path.exists(st.file):
            _write_locked(st, {})
        st.refreshed.clear()
    return n


def export(file: str | os.PathLike) -> int:
    """Write the database to ``file`` (same JSON format, atomically); returns the entry count.

    Ship the file with a program and :func:`merge` it on the target machines.
    """
    st = _state()
    with _thread_lock:
        entries_ = _load(st)
        _atomic_write(os.fspath(file), _document(entries_.values()))
        return len(entries_)


def _better(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether ``new`` should replace ``old`` for one key: the lower measured time wins."""
    def t(e: dict[str, Any]) -> float:
        v = e.get("record", {}).get("time_ms")
        return float(v) if isinstance(v, (int, float)) and v is not None and v >= 0 else math.inf
    return t(new) < t(old)


def merge(file: str | os.PathLike) -> int:
    """Add the records of an exported ``file`` to this database; returns how many were added or
    replaced. For a key present in both, the record with the lower measured time is kept.

    Raises:
        FileNotFoundError: ``file`` does not exist.
        ValueError: ``file`` is not a tuning database (it is left untouched).
    """
    file = os.fspath(file)
    with open(file, "rb") as f:
        data = f.read()
    try:
        incoming, skipped = _parse(data.decode("utf-8"), file)
    except (_Corrupt, UnicodeDecodeError) as exc:
        raise ValueError(f"{file} is not a pycudnn tuning database: {exc}") from None
    if skipped:
        _warn(f"{file}: skipped {skipped} unusable entries")
    st = _state()
    merged = 0
    with _locked(st.file):
        entries_ = dict(_load_locked(st))
        for key, entry in incoming.items():
            old = entries_.get(key)
            if old is None or _better(entry, old):
                entries_[key] = entry
                merged += 1
        if merged:
            _write_locked(st, entries_)
        st.refreshed.clear()
    return merged
