"""The trace's `timeline`: the run's first events (ops, copies, host waits) in the order they
happened, each naming its aggregated record (docs/trace-format.md, "timeline").

The rest of a trace is aggregated and so keeps no order; what needs the order (explain's
replay of a step, the race checker) reads this. The tracer keeps a bounded prefix of the run
(tracer/events.py): its size does not grow with the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .fields import a_list, a_str, an_int, an_object, bad

#: The kinds of events, and the table of the trace each one's `ref` points into.
EVENT_KINDS = {"op": "ops", "copy": "copies", "wait": "waits"}


@dataclass
class TimelineEvent:
    """One op, copy or host wait: `ref` is its row in the trace's `ops`, `copies` or
    `waits` (by `kind`); times are ns on the host's clock from the run's start (modeled on
    the simulated GPU); the device span is None for host work (and on a real GPU where
    CUDA's events did not place it); `stream` is that of its device work; `reads` and
    `writes` are the storages it read and wrote, by number (the same number while a storage
    lives, a new one for a storage made later at the same address)."""

    kind: str  # "op", "copy" or "wait"
    ref: int
    thread: str | None
    stream: int | None
    host_start_ns: int
    host_end_ns: int
    device_start_ns: int | None
    device_end_ns: int | None
    reads: list[int] = field(default_factory=list)
    writes: list[int] = field(default_factory=list)


@dataclass
class EventTimeline:
    """The run's first events in order: `events`, at most `limit` of them; `dropped`: how
    many the run recorded after those."""

    limit: int
    dropped: int
    events: list[TimelineEvent]


#: The fields of an event, in the order the file writes them (its `fields` says so too).
FIELDS = ("kind", "ref", "thread", "stream", "host_start_ns", "host_end_ns", "device_start_ns",
          "device_end_ns", "reads", "writes")


def timeline_to_dict(t: EventTimeline) -> dict[str, Any]:
    """The timeline as JSON data: each event a list of its FIELDS (named once, in `fields`:
    a tenth of the size of an object per event)."""
    return {"limit": t.limit, "dropped": t.dropped, "fields": list(FIELDS), "events": [
        [e.kind, e.ref, e.thread, e.stream, e.host_start_ns, e.host_end_ns, e.device_start_ns,
         e.device_end_ns, e.reads, e.writes] for e in t.events]}


def timeline_json(d: dict[str, Any]) -> str:
    """`timeline_to_dict`'s output as JSON text with one event to a line (indented to sit
    in the trace's top-level object)."""
    head = json.dumps({k: v for k, v in d.items() if k != "events"})[:-1]
    if not d["events"]:
        return f'{head}, "events": []}}'
    lines = ",\n  ".join(json.dumps(e, separators=(",", ":")) for e in d["events"])
    return f'{head}, "events": [\n  {lines}\n ]}}'


def timeline_from_dict(d: Any) -> EventTimeline:
    """A parsed timeline, every field checked (TraceError if one is wrong). Events are read
    by the names in `fields`, so a later version may add fields."""
    d = an_object(d, "timeline")
    fields = [a_str(f, "a timeline field") for f in a_list(d["fields"], "timeline.fields")]
    missing = [f for f in FIELDS if f not in fields]
    if missing:
        raise bad("timeline.fields", fields)
    at = [fields.index(f) for f in FIELDS]
    return EventTimeline(limit=an_int(d["limit"], "timeline.limit"),
                         dropped=an_int(d["dropped"], "timeline.dropped"),
                         events=[_event(e, at, len(fields))
                                 for e in a_list(d["events"], "timeline.events")])


def _optional_int(v: Any, what: str) -> int | None:
    return None if v is None else an_int(v, what)


def _storages(v: Any, what: str) -> list[int]:
    return [an_int(n, "a storage") for n in a_list(v, what)]


def _event(row: Any, at: list[int], width: int) -> TimelineEvent:
    row = a_list(row, "a timeline event")
    if len(row) != width:
        raise bad("a timeline event", row)
    (kind, ref, thread, stream, host_start, host_end, device_start, device_end, reads,
     writes) = (row[i] for i in at)
    if kind not in EVENT_KINDS:
        raise bad("a timeline event's kind", kind)
    if (device_start is None) != (device_end is None):
        raise bad("an event's device span", [device_start, device_end])
    return TimelineEvent(
        kind=kind, ref=an_int(ref, "an event's ref"),
        thread=None if thread is None else a_str(thread, "a thread name"),
        stream=_optional_int(stream, "an event's stream"),
        host_start_ns=an_int(host_start, "an event's host start"),
        host_end_ns=an_int(host_end, "an event's host end"),
        device_start_ns=_optional_int(device_start, "an event's device start"),
        device_end_ns=_optional_int(device_end, "an event's device end"),
        reads=_storages(reads, "an event's reads"), writes=_storages(writes, "an event's writes"))
