"""Text for the terminal: numbers and byte counts, tables, a progress bar on stderr, untrusted
text made safe to print, and the check that an output file's directory exists.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from typing import Any, Sequence

from .errors import UsageError


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_number(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.split("\n", 1)[0] if text else type(exc).__name__


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[int] | None = None) -> str:
    right = right or set()
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for j, row in enumerate(cells):
        out.append("  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                             for i, c in enumerate(row)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


class Progress:
    """A progress bar on stderr: tqdm when importable, else plain ``\\r`` text (a line per step
    when stderr is not a terminal)."""

    def __init__(self, total: int, what: str, quiet: bool = False) -> None:
        self.total, self.what, self.quiet, self.n = total, what, quiet, 0
        self.tty = sys.stderr.isatty()
        self._bar = None
        self._width = 0
        if not quiet and importlib.util.find_spec("tqdm") is not None:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=what, file=sys.stderr, leave=False,
                                 dynamic_ncols=True)
            except Exception:  # noqa: BLE001
                self._bar = None

    def step(self, desc: str) -> None:
        """Announce the step about to run."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(desc, refresh=True)
            return
        text = f"{self.what} [{self.n + 1:>{len(str(self.total))}}/{self.total}] {desc}"
        if self.tty:
            pad = max(0, self._width - len(text))
            sys.stderr.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        """The announced step finished."""
        self.n += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.tty and not self.quiet and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()


def check_output_path(option: str, file: str | None) -> None:
    if file:
        parent = os.path.dirname(os.path.abspath(file))
        if not os.path.isdir(parent):
            raise UsageError(f"{option} {file}: directory {parent} does not exist")


def terminal_safe(value: Any) -> str:
    """Text of an untrusted value fit for a terminal: non-printable characters (escape sequences,
    control and bidirectional-override characters) are written as Python escapes."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
