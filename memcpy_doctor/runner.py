"""Run a script exactly as `python SCRIPT ARGS` would, under a tracer.

`__name__ == "__main__"`, `sys.argv` and `sys.path[0]` are the script's while it runs and
restored after. The script's own exceptions are caught only to be handed back to the CLI,
which prints them as Python would and exits with the status Python would.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from types import TracebackType

from .defaults import EXIT_INTERRUPTED
from .trace import Trace
from .tracer import Tracer


@dataclass
class RunResult:
    trace: Trace
    exit_status: int
    ended_by: str  # completed | exit | exception | interrupt
    exception: BaseException | None = None  # to print, as Python would
    exit_message: str | None = None  # a non-integer sys.exit() argument, printed to stderr


def _exit_status(code: object) -> tuple[int, str | None]:
    """What Python's own exit does with sys.exit(code)."""
    if code is None:
        return 0, None
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256, None
    return 1, str(code)


def run_script(script: str, args: list[str], tracer: Tracer) -> RunResult:
    """Run `script` under `tracer`; the trace covers whatever ran, however it ended."""
    path = os.path.abspath(script)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [script, *args]
    if sys.path:
        sys.path[0] = os.path.dirname(path)
    else:
        sys.path.insert(0, os.path.dirname(path))
    status, ended_by, exc, message = 0, "completed", None, None
    try:
        tracer.start()
        try:
            runpy.run_path(path, run_name="__main__")
        finally:
            tracer.stop()
    except SystemExit as e:
        status, message = _exit_status(e.code)
        ended_by = "exit" if status else "completed"
    except KeyboardInterrupt as e:
        status, ended_by, exc = EXIT_INTERRUPTED, "interrupt", e
    except BaseException as e:  # the script's own error: shown to the user unchanged
        status, ended_by, exc = 1, "exception", e
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
    trace = tracer.trace
    if trace is None:  # the tracer itself failed to start: nothing ran
        raise exc if exc is not None else RuntimeError("tracer did not start")
    trace.meta.exit_status = status
    trace.meta.ended_by = ended_by
    return RunResult(trace, status, ended_by, exc, message)


def format_exception(exc: BaseException, script: str) -> str:
    """The traceback Python would print: frames from the script down, none of ours above."""
    tb: TracebackType | None = exc.__traceback__
    path = os.path.abspath(script)
    t = tb
    while t is not None and os.path.abspath(t.tb_frame.f_code.co_filename) != path:
        t = t.tb_next
    return "".join(traceback.format_exception(type(exc), exc, t if t is not None else tb))
