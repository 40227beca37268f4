"""The run's one sink: every op, copy and host wait the tracer records enters here, in order.

The aggregates (tracer/collector.py) are what the trace is made of, and they are filled for
every event. What they throw away is the order, which explain's replay and the race checker
need: so the sink also keeps each event (an `Event` tuple: its thread, stream, host and
device spans, the storages it read and wrote) in the order the events happened, up to a bound
(`keep`, core/defaults.TIMELINE_EVENTS), and hands each one to its subscribers: the Chrome
log of `profile --chrome-trace` (tracer/chrome.py) and the transfer log of
`--log-transfers` (tracer/transfers.py). The trace's `timeline` is the kept events.

The per-op path is the hot path, and an op's aggregate is filled there, inline (its record
step, tracer/perop.py). It calls `op` only while `room` is true: past the bound an op costs
the record one comparison. Copies and waits are rare: they always come through `copy` and
`wait`, which fill the aggregates and hand the event to the subscribers, and keep it while
there is room. The copy listeners (transfer_guard, the pytest plugin) hear each copy first,
before it is recorded, so that one may refuse it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..core.timeline import EventTimeline, TimelineEvent
from ..core.torch_private import storage_id
from .collector import Collector, CopyEvent, PendingCopy
from .tensors import NO_STORAGE

#: The kinds of events.
OP, COPY, WAIT = "op", "copy", "wait"

#: An event is a tuple (of plain values, which the garbage collector stops tracking; an
#: object of its own would cost the per-op path more to make and keep): its fields.
#: The handle is its aggregate, from which the trace names it: an op's OpAgg by id (it lives
#: as long as the run), a copy's PendingCopy, a wait's key. Times are ns on the host's clock
#: from the run's start (modeled on the simulated GPU); the device span is None for host
#: work (and, on a real GPU, until CUDA's events are read: `place`); `stream` is the device
#: stream of its device work; `reads` and `writes` are tuples of storage numbers.
(KIND, HANDLE, THREAD, STREAM, HOST_START, HOST_END, DEVICE_START, DEVICE_END, READS,
 WRITES) = range(10)
Event = tuple


class StorageNumbers:
    """A number for each storage an event names, by the storage's address (its StorageImpl:
    every view of it has the same). An address is freed and taken again by new storages, so
    a number stands for one storage's life there: an event that writes an address none of
    its inputs is at (an op's new output, a copy's new destination) starts a new number; one
    that reads it, writes it in place or views it keeps it. Cheap enough for the per-op path
    (no storage object made, no weak reference; docs/benchmarks.md)."""

    __slots__ = ("_current", "_next")

    def __init__(self) -> None:
        self._current: dict[int, int] = {}  # address -> the number of its storage now
        self._next = 0

    def of(self, ins: Sequence[Any], outs: Sequence[Any] = (),
           written_in_place: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The numbers of the storages an event read (`ins`) and wrote (`outs`), each once,
        in order; an output is a new storage unless an input is at its address or
        `written_in_place` (a copy into an existing tensor). A tensor without a plain
        storage (sparse, nested) has none."""
        current, reads, writes = self._current, [], []
        for tensors, found, written in ((ins, reads, False), (outs, writes, True)):
            for t in tensors:
                try:
                    address = storage_id(t)
                except NO_STORAGE:
                    continue
                number = current.get(address)
                if number is None or written and not (written_in_place or number in reads):
                    self._next = number = current[address] = self._next + 1
                if number not in found:
                    found.append(number)
        return tuple(reads), tuple(writes)


