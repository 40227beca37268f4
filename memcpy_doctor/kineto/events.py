"""A torch.profiler trace's events as the kineto/ readers keep them: one small record per event
they look at, made as the event is read, so that memory follows the events kept, not the file.

`json.loads` of a trace holds every event whole: `Input Dims`, kernel occupancies, flow ids,
each in a dict of its own, six times the file in Python objects. The readers need eleven
fields of six categories of events (`cpu_op`, `python_function`, `cuda_runtime`, `kernel`,
`gpu_memcpy`, `gpu_memset`); of every other event, only its category and its time span (the
trace's span and the check for CUDA activity read them). `Events` is what is kept: a list of
`Event` records, the categories seen, the span, and the first event that could not be read.

How a field is read keeps what the dict readers did with it: `ts` and `dur` as floats (`dur`
0 where absent), `args.stream` falling back to the thread, the rest as JSON gave it, None
where absent (a field given as `null` reads as absent). An event whose `ts`/`dur` is not a
number, or whose `args` is not an object, is kept out, and its error (the one the dict
readers raised: `could not convert string to float: 'soon'`, `'list' object has no
attribute 'get'`) is raised when the events are mapped (`Events.check`), so a malformed trace
still gets one line naming it.
"""

from __future__ import annotations

from typing import Any, Iterable

#: The categories of events the readers use; of the others only the category and span count.
KEPT_CATEGORIES = frozenset(("cpu_op", "python_function", "cuda_runtime", "kernel",
                             "gpu_memcpy", "gpu_memset"))


class Event:
    """One kept event: its phase, category, name, process and thread, start and duration
    (microseconds, floats), and from its `args`: `correlation`, the stream (`stream`, else the
    thread), `bytes` and `Record function id` (`rf`)."""

    __slots__ = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "corr", "stream", "nbytes",
                 "rf")

    def __init__(self, ph: Any, cat: Any, name: Any, pid: Any, tid: Any, ts: float,
                 dur: float, corr: Any, stream: Any, nbytes: Any, rf: Any) -> None:
        self.ph, self.cat, self.name, self.pid, self.tid = ph, cat, name, pid, tid
        self.ts, self.dur, self.corr, self.stream, self.nbytes, self.rf = (
            ts, dur, corr, stream, nbytes, rf)

    def __repr__(self) -> str:
        return f"Event({self.cat!r}, {self.name!r}, ts={self.ts}, dur={self.dur})"


class Events(list):
    """The kept events of one trace, in file order, with what is read from all of them: the
    categories (`cats`), the earliest start and latest end (`start`, `end`, None when no
    event has a start), the first error an event raised (`error`), and how many elements
    were read (`seen`). A list, so that `is_kineto` and the code that reads `traceEvents`
    see one."""

    def __init__(self) -> None:
        super().__init__()
        self.cats: set[Any] = set()
        self.start: float | None = None
        self.end: float | None = None
        self.error: Exception | None = None
        self.seen = 0

    def read(self, elements: Iterable[Any]) -> None:
        """Read the elements of `traceEvents` as they are parsed (see the module docstring).
        The read's hot path: one pass, each event cut to a record as it comes."""
        cats, append, kept = self.cats, self.append, KEPT_CATEGORIES
        names: dict[str, str] = {}  # one copy of each repeated name
        start = float("inf") if self.start is None else self.start
        end = float("-inf") if self.end is None else self.end
        seen = self.seen
        for e in elements:
            seen += 1
            self.seen = seen
            if e.__class__ is not dict or "ts" not in e:
                continue
            try:
                cat = e.get("cat")
                cats.add(cat)
                ts = float(e["ts"])
                dur = e.get("dur")
                dur = 0.0 if dur is None else float(dur)
                if ts < start:
                    start = ts
                if ts + dur > end:
                    end = ts + dur
                if cat not in kept:
                    continue
                args = e.get("args", _NO_ARGS)
                if args.__class__ is not dict:
                    args.get  # noqa: B018 -- the AttributeError the dict readers raised
                name = e.get("name")
                if name.__class__ is str:
                    name = names.setdefault(name, name)
                tid = e.get("tid")
                append(Event(e.get("ph"), cat, name, e.get("pid"), tid, ts, dur,
                             args.get("correlation"), args.get("stream", tid),
                             args.get("bytes"), args.get("Record function id")))
            except (TypeError, ValueError, AttributeError) as err:
                if self.error is None:
                    self.error = err
        if start <= end:
            self.start, self.end = start, end

    def check(self) -> None:
        """Raise the error of the first event that could not be read, if one could not."""
        if self.error is not None:
            raise self.error


_NO_ARGS: dict = {}


def as_events(events: Iterable[Any]) -> Events:
    """`events` as Events: as they are when they already are; records gathered as they are
    (their span and errors were read with them); else parsed dicts, read."""
    if isinstance(events, Events):
        return events
    events = list(events)
    out = Events()
    if events and all(isinstance(e, Event) for e in events):
        out.extend(events)
        out.cats.update(e.cat for e in events)
    else:
        out.read(events)
    return out
