"""Run a script exactly as `python SCRIPT ARGS` would (or a module as `python -m MODULE ARGS`),
under a tracer.

`__name__ == "__main__"`, `sys.argv` and `sys.path[0]` are the script's while it runs and
restored after. The script's own exceptions are caught only to be handed back to the CLI,
which prints them as Python would and exits with the status Python would.

Two ends skip every cleanup, so the trace is handed over before the process goes: os._exit,
and a signal whose default action ends the process (SIGTERM, SIGHUP). For those the runner
puts in handlers only while the script runs, only where the script's process still has the
default action, and takes them out after; a script that installs its own handler replaces
ours and keeps working as it would without the tool. After the report and trace are written,
the signal is raised again with its default action, so the process dies of it: a parent sees
a signal death, as without the tool (a shell reports 128+N, Python's subprocess -N).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.machinery
import io
import _thread
import os
import signal
import sys
import threading
import time
import traceback
import types
import warnings
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .apply import Edit, apply_edits
from ..core.defaults import (EXIT_INTERRUPTED, EXIT_SIGNAL_BASE, HANDLED_SIGNALS,
                             SIGNAL_DEFER_MAX_S, SIGNAL_RETRY_S)
from .rankenv import RankInfo
from ..core.paths import is_package_file, is_torch_file
from ..core.trace import Trace

if TYPE_CHECKING:  # the caller makes the tracer, and with it imports torch
    from ..tracer import Tracer

#: os._exit as Python has it, before _hard_exit_hook replaces it during a run.
_REAL_EXIT = os._exit


@dataclass
class RunResult:
    trace: Trace
    exit_status: int
    ended_by: str  # completed | exit | exception | interrupt | os._exit | SIGTERM | SIGHUP
    exception: BaseException | None = None  # to print, as Python would
    exit_message: str | None = None  # a non-integer sys.exit() argument, printed to stderr
    missed_edits: list[Edit] = field(default_factory=list)  # --apply edits not applied


def _exit_status(code: object) -> tuple[int, str | None]:
    """What Python's own exit does with sys.exit(code)."""
    if code is None:
        return 0, None
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256, None
    return 1, str(code)


def _main_module(path: str, spec: ModuleSpec | None = None) -> types.ModuleType:
    """A fresh `__main__` module, set up as `python SCRIPT` sets it up, or, with `spec`, as
    `python -m MODULE` does (runpy's _run_module_as_main)."""
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = builtins
    if spec is None:
        main.__package__ = None
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
        return main
    main.__package__ = spec.parent
    main.__loader__ = spec.loader
    main.__spec__ = spec
    main.__cached__ = spec.cached
    return main


def run_script(script: str, args: list[str], tracer: Tracer,
               edits: list[Edit] | None = None,
               on_hard_exit: Callable[[RunResult], None] | None = None,
               rank: RankInfo | None = None, spec: ModuleSpec | None = None) -> RunResult:
    """Run `script` under `tracer`; the trace covers whatever ran, however it ended. `edits`
    (from `profile --apply`) are applied to the script's code in memory. `on_hard_exit` gets
    the result when the script calls os._exit or is ended by a signal (SIGTERM, SIGHUP), just
    before the process ends. `rank` (one process of a distributed run) goes in the meta.
    With `spec` (`profile -m`: run/modules.py), the module it names runs as `python -m`
    runs it: `sys.argv[0]` its file, `sys.path[0]` the current directory, `__spec__` and
    `__package__` its own; `script` is then its file."""
    path = os.path.abspath(script)
    saved_argv = sys.argv[:]
    saved_path0 = sys.path[0] if sys.path else None
    saved_main = sys.modules.get("__main__")
    sys.argv = [path if spec is not None else script, *args]
    first = os.getcwd() if spec is not None else os.path.dirname(os.path.realpath(script))
    if sys.path:
        sys.path[0] = first
    else:
        sys.path.insert(0, first)
    status, ended_by, exc, message = 0, "completed", None, None
    missed: list[Edit] = []
    try:
        with io.open_code(path) as f:
            source = f.read()
        try:
            if edits:
                code, missed = apply_edits(source, path, edits)
            else:
                code = compile(source, path, "exec", dont_inherit=True)
        except SyntaxError as e:  # nothing ran: Python prints it without a traceback
            e.__traceback__ = None
            raise
        main = _main_module(path, spec)
        sys.modules["__main__"] = main
        tracer.start()
        try:
            with _warnings_at_user_lines(), _hard_exit_hook(tracer, on_hard_exit, rank), \
                    _signal_hook(tracer, on_hard_exit, rank):
                exec(code, main.__dict__)
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
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
    trace = tracer.trace
    if trace is None:
        if tracer.device is None and exc is not None and not isinstance(exc, SyntaxError):
            raise exc  # the tracer itself could not start
        with tracer:  # nothing ran (a syntax error): an empty trace all the same
            pass
        trace = tracer.trace
    _set_meta(trace, status, ended_by, rank)
    return RunResult(trace, status, ended_by, exc, message, missed)


def _set_meta(trace: Trace, status: int, ended_by: str, rank: RankInfo | None) -> None:
    trace.meta.exit_status, trace.meta.ended_by = status, ended_by
    if rank is not None:
        trace.meta.rank, trace.meta.world_size = rank.rank, rank.world_size


