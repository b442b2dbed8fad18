"""The tuning database's files, opened safely: a checked private directory, regular files opened
without following links or blocking, bounded reads, atomic replacement, an unusable file moved
aside, and the lock between writers (threads and processes).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import secrets
import stat
import threading
import time
import warnings
from typing import Any, Callable, Iterator

from ..errors import TuningDatabaseWarning
from .records import CorruptFile


#: a database or import file larger than this is not read (set aside as unusable)
MAX_FILE_BYTES = 64 << 20
#: seconds a writer waits for another process's lock before giving up (an OSError)
LOCK_TIMEOUT_S = 60.0


class RefusedFile(Exception):
    """The directory or file is not safely this user's: the database is off for the process."""


_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_O_SAFE = getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _check_ownership(st: os.stat_result, what: str) -> None:
    """RefusedFile unless ``st`` belongs to this user and neither group nor others may write it."""
    uid = os.geteuid()
    if st.st_uid != uid:
        raise RefusedFile(f"{what} belongs to uid {st.st_uid}, not to this user (uid {uid})")
    if st.st_mode & 0o022:
        raise RefusedFile(f"{what} is writable by group or others (mode "
                       f"{stat.S_IMODE(st.st_mode):04o})")


def _check_opened(fd: int, is_kind: Callable[[int], bool], wrong_kind: str, what: str) -> None:
    """RefusedFile (``wrong_kind`` its message) unless the open ``fd`` is of the kind ``is_kind``
    tests its mode for (``stat.S_ISDIR``, ...), and `_check_ownership` of it as ``what``."""
    st = os.fstat(fd)
    if not is_kind(st.st_mode):
        raise RefusedFile(wrong_kind)
    _check_ownership(st, what)


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
        _check_opened(fd, stat.S_ISDIR, f"{directory} is not a directory",
                      f"the directory {directory}")
        yield fd
    finally:
        os.close(fd)


def _open_regular(name: str, dir_fd: int | None, what: str) -> tuple[int, os.stat_result]:
    """(fd, fstat) of a regular file opened for reading without following a link or blocking.

    Raises:
        FileNotFoundError; CorruptFile for a link, FIFO, device, directory or an oversized file.
    """
    try:
        fd = os.open(name, os.O_RDONLY | _O_SAFE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptFile("it is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptFile("it is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise CorruptFile(f"{st.st_size} bytes, more than the {MAX_FILE_BYTES} a database may hold")
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
            raise CorruptFile(f"more than the {MAX_FILE_BYTES} bytes a database may hold")
        chunks.append(chunk)


def file_signature(file: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(file, follow_symlinks=False)  # never opens it: a FIFO cannot block this
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read_database(file: str) -> tuple[str | None, tuple[int, int, int] | None]:
    """(text, signature) of the database ``file``; (None, None) when it does not exist.

    Raises:
        RefusedFile: the directory or file is not safely this user's.
        CorruptFile: not a regular file, too large, or not UTF-8.
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
        raise CorruptFile(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    return text, (st.st_ino, st.st_mtime_ns, st.st_size)


def write_database(file: str, text: str) -> None:
    """Replace the database ``file`` by ``text`` atomically, mode 0600 (through the checked
    directory's descriptor; the temporary file is created exclusively, never through a link).

    Not synced to the disk: a store comes with every new shape a search measures, and an fsync
    was 0.3 ms of its 1.0 on the CPU machine; a file a crash left short is set aside when next
    read, as any unusable one is, and the searches are made again (a cache, as PyTorch's and
    Triton's on-disk caches are written)."""
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
            finally:
                os.close(fd)
            os.replace(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def atomic_write(file: str, text: str) -> None:
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


#: the tuning database's modules: a warning names the first caller outside them
_OWN_MODULES = (f"{__package__}.db", f"{__package__}.records", f"{__package__}.routes",
                __name__)


def warn(msg: str) -> None:
    """A TuningDatabaseWarning attributed to the first caller outside the tuning database."""
    import sys

    level = 2
    frame: Any = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _OWN_MODULES:
        frame, level = frame.f_back, level + 1
    warnings.warn(msg, TuningDatabaseWarning, stacklevel=level)


def move_aside(file: str, why: str, *, what: str = "pycudnn tuning database",
               empty: str = "an empty database") -> str | None:
    """Rename the unusable ``file`` to ``<file>.corrupt-<timestamp>`` (a rename never follows a
    link nor opens a FIFO) and warn once; the warning names the file as ``what`` and says the
    program carries on with ``empty``."""
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
        msg = (f"{what} {file} is unusable ({why}) and could not be moved aside "
               f"({exc}); carrying on without its records")
    else:
        msg = (f"{what} {file} is unusable ({why}); moved it aside to {target} "
               f"and carrying on with {empty}")
    warn(msg)
    return target


_thread_lock = threading.RLock()  # writers of this process (flock is per open file description)


def _after_fork_in_child() -> None:
    global _thread_lock
    _thread_lock = threading.RLock()  # a thread of the parent may have held it at fork time


def process_lock() -> threading.RLock:
    """The lock of this process's writers and readers of the in-memory copies (``with
    process_lock():``); renewed in a forked child."""
    return _thread_lock


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def locked(file: str, timeout: float | None = None) -> Iterator[None]:
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
                    raise RefusedFile(f"the lock file {file}.lock is a symbolic link") from None
                raise
        try:
            _check_opened(fd, stat.S_ISREG, f"the lock file {file}.lock is not a regular file",
                          f"the lock file {file}.lock")
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


def read_import(file: str) -> str:
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
        except CorruptFile as exc:
            raise ValueError(f"{file} is not a pycudnn tuning database: {exc}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{file} is not a pycudnn tuning database: not UTF-8") from None
