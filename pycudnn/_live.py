"""Counting objects alive (descriptors, plans) for leak tests, safely from finalizers.

A finalizer can run at any allocation - the garbage collector starts there - including while the
same thread is inside this counter's own lock, taken to count a new object. A finalizer that
took that lock would then wait for itself forever (seen in practice on a GPU: a backend descriptor
created while a collected one's finalizer ran). So `LiveCounter.remove()` never takes a lock:
it queues the kind on a deque (``append`` is atomic), and whoever holds the lock folds the queue in.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Callable, Hashable

__all__ = ["LiveCounter", "finalizer"]


def finalizer(owner: object, callback: Callable[..., object], *args: Any) -> weakref.finalize:
    """``callback(*args)`` when ``owner`` is collected or the finalizer is called, never at
    interpreter exit: the process frees host memory anyway, and calling into a CUDA library while
    Python tears down buys nothing (PyTorch leaks its cuDNN objects at exit on purpose)."""
    fin = weakref.finalize(owner, callback, *args)
    fin.atexit = False
    return fin


class LiveCounter:
    """Objects made and not yet finalized, by kind (any hashable; ``None`` when there is one)."""

    __slots__ = ("_lock", "_counts", "_removed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[Any, int] = {}
        self._removed: collections.deque = collections.deque()

    def add(self, kind: Hashable = None) -> None:
        """One more object of ``kind`` (call before its finalizer can run)."""
        with self._lock:
            self._fold()
            self._counts[kind] = self._counts.get(kind, 0) + 1

    def remove(self, kind: Hashable = None) -> None:
        """One object of ``kind`` fewer: safe in a finalizer, at any moment, from any thread."""
        self._removed.append(kind)

    def counts(self) -> dict[Any, int]:
        """The live count of every kind seen (zeros included)."""
        with self._lock:
            self._fold()
            return dict(self._counts)

    def total(self) -> int:
        return sum(self.counts().values())

    def _fold(self) -> None:  # with the lock held
        removed, counts = self._removed, self._counts
        while removed:
            kind = removed.popleft()  # only lock holders pop: never empty here
            counts[kind] = counts.get(kind, 0) - 1
