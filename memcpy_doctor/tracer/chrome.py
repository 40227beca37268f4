"""A bounded timeline of the run for `profile --chrome-trace`: ops, copies and host waits on
a host track and a device track, with flows producer -> copy -> consumer.

Off unless asked for (it is the one record that grows with the run), and capped. Times are the
tracer's clocks: on the simulated GPU the modeled host and device timelines; on a real GPU the
measured host time (device spans are not placed on the timeline there).
"""

from __future__ import annotations

from typing import Callable

Clock = Callable[[], tuple[int, int | None]]  # (host now, device now or None), ns


class ChromeLog:
    __slots__ = ("limit", "clock", "events", "flows", "dropped", "last_of")

    def __init__(self, limit: int, clock: Clock) -> None:
        self.limit = limit
        self.clock = clock
        # (category, name, host_start, host_dur, device_start, device_dur, args)
        self.events: list[tuple] = []
        self.flows: list[tuple[int, int]] = []  # (from event, to event)
        self.dropped = 0
        self.last_of: dict[int, int] = {}  # id(OpRef) -> its latest event

    def add(self, category: str, name: str, host_ns: int, device_ns: int,
            args: dict) -> int | None:
        """An event that just ended on the host (and, with device_ns, on the device)."""
        if len(self.events) >= self.limit:
            self.dropped += 1
            return None
        host_end, device_end = self.clock()
        dev = ((device_end - device_ns, device_ns) if device_ns and device_end is not None
               else (None, 0))
        self.events.append((category, name, host_end - host_ns, host_ns, dev[0], dev[1], args))
        return len(self.events) - 1

    def flow(self, src: int | None, dst: int | None) -> None:
        if src is not None and dst is not None:
            self.flows.append((src, dst))
