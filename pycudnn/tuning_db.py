"""The persistent tuning database (placeholder until the tuning-database issue lands: disabled)."""

from __future__ import annotations

from typing import Any


def enabled() -> bool:
    return False


def lookup(params: Any) -> dict | None:
    return None


def store(params: Any, record: dict) -> None:
    return None


def drop(params: Any) -> None:
    return None
