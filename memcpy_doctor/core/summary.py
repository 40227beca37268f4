"""Paddle's report figures from aggregated events and copies (definitions in the README)."""

from __future__ import annotations

from .trace import CopyRecord, EventRow, MemcpyFigure, Summary


def summarize(total_ns: int, events: list[EventRow], copies: list[CopyRecord],
              peak_device_memory_bytes: int | None = None) -> Summary:
    """Total time is the run's span; computation is the host time inside ops, copies and
    waits (every row's CPU time); framework overhead is the rest of the host's time."""
    computation = min(sum(e.cpu_ns for e in events), total_ns)
    figures = {}
    for kind, keep in (("all", lambda c: True), ("async", lambda c: not c.sync),
                       ("sync", lambda c: c.sync)):
        chosen = [c for c in copies if keep(c)]
        figures[kind] = MemcpyFigure(sum(c.calls for c in chosen),
                                     sum(c.time_ns for c in chosen))
    return Summary(total_ns=total_ns, computation_ns=computation,
                   overhead_ns=total_ns - computation, memcpy_all=figures["all"],
                   memcpy_async=figures["async"], memcpy_sync=figures["sync"],
                   peak_device_memory_bytes=peak_device_memory_bytes)