class EventRecord:
    """The sink (see the module's text): `collector` is filled for every event; the first
    `keep` events are kept in `events`; `room` is true while an event is still wanted (kept,
    or asked for by a subscriber: `subscribe`)."""

    __slots__ = ("collector", "keep", "events", "room", "_until", "_seen", "_last",
                 "subscribers", "listeners", "storages", "_spans")

    def __init__(self, collector: Collector, keep: int) -> None:
        self.collector = collector
        self.keep = keep
        self.events: list[Event] = []
        self._until = keep  # events wanted by anyone: kept, or a subscriber's
        self._seen = 0
        self.room = keep > 0
        self._last: Any = None  # the handle of the last event kept
        #: `event(event, handle)` for every event while `room`, and every copy and wait
        #: after it
        self.subscribers: list[Any] = []
        #: hear each copy (a CopyEvent) before it is recorded; one may raise to refuse it,
        #: which reaches the program at the line that made the copy
        self.listeners: list[Callable[[CopyEvent], None]] = []
        self.storages = StorageNumbers()
        self._spans: dict[int, tuple[int, int]] = {}  # kept events' device spans, placed

    def subscribe(self, subscriber: Any, events: int = 0) -> None:
        """Hand `subscriber.event(event, handle)` every event from now on; `events`: ops are
        wanted until that many events have been seen (a subscriber's own bound)."""
        self.subscribers.append(subscriber)
        self._until = max(self._until, events)
        self.room = self._seen < self._until

    def _add(self, event: Event, handle: Any) -> None:
        self._seen += 1
        if len(self.events) < self.keep:
            self.events.append(event)
            self._last = handle
        else:
            self._last = None
        self.room = self._seen < self._until
        for subscriber in self.subscribers:
            subscriber.event(event, handle)

    # ----- the three kinds -----
    def op(self, ctx: Any, agg: Any, on_device: bool, host_ns: int, device_ns: int,
           ins: Sequence[Any], outs: Sequence[Any]) -> None:
        """An op the per-op path of the thread context `ctx` just recorded in `agg`, which
        took `host_ns` on the host and, `on_device`, `device_ns` on the device (modeled:
        its span ends on the simulated device's clock; measured later on a real GPU).
        Called only while `room`."""
        timeline = ctx.timeline
        reads, writes = self.storages.of(ins, outs)
        if timeline is not None:
            host_end = timeline.host_ns
            device_end = timeline.device_ns if device_ns else None
        else:
            host_end, device_end = ctx.clock_ns(), None
        self._add((OP, id(agg), ctx.thread, ctx.run.stream_id() if on_device else None,
                   host_end - host_ns, host_end,
                   None if device_end is None else device_end - device_ns, device_end,
                   reads, writes), agg)

    def copy(self, direction: str, sync: bool, pinned: bool | None, trigger: str,
             nbytes: int, host_ns: int, device_ns: int, site: Any, stack: list,
             producer: Any, src: Any, dst: Any, shape: list[int] | None,
             dtype: str | None, thread: str | None, at_ns: int, end_col: int | None = None,
             device_end: int | None = None, stream: int | None = None,
             into_existing: bool = False, non_blocking: bool | None = None) -> PendingCopy:
        """A copy from `src` to `dst` (tensors, or None where there is none to name: the
        host value `item()` returns; `into_existing`: a tensor that was there before, as
        `copy_` writes), made in `thread` and done on the host at `at_ns`; `non_blocking`:
        whether the call asked it (None where not known)."""
        if self.listeners:
            note = CopyEvent(direction, sync, pinned, trigger, nbytes, site, producer, shape,
                             dtype, non_blocking)
            for listener in list(self.listeners):
                listener(note)
        pending = self.collector.copy(
            direction=direction, sync=sync, pinned=pinned, trigger=trigger, nbytes=nbytes,
            host_ns=host_ns, device_ns=device_ns, site=site, stack=stack, producer=producer,
            dst=dst, shape=shape, dtype=dtype, thread=thread, at_ns=at_ns, end_col=end_col,
            non_blocking=non_blocking)
        if self.room or self.subscribers:
            reads, writes = self.storages.of(() if src is None else (src,),
                                             () if dst is None else (dst,), into_existing)
            if device_end is None or not device_ns:
                device_end = None
            self._add((COPY, pending, thread, stream, at_ns - host_ns, at_ns,
                       None if device_end is None else device_end - device_ns, device_end,
                       reads, writes), pending)
        return pending

    def wait(self, kind: str, site: Any, wait_ns: int, thread: str | None,
             at_ns: int) -> None:
        """A host wait that is not a copy (synchronize, stream or event waits), done at
        `at_ns`."""
        self.collector.wait(kind, site, wait_ns, thread)
        if self.room or self.subscribers:
            key = (kind, site, thread)
            self._add((WAIT, key, thread, None, at_ns - wait_ns, at_ns, None, None, (), ()),
                      key)

    # ----- after the event -----
    def kept_last(self, handle: Any) -> int | None:
        """Where the last event is kept, if it was kept and is one of `handle` (an
        aggregate): what `place` takes."""
        return len(self.events) - 1 if handle is not None and self._last is handle else None

    def place(self, index: int, start_ns: int, ns: int) -> None:
        """A kept event's device span, once measured (a real GPU's CUDA events,
        tracer/cuda_timer.py), from `start_ns` on the host's clock."""
        self._spans[index] = (start_ns, start_ns + ns)

    def extend(self, agg: Any, host_ns: int, device_ns: int) -> None:
        """The last event, an op of `agg`, lasted `host_ns` and `device_ns` more (a steady
        compiled region's ops inside, added after its row: tracer/regions.py)."""
        index = self.kept_last(agg)
        if index is not None:
            e = self.events[index]
            self.events[index] = e[:HOST_END] + (e[HOST_END] + host_ns, e[DEVICE_START], (
                None if e[DEVICE_END] is None else e[DEVICE_END] + device_ns)) + e[READS:]

    # ----- the end -----
    def timeline(self, ops: list, copies: list, waits: list) -> EventTimeline:
        """The kept events as the trace has them, each naming its row in the records the
        collector made once finished (`ops`, `copies`, `waits`: each record is as many
        events as it has calls, which `dropped` counts past the kept ones)."""
        recorded = (sum(o.calls for o in ops) + sum(c.calls for c in copies)
                    + sum(w.calls for w in waits))
        index, spans, out = self.collector.record_index, self._spans, []
        for i, (kind, handle, thread, stream, host_start, host_end, device_start,
                device_end, reads, writes) in enumerate(self.events):
            ref = index(kind, handle)
            if ref is None:
                continue
            if i in spans:
                device_start, device_end = spans[i]
            out.append(TimelineEvent(kind, ref, thread, stream, host_start, host_end,
                                     device_start, device_end, list(reads), list(writes)))
        return EventTimeline(limit=self.keep, dropped=max(recorded - len(out), 0), events=out)
