"""A base for the scripted stand-ins of an engine that CPU tests use in place of cuDNN's answers.

The iterator, caches, key and tuning database under test are pycudnn's real ones; a stand-in only
decides which candidates exist and which of them fail. It implements the real
[`Engine`][pycudnn.engines.contract.Engine] contract, so a change to the contract shows up here too.
"""

from __future__ import annotations

from typing import Any

from pycudnn.engines.contract import Engine


class ScriptedEngine(Engine):
    """Subclasses supply ``candidates`` and ``run``; the rest is not part of what they script."""

    name = "scripted"
    deterministic_uses_default = True

    def candidates(self, args: Any) -> list[Any]:
        raise NotImplementedError

    def run(self, args: Any, record: Any) -> None:
        raise NotImplementedError

    def launch(self, params: Any, record: Any, handle: int, pointers: tuple[int, ...],
               stream: int) -> None:
        raise NotImplementedError("this scripted engine does not replay")

    def serialize(self, record: Any) -> dict[str, Any]:
        raise NotImplementedError("this scripted engine keeps no tuning records")

    def restore(self, args: Any, data: dict[str, Any]) -> Any:
        raise NotImplementedError("this scripted engine keeps no tuning records")
