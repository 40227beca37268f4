"""The files the commands read and write: saved traces, named the way a user names them, and
text outputs.

A trace argument is one file, a glob, or the name given to `profile -o`, which stands for its
`.rankK` traces (see rankenv.expand_traces). Everything that goes wrong here is something the
user can fix on the command line, so it is raised as InputError, whose message is the one
line the CLI prints after `memcpy-doctor: error:`. Nothing here prints.
"""

from __future__ import annotations

from ..core.kineto import is_kineto_file, load_any
from ..core.trace import Trace, TraceError
from .rankenv import RankError, expand_traces


class InputError(Exception):
    """What the user gave (an option, a path, a trace, the environment) cannot be used.

    Raised by the code under run/ that the commands call; the message is one line naming
    the problem, which the CLI shows as a usage error (exit status 2)."""


def load_trace(path: str) -> Trace:
    """The trace saved at `path` (memcpy-doctor's, or torch.profiler's `.json`/`.json.gz`,
    recognised by content); InputError when it is missing or unreadable, because a trace the
    user named is a usage error, not a crash."""
    try:
        if is_kineto_file(path):  # a torch.profiler trace, read as one of ours
            return load_any(path)
        return Trace.load(path)
    except TraceError as e:
        raise InputError(str(e)) from None


def load_traces(args: tuple[str, ...] | list[str]) -> tuple[list[Trace], list[str]]:
    """The traces `args` name (globs and rank traces expanded) and their file names, in rank
    order when every one has a rank, so that rank K of one run meets rank K of another.
    InputError when a glob matches nothing or a trace cannot be read."""
    try:
        names = expand_traces(list(args))
    except RankError as e:
        raise InputError(str(e)) from None
    traces = [load_trace(n) for n in names]
    if len(traces) > 1 and all(t.meta.rank is not None for t in traces):
        order = sorted(range(len(traces)), key=lambda i: traces[i].meta.rank)
        traces, names = [traces[i] for i in order], [names[i] for i in order]
    return traces, names


def write_text(text: str, path: str) -> None:
    """Write `text` to the file `path` (an `-o` or `--chrome-trace` the user gave);
    InputError naming the option when the file cannot be written."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise InputError(f"-o {path}: {e.strerror or e}") from None
