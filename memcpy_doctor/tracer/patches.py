"""Attributes of other libraries set while the tracer (or the session-wide simulated GPU)
runs, and put back after, also on error; and the patch of `threading.Thread.start` that runs
each thread started meanwhile under its own modes."""

from __future__ import annotations

import threading
from typing import Any, Callable, ContextManager


class Patch:
    """Set attributes while entered, restoring the originals (or removing what was only
    inherited) on exit. It may be entered again after an exit (a compile lifts the simulated
    GPU's patches for its duration: tracer/compiled.py)."""

    def __init__(self, patches: list[tuple[Any, str, Any]]) -> None:
        self.patches = patches
        self.saved: list[tuple[Any, str, Any, bool]] = []

    def __enter__(self) -> None:
        for obj, name, value in self.patches:
            had = name in vars(obj)
            self.saved.append((obj, name, vars(obj).get(name), had))
            setattr(obj, name, value)

    def __exit__(self, *exc: Any) -> None:
        for obj, name, value, had in reversed(self.saved):
            if had:
                setattr(obj, name, value)
            else:
                delattr(obj, name)
        self.saved.clear()


def start_under(thread_modes: Callable[[str], ContextManager]) -> Callable[[threading.Thread],
                                                                           None]:
    """Thread.start, running each thread inside `thread_modes(its name)` (the tracer's or the
    session's modes for a thread of its own)."""
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        run = self.run
        own = "run" in vars(self)  # set on the instance, not the class's method

        def run_under() -> None:
            try:
                with thread_modes(self.name):
                    run()
            finally:  # the thread's own run again; no reference to the modes left
                if own:
                    self.run = run
                else:
                    del self.run

        self.run = run_under
        original(self)

    return start
