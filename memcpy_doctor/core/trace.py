"""The trace: one versioned, aggregated record of a profiled run.

Every later stage (the report, `explain`, `check`, `diff`) reads only this. It is aggregated
while the program runs, so its size follows the number of distinct ops, call sites and copy
paths, not the number of iterations. Times are integer nanoseconds; renderers turn them into
milliseconds. Saved as JSON with a `schema_version`, written atomically, never pickled.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from .compiled import CompileInfo
from .races import RaceRecord, race_from_dict
from .defaults import SCHEMA_VERSION, UNKNOWN_DIRECTION
from .fields import a_bool, a_list, a_str, an_int, an_object, bad
from .meta import Meta, meta_from_dict
from .site import Site, TraceError
from .timeline import (EVENT_KINDS, EventTimeline, timeline_from_dict, timeline_json,
                       timeline_to_dict)

DIRECTIONS = ("HtoD", "DtoH", "DtoD")
#: A copy record's directions: a light-mode sync may have none the tracer can know
#: (schema_version 3 and later).
COPY_DIRECTIONS = (*DIRECTIONS, UNKNOWN_DIRECTION)
#: Paddle's names for the copy directions, used in Event Summary row names.
PADDLE_DIRECTION = {"HtoD": "CPU->GPU", "DtoH": "GPU->CPU", "DtoD": "GPU->GPU",
                    UNKNOWN_DIRECTION: "direction unknown"}


def copy_event_name(direction: str, sync: bool) -> str:
    """A copy kind's Event Summary row: "GpuMemcpySync:CPU->GPU", ..."""
    return f"GpuMemcpy{'Sync' if sync else 'Async'}:{PADDLE_DIRECTION[direction]}"



@dataclass(frozen=True)
class OpRef:
    """An op as seen from a copy: the op that made its source, or the first op that read it."""

    op: str
    device: str
    site: Site | None


@dataclass
class MemcpyFigure:
    calls: int
    time_ns: int


@dataclass
class Summary:
    """Paddle's report terms; see the README for each definition."""

    total_ns: int
    computation_ns: int
    overhead_ns: int
    memcpy_all: MemcpyFigure
    memcpy_async: MemcpyFigure
    memcpy_sync: MemcpyFigure
    peak_device_memory_bytes: int | None = None

    def ratio(self, ns: int) -> float:
        return ns / self.total_ns if self.total_ns else 0.0


@dataclass
class EventRow:
    """One Event Summary row: an op, a copy kind, or a host wait, over all its calls."""

    name: str
    calls: int
    cpu_ns: int
    gpu_ns: int
    min_ns: int
    max_ns: int

    @property
    def total_ns(self) -> int:
        return self.cpu_ns + self.gpu_ns


@dataclass
class OpRecord:
    """One op at one call site on one device, over all its calls.

    `run_ns` is the measured wall time of the calls here (on the simulated GPU: modeled, what
    they would cost on the host); `flops` and `bytes` (read and written) are what the cost
    model needs to price the op on either device."""

    op: str
    device: str
    site: Site | None
    calls: int
    host_ns: int
    device_ns: int
    run_ns: int = 0
    flops: int = 0
    bytes: int = 0
    thread: str | None = None  # the thread that ran it, when not the one that traced


@dataclass
class FlowRecord:
    """An edge of the op graph: `consumer` read tensors `producer` made (through copies too)."""

    producer: OpRef
    consumer: OpRef
    calls: int
    bytes: int


@dataclass
class TransferRecord:
    """One copy, in program order (the transfer log, like Paddle's verbose operator log)."""

    seq: int
    direction: str
    sync: bool
    pinned: bool | None
    trigger: str
    bytes: int
    shape: list[int] | None
    dtype: str | None
    site: Site | None
    producer: OpRef | None
    consumer: OpRef | None
    #: whether the call asked `non_blocking=True` (see CopyRecord); None where not known
    non_blocking: bool | None = None


