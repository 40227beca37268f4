"""What the rules and the placement hand to renderers: one suggested edit and what it saves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.trace import CopyRecord, Site


@dataclass
class Suggestion:
    """One edit that removes `removes`, with the host time it gives back (`saving_ns`)."""

    rule: str
    title: str
    detail: str
    sites: list[Site]
    removes: list[CopyRecord]
    saving_ns: int
    diff: str | None = None
    apply: dict[str, Any] | None = None  # what `profile --apply` reads
    exact: bool = True  # False where the estimate rests on a heuristic
    #: what re-running the program with this edit measured (`explain --verify`; a
    #: run/verify.Verified), None when it was not re-run
    verified: Any = None
