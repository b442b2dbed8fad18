"""Global defaults for the convolution flags, and ``flags()`` to override them for a block.

``pycudnn.config.benchmark = True`` changes the default for every thread. ``with
pycudnn.flags(benchmark=True): ...`` overrides it for the current thread (and asyncio task) only,
through a `contextvars.ContextVar`; nesting restores the previous values on exit. A flag
passed to a convolution call beats both.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, TypedDict

# ``Unpack`` at run time too, where typing.get_type_hints() resolves ``**flags`` annotations
if sys.version_info >= (3, 11):
    from typing import Unpack
elif TYPE_CHECKING:
    from typing_extensions import Unpack
else:
    try:
        from typing_extensions import Unpack
    except ImportError:  # Python 3.10 without typing_extensions: the hints resolve to Any
        class Unpack:
            """``typing.Unpack``'s stand-in: ``Unpack[X]`` reads as ``Any``."""

            def __class_getitem__(cls, item: Any) -> Any:
                return Any

__all__ = ["config", "flags", "Config", "FLAG_NAMES", "ConvolutionFlags"]

#: every flag and its built-in default (PyTorch's defaults where PyTorch has the flag)
_DEFAULTS: dict[str, Any] = {
    "benchmark": False,        # measure (Find) instead of cuDNN's heuristics (Get)
    "deterministic": False,    # only deterministic algorithms
    "allow_tf32": True,        # float32 may run on TF32 tensor cores (PyTorch's default for cuDNN)
    "workspace_limit": None,   # bytes; None = as much as is free
    "engine": "graph",         # "graph" (backend API, fastest) or "v7" (legacy API, Conv_v7.cpp's behaviour)
    "benchmark_limit": 10,     # graph engine: time the first 10 precompiled candidates (None: all, exhaustive)
    "tuning_db": True,         # keep measured choices on disk for later processes (PYCUDNN_TUNING_DB=0: off)
}
FLAG_NAMES = tuple(_DEFAULTS)


class ConvolutionFlags(TypedDict, total=False):
    """The flags a convolution call takes as keyword arguments (``**flags``), each optional:
    one given beats an active ``flags()`` block, which beats ``pycudnn.config``.

    Attributes:
        benchmark: measure the candidate algorithms (Find) instead of taking cuDNN's heuristics
            (Get); default False.
        deterministic: only deterministic algorithms; default False.
        allow_tf32: float32 may run on TF32 tensor cores; default True (PyTorch's for cuDNN).
        workspace_limit: the most workspace bytes an algorithm may use; None (the default): as
            much as is free.
        engine: ``"graph"`` (the backend API, the default) or ``"v7"`` (the legacy API).
        benchmark_limit: the graph engine's measured search times the first this many
            candidates; None: all of them; default 10.
        tuning_db: keep measured choices on disk for later processes; default True.
    """

    benchmark: bool
    deterministic: bool
    allow_tf32: bool
    workspace_limit: int | None
    engine: Literal["graph", "v7"]
    benchmark_limit: int | None
    tuning_db: bool
_ENGINES = ("v7", "graph")

_overrides: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "pycudnn_flags", default=None)
#: the active flags() overrides as a sorted tuple (hashable), kept beside them for
#: Config.token() and the remembered-call signatures
override_token: contextvars.ContextVar[tuple] = contextvars.ContextVar("pycudnn_flags_token", default=())


def _validate(name: str, value: Any) -> Any:
    if name not in _DEFAULTS:
        raise TypeError(f"unknown flag {name!r}; expected one of {', '.join(FLAG_NAMES)}")
    if name in ("benchmark", "deterministic", "allow_tf32", "tuning_db"):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected a bool, got {value!r}")
    elif name in ("workspace_limit", "benchmark_limit"):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name}: expected None or a non-negative int, got {value!r}")
    elif name == "engine":
        if value not in _ENGINES:
            raise ValueError(f"engine: expected one of {', '.join(map(repr, _ENGINES))}, got {value!r}")
    return value


class Config:
    """Process-wide defaults; attribute reads honour an active ``flags()`` block of this thread.

    ``generation`` counts changes of the global defaults: with
    ``override_token`` and a call's own keyword flags it
    says whether a remembered call signature is still valid (see `token()`).
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_values", dict(_DEFAULTS))
        object.__setattr__(self, "generation", 0)
        if os.environ.get("PYCUDNN_TUNING_DB", "").strip().lower() in ("0", "false", "no", "off"):
            self._values["tuning_db"] = False
        env_engine = os.environ.get("PYCUDNN_ENGINE")
        if env_engine:
            self._values["engine"] = _validate("engine", env_engine)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in _DEFAULTS:
            raise AttributeError(f"pycudnn.config has no flag {name!r}; flags are {', '.join(FLAG_NAMES)}")
        over = _overrides.get()
        if over is not None and name in over:
            return over[name]
        return self._values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        value = _validate(name, value)
        with self._lock:
            self._values[name] = value
            object.__setattr__(self, "generation", self.generation + 1)

    def token(self, given: Mapping[str, Any]) -> tuple:
        """A hashable summary of every input to `resolve()` (for call-signature caches):
        changes whenever a global default, an active ``flags()`` block or ``given`` changes."""
        over = override_token.get()
        if given:
            return (self.generation, over, tuple(sorted(given.items())))
        return (self.generation, over)

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """All flags for one call: explicit keyword arguments, then ``flags()``, then globals."""
        values = dict(self._values)
        over = _overrides.get()
        if over:
            values.update(over)
        for name, value in given.items():
            values[name] = _validate(name, value)
        return values

    def reset(self) -> None:
        """Restore the built-in defaults (tests use this)."""
        with self._lock:
            self._values.update(_DEFAULTS)
            object.__setattr__(self, "generation", self.generation + 1)

    def __repr__(self) -> str:
        values = self.resolve({})
        return "pycudnn.config(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"


config = Config()


@contextlib.contextmanager
def flags(**overrides: Unpack[ConvolutionFlags]) -> Iterator[Config]:
    """Override flags for a block on this thread: ``with pycudnn.flags(benchmark=True): ...``.

    The flags and their types are those of `ConvolutionFlags`.
    """
    for name, value in overrides.items():
        _validate(name, value)
    merged = dict(_overrides.get() or {})
    merged.update(overrides)
    token = _overrides.set(merged)
    token2 = override_token.set(tuple(sorted(merged.items())))
    try:
        yield config
    finally:
        override_token.reset(token2)
        _overrides.reset(token)
