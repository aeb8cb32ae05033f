"""Errors raised at the boundary, each naming the offending field and the value received."""

from __future__ import annotations

from typing import Any


class NlaggError(Exception):
    """Base class of every error nlagg raises on purpose."""


class ConfigError(NlaggError, ValueError):
    """A run configuration, graph file or command-line value is invalid.

    The message always names the field and the value received, so a one-line
    report on stderr tells the user what to fix.
    """

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")