@dataclass
class CopyRecord:
    """One distinct copy path: the same direction, kind, trigger, site, producer and consumer."""

    direction: str
    sync: bool
    pinned: bool | None
    trigger: str
    calls: int
    bytes: int
    host_ns: int
    device_ns: int
    site: Site | None
    stack: list[Site]
    producer: OpRef | None
    consumer: OpRef | None
    shape: list[int] | None = None
    dtype: str | None = None
    thread: str | None = None  # the thread that made it, when not the one that traced
    #: when its first and last calls were made, on the host's clock from the run's start (the
    #: simulated GPU's modeled clock; wall time on a real GPU); None in older traces
    first_ns: int | None = None
    last_ns: int | None = None
    #: where, on its site's line, the call that made its first copy ends (tells two calls on
    #: one line apart); None when not known
    end_col: int | None = None
    #: whether the call asked `non_blocking=True`, whatever the copy then did: a copy from
    #: (or into) pageable memory that asked it is still sync (the host stages it), and shows
    #: here as such; None in older traces and where not known (light mode's sync warnings,
    #: imported traces)
    non_blocking: bool | None = None
    #: the device's idle time after the host's waits for it: from the last device work the
    #: wait saw done to the next work, when the device was busy as the wait began and the
    #: host launched that work after (kineto/idle.py);
    #: None where not measured (memcpy-doctor's own traces, older ones, async copies)
    idle_ns: int | None = None

    @property
    def time_ns(self) -> int:
        """Paddle's event total: host time in the call plus device time of the transfer."""
        return self.host_ns + self.device_ns


@dataclass
class WaitRecord:
    """A host wait that is not a copy (synchronize, stream or event waits) at one site."""

    kind: str
    calls: int
    wait_ns: int
    site: Site | None
    thread: str | None = None  # the thread that waited, when not the one that traced
    idle_ns: int | None = None  # the device's idle time after these waits (see CopyRecord)


