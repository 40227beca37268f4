"""What every record of a trace stands on: a place in the user's code, the error a trace
that cannot be read raises (core/trace.py and core/compiled.py both use them), and the notes
that `explain` repeats: a trace without call sites, a light trace."""

from __future__ import annotations

from dataclasses import dataclass


#: The "Not traced" note of a trace read without Python stacks (a torch.profiler profile
#: recorded without with_stack, kineto/reader.py), which `explain` repeats: no line to name.
NO_STACK_NOTE = ("call sites: the profile has no Python stacks; a torch.profiler profile "
                 "recorded with with_stack=True would name the lines")

#: The note of a trace of `profile --light` (tracer/light.py) that `explain` repeats: what a
#: sync found by PyTorch's sync-debug warning does not say.
LIGHT_SYNC_NOTE = ("light mode: a `sync_debug` copy is a sync found by its warning: its "
                   "direction and size are not known (recorded as DtoH, 0 bytes) and it is "
                   "not timed (PyTorch hands the warning to Python after the call that synced "
                   "has returned; a backward pass's when the pass ends)")


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
