"""Streams and events of the simulated GPU: torch.cuda.Stream, Event and the current stream.

The simulated device runs its work on one in-order queue (its timeline), whatever stream a
program names: times are modeled as if all its streams were one. What streams and events
order is kept apart, as CUDA defines it, for the race checker (tracer/races.py): each thread
has a current stream (`torch.cuda.stream(s)`, `set_stream`), a copy is issued on it, and a
stream's or event's synchronize, a query that finds the work done, `wait_event` and
`wait_stream` tell the checker what they order. A stream or event is known to it by its id.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

import torch

CUDA0 = torch.device("cuda", 0)

#: The simulated device in use, for the Stream and Event objects user code holds.
_ACTIVE: dict[str, Any] = {}
_current = threading.local()  # .stream: the thread's current stream, where one was set


def _races() -> Any:
    """The race checker of the run the simulated device in use serves (None: no device in
    use, or a run that records no races, as the pytest plugin's session-wide one)."""
    sim = _ACTIVE.get("sim")
    return getattr(getattr(sim.st, "run", None), "races", None) if sim else None


class SimEvent:
    """torch.cuda.Event on the simulated GPU: records the modeled device clock."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False) -> None:
        self.enable_timing = enable_timing
        self._device_ns: int | None = None

    def record(self, stream: Any = None) -> None:
        sim = _ACTIVE.get("sim")
        self._device_ns = sim.device_clock() if sim else 0
        races = _races()
        if races is not None:
            races.event_recorded(id(self), id(stream if stream is not None else
                                              current_stream()))

    def query(self) -> bool:
        """Whether the work before the event's record is done (an event never recorded:
        true, as CUDA's)."""
        sim = _ACTIVE.get("sim")
        done = self._device_ns is None or not sim or _work_done(sim, self._device_ns)
        if done:
            self._ordered()
        return done

    def synchronize(self) -> None:
        sim = _ACTIVE.get("sim")
        if sim:
            sim.host_wait("event_synchronize")
            self._ordered()

    def _ordered(self) -> None:
        """The host knows the work before the event done (the race checker's)."""
        races = _races()
        if races is not None:
            races.event_synced(id(self))

    def wait(self, stream: Any = None) -> None:
        (stream if stream is not None else current_stream()).wait_event(self)

    def elapsed_time(self, end_event: SimEvent) -> float:
        if self._device_ns is None or end_event._device_ns is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._device_ns - self._device_ns) / 1e6


class SimStream(torch.Stream):
    """torch.cuda.Stream on the simulated GPU: its work runs on the device's one queue (see
    the module's text). A torch.Stream (of the host) underneath, so that calls that parse a
    stream argument in C++ (`Tensor.record_stream`) take it."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> SimStream:
        return super().__new__(cls, device="cpu")

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.sim_priority = priority

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return CUDA0

    @property
    def priority(self) -> int:  # type: ignore[override]
        return self.sim_priority

    def synchronize(self) -> None:
        sim = _ACTIVE.get("sim")
        if sim:
            if sim.sync_debug:  # CUDAStream::synchronize is c10's stream_synchronize
                sim.synced()
            sim.host_wait("stream_synchronize")
            self._ordered()

    def _ordered(self) -> None:
        """The host knows this stream's work done (the race checker's)."""
        races = _races()
        if races is not None:
            races.synced_stream(id(self))

    def wait_stream(self, stream: Any) -> None:
        """This stream's later work waits for what `stream` has queued (an event recorded
        there, waited for here, as torch.cuda.Stream.wait_stream does)."""
        if stream is not self:
            self.wait_event(stream.record_event())

    def wait_event(self, event: Any) -> None:
        races = _races()
        if races is not None:
            races.stream_waited(id(self), id(event))

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        event = event or SimEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        """Whether all work queued on the device is done."""
        sim = _ACTIVE.get("sim")
        done = not sim or _work_done(sim)
        if done:
            self._ordered()
        return done

    def is_capturing(self) -> bool:
        return False  # no CUDA graph capture on the simulated GPU

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


_DEFAULT_STREAM = SimStream()


def current_stream(device: Any = None) -> SimStream:
    """The calling thread's current stream (the default stream unless one was set)."""
    return getattr(_current, "stream", _DEFAULT_STREAM)


def current_stream_key() -> int:
    """What the race checker knows the current stream by."""
    return id(getattr(_current, "stream", _DEFAULT_STREAM))


def set_stream(s: Any) -> None:
    """torch.cuda.set_stream: a None stream changes nothing, as torch's."""
    if s is not None:
        _current.stream = s


@contextmanager
def stream(s: Any) -> Iterator[None]:
    """torch.cuda.stream(s): `s` is the thread's current stream inside, the one before after
    (None: nothing changes, as torch's StreamContext)."""
    if s is None:
        yield
        return
    before = current_stream()
    _current.stream = s
    try:
        yield
    finally:
        _current.stream = before


def reset_streams() -> None:
    """The calling thread back on the default stream (a run's end)."""
    _current.__dict__.pop("stream", None)


def _work_done(sim: Any, until_ns: int | None = None) -> bool:
    """`Stream.query()` (`until_ns` None: all queued work) or `Event.query()` (the device
    clock the event recorded): whether the device has done that work by the host's clock
    now. The query is a driver call that costs the host `sync_ns` but waits for nothing,
    so a program that polls sees the device catch up, as on a GPU."""
    st = sim.st
    tl = st.timeline
    if tl is None or st.suspended:
        return True
    st.gap()
    tl.host(st.profile.sync_ns)
    return (tl.device_ns if until_ns is None else until_ns) <= tl.host_ns