@dataclass
class Trace:
    meta: Meta
    summary: Summary
    events: list[EventRow]
    ops: list[OpRecord]
    copies: list[CopyRecord]
    waits: list[WaitRecord]
    flows: list[FlowRecord] = field(default_factory=list)
    transfers: list[TransferRecord] = field(default_factory=list)
    compile: CompileInfo | None = None  # what torch.compile did (core/compiled.py)
    #: the run's first events in order (traces of schema_version 2 and later, from the
    #: tracer; None in older traces, light ones excepted, and in imported ones)
    timeline: EventTimeline | None = None
    #: host accesses to a copy still in flight (core/races.py); none in traces written
    #: before they were looked for, and in light and imported ones
    races: list[RaceRecord] = field(default_factory=list)

    def __repr__(self) -> str:
        """One line: where it ran and what it holds (the report is render_text's)."""
        m, s = self.meta, self.summary
        where = f"simulated {m.device_name}" if m.simulated else m.device_name
        return (f"<Trace of {where}: {s.total_ns / 1e6:.6g} ms, {s.memcpy_all.calls} copies, "
                f"{s.memcpy_sync.calls} waited for>")

    # ----- JSON -----
    def to_dict(self) -> dict[str, Any]:
        s = self.summary
        summary = {
            "total_ns": s.total_ns,
            "computation_ns": s.computation_ns,
            "overhead_ns": s.overhead_ns,
            "peak_device_memory_bytes": s.peak_device_memory_bytes,
            "memcpy": {
                kind: {"calls": fig.calls, "time_ns": fig.time_ns, "time_ms": fig.time_ns / 1e6,
                       "ratio": s.ratio(fig.time_ns)}
                for kind, fig in (("all", s.memcpy_all), ("async", s.memcpy_async),
                                  ("sync", s.memcpy_sync))
            },
        }
        copies = []
        for c in self.copies:
            d = asdict(c)
            d["time_ms"] = c.time_ns / 1e6
            copies.append(d)
        return {
            "schema_version": SCHEMA_VERSION,
            "meta": asdict(self.meta),
            "summary": summary,
            "events": [asdict(e) for e in self.events],
            "ops": [asdict(o) for o in self.ops],
            "copies": copies,
            "waits": [asdict(w) for w in self.waits],
            "flows": [asdict(f) for f in self.flows],
            "transfers": [asdict(t) for t in self.transfers],
            "races": [r.to_dict() for r in self.races],
            **({"compile": self.compile.to_dict()} if self.compile is not None else {}),
            **({"timeline": timeline_to_dict(self.timeline)} if self.timeline is not None
               else {}),
        }

    def to_json(self) -> str:
        """The trace as JSON text: indented, but the timeline's events one to a line (they
        are many, and alike)."""
        d = self.to_dict()
        timeline = d.pop("timeline", None)
        text = json.dumps(d, indent=1, sort_keys=False)
        if timeline is None:
            return text
        return f'{text[:-2]},\n "timeline": {timeline_json(timeline)}\n}}'

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically: a reader sees the old file or the whole new one, never half."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".memcpy_doctor.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    @classmethod
    def from_dict(cls, data: Any) -> Trace:
        """Build a Trace from parsed JSON, checking every field's type; TraceError if not."""
        if not isinstance(data, dict) or "schema_version" not in data:
            raise TraceError("not a memcpy-doctor trace (no schema_version)")
        version = data["schema_version"]
        if type(version) is not int or version < 1:
            raise TraceError(f"schema_version {version!r} is not supported: not a valid version")
        if version > SCHEMA_VERSION:
            raise TraceError(
                f"schema_version {version} is not supported: newer than this memcpy-doctor "
                f"reads (1..{SCHEMA_VERSION}); upgrade memcpy-doctor")
        try:
            s = an_object(data["summary"], "summary")
            mem = an_object(s["memcpy"], "summary.memcpy")
            peak = s.get("peak_device_memory_bytes")
            summary = Summary(
                total_ns=an_int(s["total_ns"]), computation_ns=an_int(s["computation_ns"]),
                overhead_ns=an_int(s["overhead_ns"]),
                memcpy_all=_figure(mem["all"]), memcpy_async=_figure(mem["async"]),
                memcpy_sync=_figure(mem["sync"]),
                peak_device_memory_bytes=None if peak is None else an_int(peak))
            trace = cls(meta=meta_from_dict(data["meta"]), summary=summary,
                        events=[_event(e) for e in a_list(data["events"], "events")],
                        ops=[_op(o) for o in a_list(data["ops"], "ops")],
                        copies=[_copy(c) for c in a_list(data["copies"], "copies")],
                        waits=[_wait(w) for w in a_list(data["waits"], "waits")],
                        flows=[_flow(f) for f in a_list(data.get("flows", []), "flows")],
                        transfers=[_transfer(t)
                                   for t in a_list(data.get("transfers", []), "transfers")],
                        compile=(CompileInfo.from_dict(data["compile"])
                                 if data.get("compile") is not None else None),
                        timeline=(timeline_from_dict(data["timeline"])
                                  if data.get("timeline") is not None else None),
                        races=[race_from_dict(r, _site)
                               for r in a_list(data.get("races", []), "races")])
            for event in trace.timeline.events if trace.timeline is not None else ():
                if not 0 <= event.ref < len(getattr(trace, EVENT_KINDS[event.kind])):
                    raise bad(f"a {event.kind} event's ref", event.ref)
            return trace
        except TraceError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise TraceError(f"malformed trace ({type(e).__name__}: {e})") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> Trace:
        """Read a saved trace; every failure is a TraceError naming the file and the problem."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not a text file") from None
        if not text.strip():
            raise TraceError(f"{path}: empty file")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, or an over-long integer
            raise TraceError(f"{path}: not valid JSON ({e})") from None
        try:
            return cls.from_dict(data)
        except TraceError as e:
            raise TraceError(f"{path}: {e}") from None

    # ----- pandas -----
    def dataframes(self) -> dict[str, Any]:
        """The trace's tables as pandas DataFrames (core/tables.py)."""
        from .tables import dataframes
        return dataframes(self)


def load_trace(path: str | os.PathLike) -> Trace:
    """Load a saved trace (see Trace.load)."""
    return Trace.load(path)


def _thread(d: dict[str, Any]) -> str | None:
    thread = d.get("thread")
    return None if thread is None else a_str(thread, "a thread name")


def _figure(d: Any) -> MemcpyFigure:
    d = an_object(d, "a memcpy figure")
    return MemcpyFigure(calls=an_int(d["calls"]), time_ns=an_int(d["time_ns"]))


def _site(d: Any) -> Site | None:
    if d is None:
        return None
    d = an_object(d, "a site")
    return Site(file=a_str(d["file"]), line=an_int(d["line"], "a line number"),
                function=a_str(d["function"]))


def _ref(d: Any) -> OpRef | None:
    if d is None:
        return None
    d = an_object(d, "an op reference")
    return OpRef(op=a_str(d["op"]), device=a_str(d["device"]), site=_site(d["site"]))


