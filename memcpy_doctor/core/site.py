"""What every record of a trace stands on: a place in the user's code, and the error a trace
that cannot be read raises (core/trace.py and core/compiled.py both use them)."""

from __future__ import annotations

from dataclasses import dataclass


class TraceError(Exception):
    """A trace file that cannot be read: missing, not JSON, not a trace, or a newer schema."""


@dataclass(frozen=True)
class Site:
    """A place in the user's code: absolute file path, line number, function name."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"
