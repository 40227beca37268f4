"""Checked reads of a parsed trace's fields: each returns the value, or raises TraceError
saying which field is wrong and what it held (core/trace.py, core/timeline.py)."""

from __future__ import annotations

from typing import Any

from .site import TraceError


def bad(what: str, value: Any) -> TraceError:
    return TraceError(f"malformed trace: {what} is {value!r:.60}")


def an_int(v: Any, what: str = "a count or time") -> int:
    if type(v) is not int:
        raise bad(what, v)
    return v


def a_str(v: Any, what: str = "a name") -> str:
    if not isinstance(v, str):
        raise bad(what, v)
    return v


def a_bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise bad(what, v)
    return v


def an_object(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise bad(what, v)
    return v


def a_list(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise bad(what, v)
    return v