@contextlib.contextmanager
def _warnings_at_user_lines() -> Iterator[None]:
    """A warning torch raises from C++ inside an op is attributed to the innermost Python
    frame, which under the tracer is one of its handlers: show it at the user's line, where
    Python would have shown it without the tracer."""
    original = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if is_package_file(filename):
            frame = sys._getframe(1)
            while frame is not None and (is_package_file(frame.f_code.co_filename)
                                         or is_torch_file(frame.f_code.co_filename)
                                         or frame.f_code.co_filename == warnings.__file__):
                frame = frame.f_back
            if frame is not None:
                filename, lineno, line = frame.f_code.co_filename, frame.f_lineno, None
        original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = original


@contextlib.contextmanager
def _hard_exit_hook(tracer: Tracer, on_hard_exit: Callable[[RunResult], None] | None,
                    rank: RankInfo | None) -> Iterator[None]:
    """os._exit ends the process at once: hand the trace over first. Only in this process:
    a forked child (a DataLoader worker ends with os._exit) must not write the parent's
    files."""
    if on_hard_exit is None:
        yield
        return
    original = os._exit
    pid = os.getpid()

    def hard_exit(code: int) -> None:
        if os.getpid() == pid:
            trace = tracer.stop()
            _set_meta(trace, code, "os._exit", rank)
            try:
                on_hard_exit(RunResult(trace, code, "os._exit"))
            finally:
                original(code)
        original(code)

    os._exit = hard_exit
    try:
        yield
    finally:
        if os._exit is hard_exit:
            os._exit = original


@contextlib.contextmanager
def _signal_hook(tracer: Tracer, on_hard_exit: Callable[[RunResult], None] | None,
                 rank: RankInfo | None) -> Iterator[None]:
    """SIGTERM and SIGHUP end a process without any cleanup: write the report and trace
    first, then die of the signal. Installed only where the action is still the default (a
    parent may have set it to ignore, as nohup does) and only from the main thread (Python
    runs handlers there alone); the originals are back when the run ends."""
    if on_hard_exit is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()
    main_thread = threading.main_thread().ident
    installed: list[int] = []
    deferred: dict[int, float] = {}  # signal -> when it first came

    def handler(signum: int, frame: types.FrameType | None) -> None:
        if os.getpid() != pid:  # a forked child (a DataLoader worker) inherited the handler
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        first = deferred.setdefault(signum, time.monotonic())
        if _inside_tracer(frame) and time.monotonic() - first < SIGNAL_DEFER_MAX_S:
            # Python runs a handler between any two bytecodes, also in the middle of the
            # tracer's own bookkeeping; stopping there could tear its state. Ask again a
            # moment later, from another thread (raise_signal here would run this handler
            # again at once), until the tracer's code has returned; but not forever.
            _thread.start_new_thread(_signal_later, (main_thread, signum))
            return
        die(signum)

    def die(signum: int) -> None:
        status = EXIT_SIGNAL_BASE + signum
        name = signal.Signals(signum).name
        try:
            # (after SIGNAL_DEFER_MAX_S this may run inside the tracer's own code: a busy
            # loop of small ops spends most of its time there, and Python runs handlers
            # mostly on entering a function, so on entering the tracer's)
            trace = tracer.stop(abandon_modes=True)
            _set_meta(trace, status, name, rank)
            on_hard_exit(RunResult(trace, status, name))
        finally:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            _REAL_EXIT(status)  # not reached: the default action has ended the process

    for signum in HANDLED_SIGNALS:
        sig = getattr(signal, signum, None)
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, handler)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in sorted(deferred):  # asked again while leaving the run: act on it now
            if signal.getsignal(sig) is handler:
                die(sig)
        for sig in installed:  # also where the script replaced ours: the run is over
            signal.signal(sig, signal.SIG_DFL)


def _signal_later(thread: int, signum: int) -> None:
    """Send `signum` to `thread` after a moment (a bare thread: the tracer counts the
    threading module's threads as the program's)."""
    time.sleep(SIGNAL_RETRY_S)
    signal.pthread_kill(thread, signum)


def _inside_tracer(frame: types.FrameType | None) -> bool:
    """Whether `frame` (where a signal interrupted the run) is in memcpy-doctor's own code
    called from the script: any of our frames before the runner's own."""
    while frame is not None:
        code = frame.f_code
        if code is run_script.__code__:
            return False
        if is_package_file(code.co_filename):
            return True
        frame = frame.f_back
    return False


#: Frames of torch's mode machinery that lead into the tracer's own handlers.
_PLUMBING = ("torch/overrides.py", "torch/_compile.py", "torch/_dynamo/", "torch/_ops.py",
             "torch/utils/_python_dispatch.py")


def format_exception(exc: BaseException, script: str) -> str:
    """The traceback Python would print: from the script's first frame down, without the
    tracer's frames (and the torch mode plumbing that leads into them) where the error came
    from inside an op."""
    path = os.path.abspath(script)
    frames = traceback.extract_tb(exc.__traceback__)
    start = next((i for i, f in enumerate(frames) if os.path.abspath(f.filename) == path), 0)
    frames = frames[start:]
    cut = next((i for i, f in enumerate(frames) if is_package_file(f.filename)), None)
    if cut is not None:
        frames = frames[:cut]
        while frames and any(p in frames[-1].filename.replace(os.sep, "/") for p in _PLUMBING):
            frames.pop()
    lines = []
    if frames:
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.format_list(frames))
    lines.extend(traceback.format_exception_only(type(exc), exc))
    return "".join(lines)
