"""The persistent tuning database: measured choices that survive the process.

Every choice measured with ``benchmark=True`` is written here (by `pycudnn.search.iterate`,
through `store()`) and read back on the first use of the same key in a later process
(`lookup()`), which then skips the search; a record that does not rebuild is dropped by the
caller (`drop()`). The key holds the GPU's identity (name, compute capability, SM count; never
the ordinal, which ``CUDA_VISIBLE_DEVICES`` changes), the cuDNN version, the record schema, the
engine and the `ConvolutionParams`. The file is JSON, one entry a line, data only (never pickle).

A file is untrusted input: every entry is checked when it is read, imported or written, one that
does not check is dropped with a log line, a file that does not parse is set aside, and no public
function here raises because of what a file contains. Readers take no lock; writers replace the
file atomically under an ``flock``. This module is the database (where it is, on or off, this
process's copy, lookup, store, drop, listing, clearing, import, export); `pycudnn.tuning.records`
checks entries and `pycudnn.tuning.files` opens, locks and replaces files.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import logging
import os
import threading
from typing import Any, Callable

from ..configuration import config
from ..runtime.memory import device_identity as _device_identity
from .files import (RefusedFile, atomic_write, file_signature, locked, move_aside, process_lock,
                           read_database, read_import, warn, write_database)
from .records import (CorruptFile, canonical_json, document_from_lines, document_text, new_entry,
                      params_key, parse_document, validate_entry)

__all__ = ["enabled", "lookup", "store", "drop", "path", "cache_dir", "entries", "clear", "export",
           "merge", "import_file", "read_file", "MergeReport", "refused", "forget", "device_identity",
           "FILE_NAME"]

log = logging.getLogger("pycudnn")

#: the file's layout version is in its name: a later layout uses a new file, never this one
FILE_NAME = "tuning-db-v1.json"


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


_identity_lock = threading.Lock()
_identities: dict[int, dict[str, Any]] = {}


def device_identity(device: int) -> dict[str, Any]:
    """``{"name", "compute_capability", "sm_count"}`` of CUDA device ``device``, asked of the
    driver once per device (`pycudnn.runtime.memory.device_identity`; only called once a GPU
    has run a convolution).

    Raises:
        pycudnn.NoDeviceError, pycudnn.runtime.memory.CudaError: the driver could not answer.
    """
    ident = _identities.get(device)
    if ident is not None:
        return ident
    ident = _device_identity(device)
    with _identity_lock:
        _identities[device] = ident
    return ident


#: database files refused for this process (path -> reason): one warning, then off
_refused: dict[str, str] = {}


def _refuse(file: str, why: str) -> None:
    """Turn the database ``file`` off for this process, with one warning."""
    with process_lock():
        if file in _refused:
            return
        _refused[file] = why
    warn(f"pycudnn tuning database {file} refused: {why}; running without it in this process "
          f"(the directory must be this user's and writable by no one else)")


def refused() -> str | None:
    """Why the database file of this process was refused (its directory or file belongs to
    another user or is writable by others), or None when it is usable. A refused database is off
    for the rest of the process."""
    return _refused.get(path())


class _State:
    """This process's copy of one file: entries by key, the file signature they came from, and
    the keys already looked up again after a miss.

    ``exact`` says that ``entries`` are the content of the file whose signature is
    ``signature`` (read and checked, or written, by this process; None: no file), not a stand-in
    for a file that could not be read: a writer holding the lock then re-reads the file only
    when its signature is another, so a store costs one write, not a read and a check of every
    entry as well. ``lines`` keeps each entry's line as written (with the entry it was made
    from)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.entries: dict[str, dict[str, Any]] | None = None
        self.signature: tuple[int, int, int] | None = None
        self.exact = False
        self.lines: dict[str, tuple[dict[str, Any], str]] = {}
        self.refreshed: set[str] = set()


_states: dict[str, _State] = {}


def _state(file: str | None = None) -> _State:
    file = file or path()
    st = _states.get(file)
    if st is None:
        with process_lock():
            st = _states.setdefault(file, _State(file))
    return st


