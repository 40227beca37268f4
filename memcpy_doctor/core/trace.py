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
from .defaults import SCHEMA_VERSION
from .site import Site, TraceError

DIRECTIONS = ("HtoD", "DtoH", "DtoD")
#: Paddle's names for the copy directions, used in Event Summary row names.
PADDLE_DIRECTION = {"HtoD": "CPU->GPU", "DtoH": "GPU->CPU", "DtoD": "GPU->GPU"}


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
class Meta:
    device: str  # "cuda" or "sim"
    simulated: bool
    device_name: str
    device_profile: dict[str, Any] | None
    torch_version: str
    command: list[str]
    exit_status: int | None = None
    # completed | exception | exit | interrupt | os._exit | a signal's name (SIGTERM, SIGHUP)
    ended_by: str = "completed"
    memcpy_doctor_version: str = ""
    untraced: list[str] = field(default_factory=list)  # what the tracer could not see
    # One of several ranks (torchrun, `profile --ranks`): RANK and WORLD_SIZE of the process;
    # None for a single-process run and in traces written before these fields existed.
    rank: int | None = None
    world_size: int | None = None
    wall_ns: int | None = None  # as traced; in no simulated figure (docs/sim-time.md)
    imported_from: str | None = None  # a torch.profiler trace's file (kineto/reader.py)
    #: recorded by `profile --light` (tracer/light.py): syncs only, no ops; False in older
    #: traces
    light: bool = False


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
            **({"compile": self.compile.to_dict()} if self.compile is not None else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False)

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
            s = _obj(data["summary"], "summary")
            mem = _obj(s["memcpy"], "summary.memcpy")
            peak = s.get("peak_device_memory_bytes")
            summary = Summary(
                total_ns=_int(s["total_ns"]), computation_ns=_int(s["computation_ns"]),
                overhead_ns=_int(s["overhead_ns"]),
                memcpy_all=_figure(mem["all"]), memcpy_async=_figure(mem["async"]),
                memcpy_sync=_figure(mem["sync"]),
                peak_device_memory_bytes=None if peak is None else _int(peak))
            return cls(meta=_meta(data["meta"]), summary=summary,
                       events=[_event(e) for e in _list(data["events"], "events")],
                       ops=[_op(o) for o in _list(data["ops"], "ops")],
                       copies=[_copy(c) for c in _list(data["copies"], "copies")],
                       waits=[_wait(w) for w in _list(data["waits"], "waits")],
                       flows=[_flow(f) for f in _list(data.get("flows", []), "flows")],
                       transfers=[_transfer(t)
                                  for t in _list(data.get("transfers", []), "transfers")],
                       compile=(CompileInfo.from_dict(data["compile"])
                                if data.get("compile") is not None else None))
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


def _bad(what: str, value: Any) -> TraceError:
    return TraceError(f"malformed trace: {what} is {value!r:.60}")


def _int(v: Any, what: str = "a count or time") -> int:
    if type(v) is not int:
        raise _bad(what, v)
    return v


def _str(v: Any, what: str = "a name") -> str:
    if not isinstance(v, str):
        raise _bad(what, v)
    return v


def _bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise _bad(what, v)
    return v


