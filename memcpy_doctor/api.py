"""`memcpy_doctor.profiler()`: the context manager Paddle users know, over the Tracer."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from .core.defaults import DEFAULT_DEVICE, DEFAULT_SORT_KEY, SORT_KEYS, TIMELINE_EVENTS
from .render.text import render_text
from .core.trace import Trace
from .tracer import Tracer

#: Paddle's profiler states. memcpy-doctor always records host and device work; the state is
#: checked and kept for code written against Paddle's signature.
STATES = ("CPU", "GPU", "All")


class Profile:
    """What `profiler()` yields: the trace once the block has ended, and its report."""

    def __init__(self, tracer: Tracer, sorted_key: str, state: str) -> None:
        self.tracer = tracer
        self.sorted_key = sorted_key
        self.state = state

    @property
    def trace(self) -> Trace:
        if self.tracer.trace is None:
            raise RuntimeError("the profiled block has not ended yet")
        return self.tracer.trace

    def report(self, sorted_key: str | None = None) -> str:
        """The Profiling Report as text (the library never prints it itself)."""
        return render_text(self.trace, sort=sorted_key or self.sorted_key)


@contextmanager
def profiler(state: str = "All", sorted_key: str = DEFAULT_SORT_KEY,
             profile_path: str | None = None, *, device: str = DEFAULT_DEVICE,
             device_profile: str | None = None,
             timeline_events: int = TIMELINE_EVENTS) -> Iterator[Profile]:
    """Profile the block; with `profile_path`, the trace is saved there when it ends.

    `device` is "auto" (the real GPU if torch has one, else the simulated one), "cuda" or
    "sim"; `device_profile` names the simulated GPU's profile; `timeline_events`: the first
    N events kept in order in the trace's timeline.
    """
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}, not {state!r}")
    if sorted_key not in SORT_KEYS:
        raise ValueError(f"sorted_key must be one of {', '.join(SORT_KEYS)}, not {sorted_key!r}")
    tracer = Tracer(device=device, profile=device_profile, timeline_events=timeline_events)
    prof = Profile(tracer, sorted_key, state)
    tracer.start()
    try:
        yield prof
    finally:
        trace = tracer.stop()
        if profile_path is not None:
            trace.save(profile_path)
