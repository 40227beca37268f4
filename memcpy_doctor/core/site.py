"""What every record of a trace stands on: a place in the user's code, the error a trace
that cannot be read raises (core/trace.py and core/compiled.py both use them), and the note a
trace without call sites carries."""

from __future__ import annotations

from dataclasses import dataclass


#: The "Not traced" note of a trace read without Python stacks (a torch.profiler profile
#: recorded without with_stack, kineto/reader.py), which `explain` repeats: no line to name.
NO_STACK_NOTE = ("call sites: the profile has no Python stacks; a torch.profiler profile "
                 "recorded with with_stack=True would name the lines")


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