def _load_locked(st: _State) -> dict[str, dict[str, Any]]:
    """Read the file (holding the write lock): an unusable file is set aside here.

    Raises:
        RefusedFile, OSError: as `read_database()`.
    """
    if st.entries is not None and st.exact and file_signature(st.file) == st.signature:
        return st.entries  # the file is still the one read or written last: nothing to check
    try:
        text, sig = read_database(st.file)
        entries_ = {} if text is None else parse_document(text, st.file)[0]
    except CorruptFile as exc:
        move_aside(st.file, str(exc))
        entries_, sig = {}, None
    st.entries, st.signature, st.exact = entries_, sig, True
    return entries_


def _load(st: _State) -> dict[str, dict[str, Any]]:
    """Read the file without the lock; only when it looks unusable take the lock to set it aside
    (another process may have replaced it meanwhile, so it is read again under the lock).

    Raises:
        RefusedFile: the directory or file is not safely this user's.
    """
    try:
        text, sig = read_database(st.file)
        entries_ = {} if text is None else parse_document(text, st.file)[0]
    except CorruptFile:
        try:
            with locked(st.file):
                return _load_locked(st)
        except OSError as exc:
            log.warning("tuning database %s is unusable and could not be locked (%s); carrying on "
                        "without it", st.file, exc)
            st.entries, st.signature, st.exact = {}, file_signature(st.file), False
            return st.entries
    except OSError as exc:  # unreadable (permissions, I/O): run without it, never fail a call
        log.warning("tuning database %s is unreadable (%s); carrying on without it", st.file, exc)
        st.entries, st.signature, st.exact = {}, None, False
        return st.entries
    st.entries, st.signature, st.exact = entries_, sig, True
    return entries_


def _write_locked(st: _State, entries_: dict[str, dict[str, Any]]) -> None:
    # entries are replaced, never changed in place: a line made from the same object still holds
    made = st.lines
    lines: dict[str, tuple[dict[str, Any], str]] = {}
    for key, entry in entries_.items():
        known = made.get(key)
        lines[key] = known if known is not None and known[0] is entry else (entry, canonical_json(entry))
    st.exact = False  # until the write is known to have happened
    write_database(st.file, document_from_lines([line for _, line in lines.values()]))
    st.entries, st.signature, st.lines = entries_, file_signature(st.file), lines
    st.exact = True


def _edit(st: _State, change: Callable[[dict[str, dict[str, Any]]], bool]) -> None:
    """Under the write lock: ``change`` edits a copy of the file's entries and returns whether it
    changed them; changed entries are written back.

    Raises:
        RefusedFile, OSError: as `files.locked` and `_load_locked`.
    """
    with locked(st.file):
        entries_ = dict(_load_locked(st))
        if change(entries_):
            _write_locked(st, entries_)


def forget() -> None:
    """Forget what this process holds in memory about the database: its copies of the files,
    the files it refused and the device identities it asked for; what a later process would see.
    Nothing on disk changes (`clear()` empties the file).

    For tests and tools that change the database directory or the GPU within one process.
    """
    with process_lock():
        _states.clear()
        _refused.clear()
    with _identity_lock:
        _identities.clear()