def _obj(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _bad(what, v)
    return v


def _list(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise _bad(what, v)
    return v


def _meta(d: Any) -> Meta:
    d = _obj(d, "meta")
    profile = d.get("device_profile")
    status = d.get("exit_status")
    rank, world_size = d.get("rank"), d.get("world_size")
    return Meta(device=_str(d["device"]), simulated=_bool(d["simulated"], "meta.simulated"),
                device_name=_str(d["device_name"]),
                device_profile=None if profile is None else _obj(profile, "device_profile"),
                torch_version=_str(d["torch_version"]),
                command=[_str(c) for c in _list(d["command"], "meta.command")],
                exit_status=None if status is None else _int(status, "exit_status"),
                ended_by=_str(d.get("ended_by", "completed")),
                memcpy_doctor_version=_str(d.get("memcpy_doctor_version", "")),
                untraced=[_str(u) for u in _list(d.get("untraced", []), "meta.untraced")],
                rank=None if rank is None else _int(rank, "meta.rank"),
                world_size=None if world_size is None else _int(world_size, "meta.world_size"),
                wall_ns=None if d.get("wall_ns") is None else _int(d["wall_ns"], "meta.wall_ns"),
                imported_from=None if d.get("imported_from") is None
                else _str(d["imported_from"]),
                light=_bool(d.get("light", False), "meta.light"))


def _thread(d: dict[str, Any]) -> str | None:
    thread = d.get("thread")
    return None if thread is None else _str(thread, "a thread name")


def _figure(d: Any) -> MemcpyFigure:
    d = _obj(d, "a memcpy figure")
    return MemcpyFigure(calls=_int(d["calls"]), time_ns=_int(d["time_ns"]))


def _site(d: Any) -> Site | None:
    if d is None:
        return None
    d = _obj(d, "a site")
    return Site(file=_str(d["file"]), line=_int(d["line"], "a line number"),
                function=_str(d["function"]))


def _ref(d: Any) -> OpRef | None:
    if d is None:
        return None
    d = _obj(d, "an op reference")
    return OpRef(op=_str(d["op"]), device=_str(d["device"]), site=_site(d["site"]))


def _event(d: Any) -> EventRow:
    d = _obj(d, "an event")
    return EventRow(name=_str(d["name"]), calls=_int(d["calls"]), cpu_ns=_int(d["cpu_ns"]),
                    gpu_ns=_int(d["gpu_ns"]), min_ns=_int(d["min_ns"]),
                    max_ns=_int(d["max_ns"]))


def _op(d: Any) -> OpRecord:
    d = _obj(d, "an op")
    return OpRecord(op=_str(d["op"]), device=_str(d["device"]), site=_site(d["site"]),
                    calls=_int(d["calls"]), host_ns=_int(d["host_ns"]),
                    device_ns=_int(d["device_ns"]), run_ns=_int(d.get("run_ns", 0)),
                    flops=_int(d.get("flops", 0)), bytes=_int(d.get("bytes", 0)),
                    thread=_thread(d))


def _flow(d: Any) -> FlowRecord:
    d = _obj(d, "a flow")
    producer, consumer = _ref(d["producer"]), _ref(d["consumer"])
    if producer is None or consumer is None:
        raise _bad("a flow's ends", d)
    return FlowRecord(producer=producer, consumer=consumer, calls=_int(d["calls"]),
                      bytes=_int(d["bytes"]))


def _transfer(d: Any) -> TransferRecord:
    d = _obj(d, "a transfer")
    if d.get("direction") not in DIRECTIONS:
        raise _bad("a transfer's direction", d.get("direction"))
    pinned, shape, dtype = d.get("pinned"), d.get("shape"), d.get("dtype")
    return TransferRecord(
        seq=_int(d["seq"]), direction=d["direction"], sync=_bool(d["sync"], "transfer.sync"),
        pinned=None if pinned is None else _bool(pinned, "transfer.pinned"),
        trigger=_str(d["trigger"]), bytes=_int(d["bytes"]),
        shape=None if shape is None else [_int(n, "a size") for n in _list(shape, "shape")],
        dtype=None if dtype is None else _str(dtype), site=_site(d["site"]),
        producer=_ref(d["producer"]), consumer=_ref(d["consumer"]))


def _wait(d: Any) -> WaitRecord:
    d = _obj(d, "a wait")
    return WaitRecord(kind=_str(d["kind"]), calls=_int(d["calls"]), wait_ns=_int(d["wait_ns"]),
                      site=_site(d["site"]), thread=_thread(d))


def _copy(d: Any) -> CopyRecord:
    d = _obj(d, "a copy")
    if d.get("direction") not in DIRECTIONS:
        raise TraceError(f"copy direction {d.get('direction')!r} is not one of {DIRECTIONS}")
    pinned = d["pinned"]
    shape = d.get("shape")
    dtype = d.get("dtype")
    return CopyRecord(
        direction=d["direction"], sync=_bool(d["sync"], "copy.sync"),
        pinned=None if pinned is None else _bool(pinned, "copy.pinned"),
        trigger=_str(d["trigger"]), calls=_int(d["calls"]), bytes=_int(d["bytes"]),
        host_ns=_int(d["host_ns"]), device_ns=_int(d["device_ns"]), site=_site(d["site"]),
        stack=[_site(f) for f in _list(d["stack"], "copy.stack")],
        producer=_ref(d["producer"]), consumer=_ref(d["consumer"]),
        shape=None if shape is None else [_int(n, "a size") for n in _list(shape, "shape")],
        dtype=None if dtype is None else _str(dtype), thread=_thread(d),
        first_ns=_optional_int(d, "first_ns"), last_ns=_optional_int(d, "last_ns"),
        end_col=_optional_int(d, "end_col"))


def _optional_int(d: dict[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else _int(d[key], f"copy.{key}")
