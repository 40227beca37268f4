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

from .defaults import SCHEMA_VERSION

DIRECTIONS = ("HtoD", "DtoH", "DtoD")
#: Paddle's names for the copy directions, used in Event Summary row names.
PADDLE_DIRECTION = {"HtoD": "CPU->GPU", "DtoH": "GPU->CPU", "DtoD": "GPU->GPU"}


class TraceError(Exception):
    """A trace file that cannot be read: missing, not JSON, not a trace, or a newer schema."""


@dataclass(frozen=True)
class Site:
    """A place in the user's code: absolute file path, line number, function name."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


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
    ended_by: str = "completed"  # completed | exception | exit | interrupt
    memcpy_doctor_version: str = ""
    untraced: list[str] = field(default_factory=list)  # what the tracer could not see


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
    """One op at one call site on one device, over all its calls."""

    op: str
    device: str
    site: Site | None
    calls: int
    host_ns: int
    device_ns: int


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


@dataclass
class Trace:
    meta: Meta
    summary: Summary
    events: list[EventRow]
    ops: list[OpRecord]
    copies: list[CopyRecord]
    waits: list[WaitRecord]

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
        if not isinstance(data, dict) or "schema_version" not in data:
            raise TraceError("not a memcpy-doctor trace (no schema_version)")
        version = data["schema_version"]
        if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
            raise TraceError(
                f"schema_version {version!r} is not supported (this memcpy-doctor reads "
                f"1..{SCHEMA_VERSION}); upgrade memcpy-doctor")
        try:
            s = data["summary"]
            mem = s["memcpy"]
            summary = Summary(
                total_ns=int(s["total_ns"]), computation_ns=int(s["computation_ns"]),
                overhead_ns=int(s["overhead_ns"]),
                memcpy_all=_figure(mem["all"]), memcpy_async=_figure(mem["async"]),
                memcpy_sync=_figure(mem["sync"]),
                peak_device_memory_bytes=s.get("peak_device_memory_bytes"))
            return cls(
                meta=Meta(**data["meta"]),
                summary=summary,
                events=[EventRow(**e) for e in data["events"]],
                ops=[OpRecord(**{**o, "site": _site(o["site"])}) for o in data["ops"]],
                copies=[_copy(c) for c in data["copies"]],
                waits=[WaitRecord(**{**w, "site": _site(w["site"])}) for w in data["waits"]],
            )
        except TraceError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
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
        except (json.JSONDecodeError, RecursionError) as e:
            raise TraceError(f"{path}: not valid JSON ({e})") from None
        try:
            return cls.from_dict(data)
        except TraceError as e:
            raise TraceError(f"{path}: {e}") from None

    # ----- pandas -----
    def dataframes(self) -> dict[str, Any]:
        """The trace's tables as pandas DataFrames, units in the column names."""
        import pandas as pd

        def flat_site(prefix: str, site: Site | None) -> dict[str, Any]:
            return {f"{prefix}file": site.file if site else None,
                    f"{prefix}line": site.line if site else None,
                    f"{prefix}function": site.function if site else None}

        def flat_ref(prefix: str, ref: OpRef | None) -> dict[str, Any]:
            return {f"{prefix}op": ref.op if ref else None,
                    f"{prefix}device": ref.device if ref else None,
                    **flat_site(prefix + "site_", ref.site if ref else None)}

        events = pd.DataFrame([
            {"event": e.name, "calls": e.calls, "cpu_time_ns": e.cpu_ns, "gpu_time_ns": e.gpu_ns,
             "total_time_ns": e.total_ns, "min_time_ns": e.min_ns, "max_time_ns": e.max_ns}
            for e in self.events])
        ops = pd.DataFrame([
            {"op": o.op, "device": o.device, **flat_site("", o.site), "calls": o.calls,
             "host_time_ns": o.host_ns, "device_time_ns": o.device_ns} for o in self.ops])
        copies = pd.DataFrame([
            {"direction": c.direction, "sync": c.sync, "pinned": c.pinned, "trigger": c.trigger,
             "calls": c.calls, "bytes": c.bytes, "host_time_ns": c.host_ns,
             "device_time_ns": c.device_ns, **flat_site("", c.site),
             **flat_ref("producer_", c.producer), **flat_ref("consumer_", c.consumer)}
            for c in self.copies])
        waits = pd.DataFrame([
            {"kind": w.kind, "calls": w.calls, "wait_time_ns": w.wait_ns, **flat_site("", w.site)}
            for w in self.waits])
        return {"events": events, "ops": ops, "copies": copies, "waits": waits}


def load_trace(path: str | os.PathLike) -> Trace:
    """Load a saved trace (see Trace.load)."""
    return Trace.load(path)


def _figure(d: dict[str, Any]) -> MemcpyFigure:
    return MemcpyFigure(calls=int(d["calls"]), time_ns=int(d["time_ns"]))


def _site(d: dict[str, Any] | None) -> Site | None:
    if d is None:
        return None
    return Site(file=str(d["file"]), line=int(d["line"]), function=str(d["function"]))


def _ref(d: dict[str, Any] | None) -> OpRef | None:
    if d is None:
        return None
    return OpRef(op=str(d["op"]), device=str(d["device"]), site=_site(d["site"]))


def _copy(d: dict[str, Any]) -> CopyRecord:
    d = dict(d)
    d.pop("time_ms", None)
    if d.get("direction") not in DIRECTIONS:
        raise TraceError(f"copy direction {d.get('direction')!r} is not one of {DIRECTIONS}")
    d["site"] = _site(d["site"])
    d["stack"] = [_site(s) for s in d["stack"]]
    d["producer"] = _ref(d["producer"])
    d["consumer"] = _ref(d["consumer"])
    return CopyRecord(**d)
