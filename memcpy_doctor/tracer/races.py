"""Races between the host and a copy still in flight: happens-before, not luck (issue 42).

An asynchronous copy between pinned host memory and the device (`non_blocking=True`) returns
at once. Until something orders it before the host, the host must not touch its host side:
reading a device->host copy's destination reads whatever is there yet, and writing a
host->device copy's source (or the destination of one the other way) sends the device the
new data, or a mix. Whether the data happened to arrive does not matter: a race is an access
the program did not order.

What orders a copy, as CUDA defines it: the host synchronizing with the device
(`torch.cuda.synchronize`), with the copy's stream (`Stream.synchronize`, or any sync the host
makes on that stream: `.item()`, a blocking copy, `nonzero`, ...), or with an event recorded
on that stream after the copy (`Event.synchronize`, `Event.query()` returning true). A stream
that waits for an event (`wait_event`, `wait_stream`) orders nothing for the host by itself,
but a later sync of the waiting stream orders what the event covered. This is kept as vector
clocks over streams: each stream counts the copies issued on it; an event, and each stream's
waits, hold how far they cover every stream; the host holds how far it knows each stream done.

`RaceChecker` is driven by the tracer: `copy` for each async copy (`ThreadContext.record_copy`),
the sync calls from the simulated GPU's streams and events (tracer/sim/marks.py) or from
CUDA's own callbacks on a real GPU (tracer/cuda_races.py), and `access` from the per-op path
for each host op while a copy is in flight (`inflight` is empty otherwise: the per-op path
pays one truth test). It keeps no tensor: a host storage is known by its address, and a weak
reference to it forgets its copies when it is freed (a new storage may take its address).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from ..core.races import READ_BEFORE_DONE, WRITE_DURING, RaceRecord
from ..core.torch_private import storage_id
from .tensors import NO_STORAGE

#: In-place ops that write their first argument without reading it.
OVERWRITES = frozenset(("copy_", "fill_", "zero_", "normal_", "uniform_", "random_",
                        "bernoulli_", "exponential_", "geometric_", "cauchy_",
                        "log_normal_", "set_", "resize_"))

Vector = dict  # stream -> how many of its tracked copies are covered


class InFlight:
    """One async copy not yet ordered before the host."""

    __slots__ = ("stream", "seq", "direction", "site", "nbytes", "trigger", "raced")

    def __init__(self, stream: Any, seq: int, direction: str, site: Any, nbytes: int,
                 trigger: str) -> None:
        self.stream, self.seq, self.direction = stream, seq, direction
        self.site, self.nbytes, self.trigger = site, nbytes, trigger
        self.raced: set[tuple] = set()  # the races it is in: each counted once


class RaceChecker:
    """Happens-before between the host and async copies (see the module's text).

    `found` maps (kind, copy site, direction, trigger, access site, thread) to [calls, bytes,
    op]: the copies that raced with an access at that site (each counted once, however many
    ops the access ran: `print(t)` runs several), and the first op of the access; what the
    trace's `races` is made of (`records`)."""

    def __init__(self, stream_of: Callable[[], Any]) -> None:
        """`stream_of()`: the key of the calling thread's current stream."""
        self.stream_of = stream_of
        #: host storage address -> the copies in flight on it (empty: nothing to check)
        self.inflight: dict[int, list[InFlight]] = {}
        self._issued: Vector = {}  # stream -> tracked copies issued on it
        self._known: Vector = {}  # stream -> how many of them the host knows done
        self._waits: dict[Any, Vector] = {}  # stream -> what it waits for, of the others
        self._events: dict[Any, Vector] = {}  # event -> what it covered when recorded
        self._alive: dict[int, Any] = {}  # address -> a weak reference to its storage
        self.found: dict[tuple, list[int]] = {}

    # ----- copies -----
    def copy(self, direction: str, host: Any, site: Any, nbytes: int, trigger: str) -> None:
        """An async copy between the pinned host tensor `host` and the device, just issued
        on the current stream."""
        try:
            address, storage = storage_id(host), host.untyped_storage()
        except NO_STORAGE:
            return
        stream = self.stream_of()
        seq = self._issued[stream] = self._issued.get(stream, 0) + 1
        self.inflight.setdefault(address, []).append(
            InFlight(stream, seq, direction, site, nbytes, trigger))
        if address not in self._alive:  # (its address may be a new storage's once it dies)
            self._alive[address] = weakref.ref(storage, lambda _, a=address: self._gone(a))

    def _gone(self, address: int) -> None:
        """The host storage at `address` was freed: no access can touch it any more."""
        self._alive.pop(address, None)
        self.inflight.pop(address, None)

    # ----- what orders them -----
    def _covered(self, stream: Any) -> Vector:
        covered = dict(self._waits.get(stream, ()))
        covered[stream] = self._issued.get(stream, 0)
        return covered

    def _learn(self, covered: Vector) -> None:
        if not self.inflight:  # (nothing to order: every copy issued later counts higher)
            return
        known = self._known
        for stream, seq in covered.items():
            if seq > known.get(stream, 0):
                known[stream] = seq
        for address in list(self.inflight):
            left = [c for c in self.inflight[address] if c.seq > known.get(c.stream, 0)]
            if left:
                self.inflight[address] = left
            else:
                del self.inflight[address]
                self._alive.pop(address, None)

    def synced_stream(self, stream: Any = None) -> None:
        """The host waited for `stream` (None: the current one) to drain."""
        self._learn(self._covered(self.stream_of() if stream is None else stream))

    def synced_device(self) -> None:
        """The host waited for every stream of the device."""
        self._learn(dict(self._issued))

    def event_recorded(self, event: Any, stream: Any = None) -> None:
        """`event` recorded on `stream` (None: the current one): it covers what was issued
        there, and what that stream waits for."""
        self._events[event] = self._covered(self.stream_of() if stream is None else stream)

    def event_synced(self, event: Any) -> None:
        """The host waited for `event` (or found it done by a query)."""
        covered = self._events.get(event)
        if covered:
            self._learn(covered)

    def stream_waited(self, stream: Any, event: Any) -> None:
        """`stream` waits for `event`: what the event covers is ordered before its later
        work (not before the host)."""
        covered = self._events.get(event)
        if not covered:
            return
        waits = self._waits.setdefault(stream, {})
        for other, seq in covered.items():
            if other != stream and seq > waits.get(other, 0):
                waits[other] = seq

    # ----- the host's accesses -----
    def access(self, op: str, short: str, tensors: Any, site: Any, thread: Any) -> None:
        """The host op `op` (its overload's short name `short`) on `tensors`, its tensor
        inputs, while a copy is in flight: a race for each one it touches. The first input
        of an in-place op is written (and not read, for an op that overwrites it)."""
        inflight = self.inflight
        writes_first = short.endswith("_")
        for i, t in enumerate(tensors):
            try:
                copies = inflight.get(storage_id(t))
            except NO_STORAGE:
                continue
            if not copies:
                continue
            writes = writes_first and i == 0
            reads = not (writes and short in OVERWRITES)
            for c in copies:
                if c.direction == "DtoH":
                    self._race(READ_BEFORE_DONE if reads else WRITE_DURING, c, site, op, thread)
                elif writes:
                    self._race(WRITE_DURING, c, site, op, thread)

    def read(self, op: str, t: Any, site: Any, thread: Any) -> None:
        """A Python-level read of a host tensor that no aten op makes (`tolist`, `numpy`)."""
        try:
            copies = self.inflight.get(storage_id(t))
        except NO_STORAGE:
            return
        for c in copies or ():
            if c.direction == "DtoH":
                self._race(READ_BEFORE_DONE, c, site, op, thread)

    def _race(self, kind: str, c: InFlight, site: Any, op: str, thread: Any) -> None:
        key = (kind, c.site, c.direction, c.trigger, site, thread)
        if key in c.raced:
            return
        c.raced.add(key)
        found = self.found.get(key)
        if found is None:
            self.found[key] = [1, c.nbytes, op]
        else:
            found[0] += 1
            found[1] += c.nbytes

    def records(self) -> list[RaceRecord]:
        """The races found, for the trace: most calls first."""
        out = [RaceRecord(kind, copy_site, direction, trigger, nbytes, site, op, calls,
                          thread)
               for (kind, copy_site, direction, trigger, site, thread), (calls, nbytes, op)
               in self.found.items()]
        out.sort(key=lambda r: (-r.calls, r.kind, str(r.access_site)))
        return out
