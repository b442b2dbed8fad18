"""The engines by name.

`engine_for` gives the engine a call's ``engine`` flag names (``"v7"``:
`pycudnn.engines.v7.V7Engine`, ``"graph"``: `pycudnn.engines.graph.GraphEngine`), and
`register_engine` adds one. This module sits above both engines, so neither imports the other.
"""

from __future__ import annotations

from .contract import Engine
from .graph import GraphEngine
from .v7 import V7Engine

__all__ = ["engine_for", "register_engine", "ENGINES"]

#: the engines by the name the ``engine`` flag uses
ENGINES: dict[str, Engine] = {"v7": V7Engine(), "graph": GraphEngine()}


def register_engine(engine: Engine) -> None:
    """Make an engine available under ``engine.name`` (the ``engine`` flag's value)."""
    ENGINES[engine.name] = engine


def engine_for(engine: str) -> Engine:
    """The engine the ``engine`` flag names."""
    found = ENGINES.get(engine)
    if found is None:
        raise ValueError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
    return found
