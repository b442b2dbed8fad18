"""The ``pycudnn`` logger and the ``PYCUDNN_LOG`` environment variable.

pycudnn logs through the standard `logging` module under the logger named ``"pycudnn"``:
what was searched, what was chosen and why, fallbacks taken, the library that was loaded. Like
every library it attaches no handler of its own, so nothing is printed unless the application
configures logging (``logging.basicConfig(level=logging.DEBUG)`` or
``logging.getLogger("pycudnn").setLevel(...)``).

For users who cannot edit the program, ``PYCUDNN_LOG=debug`` (or ``info``, ``warning``,
``error``) makes ``import pycudnn`` attach one stderr handler at that level to the ``pycudnn``
logger. Only when the variable is set: otherwise this module is not even imported.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

__all__ = ["LOGGER_NAME", "ENV_VAR", "LEVELS", "configure", "handler", "remove_handler"]

LOGGER_NAME = "pycudnn"
ENV_VAR = "PYCUDNN_LOG"
#: accepted values of ``PYCUDNN_LOG`` (case-insensitive)
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}
_FORMAT = "pycudnn %(levelname)s %(asctime)s.%(msecs)03d [%(threadName)s] %(message)s"

_handler: logging.Handler | None = None


def handler() -> logging.Handler | None:
    """The stderr handler `configure()` attached, or None."""
    return _handler


def remove_handler() -> None:
    """Detach the handler `configure()` attached, if any (the logger's level stays). Users undo
    `configure()` with it, and tests end with the logger as they found it."""
    global _handler
    if _handler is not None:
        logging.getLogger(LOGGER_NAME).removeHandler(_handler)
    _handler = None


def configure(level: str | int | None = None, stream: TextIO | None = None) -> logging.Logger:
    """Attach a handler to the ``pycudnn`` logger at ``level`` (default: ``$PYCUDNN_LOG``).

    Calling it again replaces the handler it attached before (it never adds a second one).
    ``level`` ``None`` with ``PYCUDNN_LOG`` unset or empty changes nothing.

    Args:
        level: ``"debug"``, ``"info"``, ``"warning"``, ``"error"``, ``"critical"`` or a
            `logging` level number.
        stream: where to write (default: ``sys.stderr`` at the time of each record).

    Returns:
        The ``pycudnn`` logger.

    Raises:
        ValueError: an unknown level name.
    """
    global _handler
    logger = logging.getLogger(LOGGER_NAME)
    if level is None:
        level = os.environ.get(ENV_VAR, "").strip()
        if not level:
            return logger
    if isinstance(level, str):
        key = level.strip().lower()
        if key.isdigit():
            number = int(key)
        elif key in LEVELS:
            number = LEVELS[key]
        else:
            raise ValueError(f"{ENV_VAR}: unknown level {level!r}; expected one of "
                             "debug, info, warning, error, critical")
    else:
        number = int(level)
    new: logging.Handler = _StderrHandler() if stream is None else logging.StreamHandler(stream)
    new.setLevel(number)
    new.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    if _handler is not None:
        logger.removeHandler(_handler)
    logger.addHandler(new)
    _handler = new
    logger.setLevel(number)
    return logger


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (as the standard library's
    last-resort handler does), so redirecting stderr later still works."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr


def configure_from_env() -> None:
    """What ``import pycudnn`` calls when ``PYCUDNN_LOG`` is set: a bad value warns, never raises."""
    try:
        configure()
    except ValueError as exc:
        import warnings

        warnings.warn(str(exc), RuntimeWarning, stacklevel=3)
