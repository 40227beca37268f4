"""The run a trace records (`Trace.meta`): where and how it ran, how it ended, what the
tracer could not see, and what tells one run's ranks apart from another run's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import a_bool, a_list, a_str, an_int, an_object


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
    #: when the recording began, in ns since the Unix epoch (None in older traces, and in a
    #: torch.profiler trace whose timestamps are not absolute): traces of one run's ranks
    #: began together (run/traces.py one_run)
    started_ns: int | None = None
    #: a torch.profiler trace's `distributedInfo` fields that every rank of one run shares
    #: (backend, world_size, nccl_version); None for memcpy-doctor's own traces
    distributed: dict[str, Any] | None = None



def meta_from_dict(d: Any) -> Meta:
    """The Meta of a saved trace's `meta` object (TraceError where a field is malformed)."""
    d = an_object(d, "meta")
    profile = d.get("device_profile")
    status = d.get("exit_status")
    rank, world_size = d.get("rank"), d.get("world_size")
    return Meta(device=a_str(d["device"]), simulated=a_bool(d["simulated"], "meta.simulated"),
                device_name=a_str(d["device_name"]),
                device_profile=None if profile is None else an_object(profile, "device_profile"),
                torch_version=a_str(d["torch_version"]),
                command=[a_str(c) for c in a_list(d["command"], "meta.command")],
                exit_status=None if status is None else an_int(status, "exit_status"),
                ended_by=a_str(d.get("ended_by", "completed")),
                memcpy_doctor_version=a_str(d.get("memcpy_doctor_version", "")),
                untraced=[a_str(u) for u in a_list(d.get("untraced", []), "meta.untraced")],
                rank=None if rank is None else an_int(rank, "meta.rank"),
                world_size=None if world_size is None else an_int(world_size, "meta.world_size"),
                wall_ns=None if d.get("wall_ns") is None else an_int(d["wall_ns"], "meta.wall_ns"),
                imported_from=None if d.get("imported_from") is None
                else a_str(d["imported_from"]),
                light=a_bool(d.get("light", False), "meta.light"),
                started_ns=None if d.get("started_ns") is None
                else an_int(d["started_ns"], "meta.started_ns"),
                distributed=None if d.get("distributed") is None
                else an_object(d["distributed"], "meta.distributed"))