def lookup(params: Any) -> dict | None:
    """The record stored for ``params`` by an earlier process (a copy of what the engine's
    ``serialize()`` returned, every field checked: see `validate_record()`), or None. Never
    raises: a database that cannot be read, or was refused, is a miss."""
    if not enabled():
        return None
    st = _state()
    try:
        key = params_key(params, device_identity(params.device))
        if st.file in _refused:
            return None
        # st.entries is replaced, never changed in place: a hit needs no lock
        entries_ = st.entries
        if entries_ is None:
            with process_lock():
                entries_ = st.entries if st.entries is not None else _load(st)
        entry = entries_.get(key)
        if entry is None and key not in st.refreshed:
            with process_lock():
                # another process may have stored it since this one read the file: look once more
                if len(st.refreshed) >= 8192:  # bounded: forgetting only costs another stat
                    st.refreshed.clear()
                st.refreshed.add(key)
                if file_signature(st.file) != st.signature:
                    entry = _load(st).get(key)
    except RefusedFile as exc:
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
        key, entry = validate_entry(new_entry(params, record, device_identity(params.device)))
        canonical_json(entry)  # refuse non-JSON data before touching the file
    except Exception as exc:  # noqa: BLE001
        log.warning("tuning database: not storing a record for %s (%s: %s)", what(),
                    type(exc).__name__, exc)
        drop(params)  # it was to replace the earlier record: that one is no longer the choice
        return
    st = _state()
    if st.file in _refused:
        return
    def put(entries_: dict[str, dict[str, Any]]) -> bool:
        entries_[key] = entry
        return True

    try:
        _edit(st, put)
    except RefusedFile as exc:
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
        key = params_key(params, device_identity(params.device))
    except Exception as exc:  # noqa: BLE001
        log.warning("tuning database: cannot drop a record (%s: %s)", type(exc).__name__, exc)
        return
    st = _state()
    if st.file in _refused:
        return
    try:
        _edit(st, lambda entries_: entries_.pop(key, None) is not None)
    except RefusedFile as exc:
        _refuse(st.file, str(exc))
    except Exception as exc:  # noqa: BLE001
        log.warning("tuning database: could not drop a record from %s (%s: %s)", st.file,
                    type(exc).__name__, exc)
        if st.entries is not None:
            st.entries = {k: v for k, v in st.entries.items() if k != key}
            st.exact = False  # no longer the file's content


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
        with process_lock():
            if set_aside:
                return [copy.deepcopy(e) for e in _load(st).values()]
            try:
                text, _ = read_database(st.file)
                found = {} if text is None else parse_document(text, st.file)[0]
            except CorruptFile as exc:
                warn(f"pycudnn tuning database {st.file} is unusable ({exc}); left as it is")
                return []
            except OSError as exc:
                log.warning("tuning database %s is unreadable (%s)", st.file, exc)
                return []
            return [copy.deepcopy(e) for e in found.values()]
    except RefusedFile as exc:
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
        with locked(st.file):
            entries_ = _load_locked(st)
            n = len(entries_)
            if n or file_signature(st.file) is not None:
                _write_locked(st, {})
            st.refreshed.clear()
    except RefusedFile as exc:
        _refuse(st.file, str(exc))
        _check_not_refused(st)
    return n


def export(file: str | os.PathLike) -> int:
    """Write the database to ``file`` (same JSON format, atomically); returns the entry count.

    Ship the file with a program and `merge()` it on the target machines.

    Raises:
        PermissionError: the database was refused.
        OSError: ``file`` could not be written.
    """
    st = _state()
    _check_not_refused(st)
    with process_lock():
        try:
            entries_ = _load(st)
        except RefusedFile as exc:
            _refuse(st.file, str(exc))
            _check_not_refused(st)
        atomic_write(os.fspath(file), document_text(entries_.values()))
        return len(entries_)


@dataclasses.dataclass(frozen=True)
class MergeReport:
    """What `import_file()` did with the entries of a file."""

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


def read_file(file: str | os.PathLike) -> list[dict[str, Any]]:
    """The valid entries of a database file such as an export (copies; nothing is changed, here
    or in this database).

    ``file`` is read as `import_file()` reads it (a FIFO or device
    is never opened for blocking reads, the size is capped at `MAX_FILE_BYTES`) and every entry is
    validated as when the database is read: entries that do not validate are left out, logged one by
    one and counted in one `TuningDatabaseWarning`. No
    entry, however odd, makes this raise.

    Raises:
        FileNotFoundError: ``file`` does not exist.
        ValueError: ``file`` is not a tuning database (not JSON, another format, not a regular
            file, too large, not UTF-8).
    """
    file = os.fspath(file)
    try:
        incoming, refused_n = parse_document(read_import(file), file)
    except CorruptFile as exc:
        raise ValueError(f"{file} is not a pycudnn tuning database: {exc}") from None
    if refused_n:
        warn(f"{file}: left out {refused_n} entr{'y' if refused_n == 1 else 'ies'} that did not "
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
        incoming, refused_n = parse_document(read_import(file), file)
    except CorruptFile as exc:
        raise ValueError(f"{file} is not a pycudnn tuning database: {exc}") from None
    st = _state()
    _check_not_refused(st)
    added = replaced = kept = 0
    try:
        with locked(st.file):
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
    except RefusedFile as exc:
        _refuse(st.file, str(exc))
        _check_not_refused(st)
    if refused_n:
        warn(f"{file}: refused {refused_n} entr{'y' if refused_n == 1 else 'ies'} that did not "
              f"validate (see the log)")
    return MergeReport(added, replaced, kept, refused_n)


def merge(file: str | os.PathLike, *, prefer: str = "local") -> int:
    """Add the records of an exported ``file`` to this database; returns how many were added or
    replaced. See `import_file()` (local records win unless
    ``prefer="imported"``)."""
    return import_file(file, prefer=prefer).merged