def _event(d: Any) -> EventRow:
    d = an_object(d, "an event")
    return EventRow(name=a_str(d["name"]), calls=an_int(d["calls"]), cpu_ns=an_int(d["cpu_ns"]),
                    gpu_ns=an_int(d["gpu_ns"]), min_ns=an_int(d["min_ns"]),
                    max_ns=an_int(d["max_ns"]))


def _op(d: Any) -> OpRecord:
    d = an_object(d, "an op")
    return OpRecord(op=a_str(d["op"]), device=a_str(d["device"]), site=_site(d["site"]),
                    calls=an_int(d["calls"]), host_ns=an_int(d["host_ns"]),
                    device_ns=an_int(d["device_ns"]), run_ns=an_int(d.get("run_ns", 0)),
                    flops=an_int(d.get("flops", 0)), bytes=an_int(d.get("bytes", 0)),
                    thread=_thread(d))


def _flow(d: Any) -> FlowRecord:
    d = an_object(d, "a flow")
    producer, consumer = _ref(d["producer"]), _ref(d["consumer"])
    if producer is None or consumer is None:
        raise bad("a flow's ends", d)
    return FlowRecord(producer=producer, consumer=consumer, calls=an_int(d["calls"]),
                      bytes=an_int(d["bytes"]))


def _transfer(d: Any) -> TransferRecord:
    d = an_object(d, "a transfer")
    if d.get("direction") not in DIRECTIONS:
        raise bad("a transfer's direction", d.get("direction"))
    pinned, shape, dtype = d.get("pinned"), d.get("shape"), d.get("dtype")
    return TransferRecord(
        seq=an_int(d["seq"]), direction=d["direction"], sync=a_bool(d["sync"], "transfer.sync"),
        pinned=None if pinned is None else a_bool(pinned, "transfer.pinned"),
        trigger=a_str(d["trigger"]), bytes=an_int(d["bytes"]),
        shape=None if shape is None else [an_int(n, "a size") for n in a_list(shape, "shape")],
        dtype=None if dtype is None else a_str(dtype), site=_site(d["site"]),
        producer=_ref(d["producer"]), consumer=_ref(d["consumer"]),
        non_blocking=_optional_bool(d, "non_blocking", "transfer"))


def _wait(d: Any) -> WaitRecord:
    d = an_object(d, "a wait")
    return WaitRecord(kind=a_str(d["kind"]), calls=an_int(d["calls"]), wait_ns=an_int(d["wait_ns"]),
                      site=_site(d["site"]), thread=_thread(d),
                      idle_ns=_optional_int(d, "idle_ns"))


def _copy(d: Any) -> CopyRecord:
    d = an_object(d, "a copy")
    if d.get("direction") not in COPY_DIRECTIONS:
        raise TraceError(f"copy direction {d.get('direction')!r} is not one of "
                         f"{COPY_DIRECTIONS}")
    pinned = d["pinned"]
    shape = d.get("shape")
    dtype = d.get("dtype")
    return CopyRecord(
        direction=d["direction"], sync=a_bool(d["sync"], "copy.sync"),
        pinned=None if pinned is None else a_bool(pinned, "copy.pinned"),
        trigger=a_str(d["trigger"]), calls=an_int(d["calls"]), bytes=an_int(d["bytes"]),
        host_ns=an_int(d["host_ns"]), device_ns=an_int(d["device_ns"]), site=_site(d["site"]),
        stack=[_site(f) for f in a_list(d["stack"], "copy.stack")],
        producer=_ref(d["producer"]), consumer=_ref(d["consumer"]),
        shape=None if shape is None else [an_int(n, "a size") for n in a_list(shape, "shape")],
        dtype=None if dtype is None else a_str(dtype), thread=_thread(d),
        first_ns=_optional_int(d, "first_ns"), last_ns=_optional_int(d, "last_ns"),
        end_col=_optional_int(d, "end_col"),
        non_blocking=_optional_bool(d, "non_blocking", "copy"),
        idle_ns=_optional_int(d, "idle_ns"))


def _optional_int(d: dict[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else an_int(d[key], f"copy.{key}")


def _optional_bool(d: dict[str, Any], key: str, what: str) -> bool | None:
    return None if d.get(key) is None else a_bool(d[key], f"{what}.{key}")
