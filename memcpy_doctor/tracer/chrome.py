"""A bounded timeline of the run for `profile --chrome-trace`: ops, copies and host waits on
a host track and a device track, with flows producer -> copy -> consumer.

A subscriber of the run's event record (tracer/events.py), off unless asked for and capped
at `limit` events (the rest are counted). Times are the tracer's clocks: on the simulated GPU
the modeled host and device timelines; on a real GPU the measured host time (device spans
are not placed on this timeline there). A copy's flows follow its storages: from the event
that last wrote its source to it, and from it to the first event after it that reads its
destination.
"""

from __future__ import annotations

from typing import Any

from ..core.trace import copy_event_name
from .events import COPY, DEVICE_END, DEVICE_START, HOST_END, HOST_START, KIND, OP, READS, WRITES


class ChromeLog:
    __slots__ = ("limit", "events", "flows", "dropped", "_writer", "_unread")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # (category, name, host_start, host_dur, device_start, device_dur, args)
        self.events: list[tuple] = []
        self.flows: list[tuple[int, int]] = []  # (from event, to event)
        self.dropped = 0
        self._writer: dict[int, int] = {}  # storage -> the event that last wrote it
        self._unread: dict[int, int] = {}  # a copy's destination storage -> the copy

    def event(self, event: tuple, handle: Any) -> None:
        """One event of the run's record (tracer/events.py), as it happened, and its
        aggregate."""
        if len(self.events) >= self.limit:
            self.dropped += 1
            return
        index, kind = len(self.events), event[KIND]
        if kind == OP:
            ref = handle.ref
            category, name, args = "op", ref.op, {"device": ref.device, "site": str(ref.site)}
        elif kind == COPY:
            direction, sync, _, trigger, site = handle.path[:5]
            category, name = "memcpy", copy_event_name(direction, sync)
            args = {"bytes": handle.nbytes, "trigger": trigger, "site": str(site)}
        else:
            wait_kind, site, _ = handle
            category, name, args = "wait", f"HostWait:{wait_kind}", {"site": str(site)}
        host_start, device_start, device_end = (event[HOST_START], event[DEVICE_START],
                                                event[DEVICE_END])
        self.events.append((category, name, host_start, event[HOST_END] - host_start,
                            device_start, 0 if device_end is None else device_end - device_start,
                            args))
        self._flows(index, kind == COPY, event[READS], event[WRITES])

    def _flows(self, index: int, copy: bool, reads: tuple, writes: tuple) -> None:
        writer, unread = self._writer, self._unread
        for storage in reads:
            if storage in unread:  # the copy's first reader
                self.flows.append((unread.pop(storage), index))
            elif copy and storage in writer:  # the copy's producer
                self.flows.append((writer[storage], index))
        for storage in writes:
            writer[storage] = index
            if copy:
                unread[storage] = index
