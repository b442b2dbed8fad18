"""Checks of values read back from a file (untrusted input), each error naming the field.

The tuning database checks its entries with these, and each engine checks its own stored record
with them (`pycudnn.engines.contract.Engine.check_stored`): a bool is never an integer, 1.0 is
never 1, text is bounded and printable unless told, and every failure is a TypeError or
ValueError naming the field.
"""

from __future__ import annotations

import math
from typing import Any, Callable

__all__ = ["INT_MAX", "INT64_MAX", "brief", "checked_int", "checked_ints", "checked_bool",
           "checked_choice", "checked_real", "checked_text", "checked_record"]

#: cuDNN takes sizes, padding, strides of the v7 API, groups as C ints
INT_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def brief(value: Any, limit: int = 60) -> str:
    """``repr`` of an untrusted value for a message: escaped and cut to ``limit`` characters."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a message must never fail
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def checked_int(name: str, v: Any, lo: int, hi: int = INT64_MAX) -> int:
    """``v`` when it is an int (not a bool) in ``[lo, hi]``."""
    if type(v) is not int:  # bool is not an int here, nor is 1.0
        raise TypeError(f"{name}: expected an integer, got {brief(v)}")
    if not lo <= v <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {v}")
    return v


def checked_ints(name: str, v: Any, length: int, lo: int, hi: int) -> tuple[int, ...]:
    """``v`` as a tuple when it is a list of ``length`` ints, each in ``[lo, hi]``."""
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{name}: expected a list of {length} integers, got {brief(v)}")
    if len(v) != length:
        raise ValueError(f"{name}: expected {length} values, got {len(v)}: {brief(v)}")
    if not all(type(i) is int for i in v):
        raise TypeError(f"{name}: {name} must hold integers, got {brief(v)}")
    if not all(lo <= i <= hi for i in v):
        raise ValueError(f"{name}: expected every value in [{lo}, {hi}], got {brief(v)}")
    return tuple(v)


def checked_bool(name: str, v: Any) -> bool:
    """``v`` when it is true or false."""
    if type(v) is not bool:
        raise TypeError(f"{name}: expected true or false, got {brief(v)}")
    return v


def checked_choice(name: str, v: Any, allowed: tuple[Any, ...]) -> Any:
    """``v`` when it is a string of ``allowed``."""
    if type(v) is not str or v not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, allowed))}, got {brief(v)}")
    return v


def checked_real(name: str, v: Any, lo: float | None = None) -> float:
    """``v`` as a float when it is a finite int or float (not a bool) of at least ``lo``;
    TypeError or ValueError naming ``name`` otherwise."""
    if type(v) not in (int, float):
        raise TypeError(f"{name}: expected a number, got {brief(v)}")
    f = float(v)
    if not math.isfinite(f) or (lo is not None and f < lo):
        raise ValueError(f"{name}: expected a finite number{'' if lo is None else f' >= {lo}'}, "
                         f"got {brief(v)}")
    return f


def checked_text(name: str, v: Any, limit: int, printable: bool = True) -> str:
    """``v`` when it is a string of at most ``limit`` characters, printable unless told;
    TypeError or ValueError naming ``name`` otherwise."""
    if type(v) is not str:
        raise TypeError(f"{name}: expected a string, got {brief(v)}")
    if len(v) > limit:
        raise ValueError(f"{name}: longer than {limit} characters")
    if printable and not v.isprintable():  # no control or escape characters: it gets displayed
        raise ValueError(f"{name}: holds non-printable characters: {brief(v)}")
    return v


def checked_record(record: Any, engine: str,
                   checks: dict[str, tuple[bool, Callable[[Any], Any]]]) -> dict[str, Any]:
    """The checked fields of a stored ``record`` of ``engine``: ``checks`` maps each field the
    engine writes to (required, check); a field not listed refuses the record, as does a
    required one missing. ``time_ms``, when present, is a finite number >= 0 for every engine."""
    if not isinstance(record, dict):
        raise TypeError(f"record: expected an object, got {type(record).__name__}")
    checks = dict(checks)
    checks["time_ms"] = (False, lambda v: checked_real("record.time_ms", v, 0.0))
    unknown = set(record) - set(checks)
    if unknown:
        raise ValueError(f"record: unknown field(s) {brief(sorted(map(str, unknown)))} for the "
                         f"{engine} engine")
    out: dict[str, Any] = {}
    for name, (required, check) in checks.items():
        if name in record:
            out[name] = check(record[name])
        elif required:
            raise ValueError(f"record: missing field {name!r}")
    return out
