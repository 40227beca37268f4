"""A race in the trace: the host touched a copy's host memory before anything ordered the copy.

The tracer finds them (tracer/races.py); the trace keeps one record per (kind, the copy's site,
the access's site, thread), docs/trace-format.md's `races`. Traces written before races were
looked for load with none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .fields import a_str, an_int, an_object, bad
from .site import Site

#: The kinds: the host read a device->host copy's destination before the copy was ordered,
#: or wrote the host side of a copy still in flight (a host->device copy's source, or a
#: device->host copy's destination).
READ_BEFORE_DONE = "read_before_copy_done"
WRITE_DURING = "write_during_copy"
RACE_KINDS = (READ_BEFORE_DONE, WRITE_DURING)


@dataclass
class RaceRecord:
    kind: str
    #: the copy: its site, direction ("DtoH", "HtoD"), trigger and bytes (of all the calls)
    copy_site: Site | None
    direction: str
    trigger: str
    bytes: int
    #: the host's access: its site and the op (or Python call, `tolist`) that made it
    access_site: Site | None
    op: str
    #: copies that raced with an access at that site (each once, however many ops it ran)
    calls: int
    thread: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind,
                "copy": {"site": _site_dict(self.copy_site), "direction": self.direction,
                         "trigger": self.trigger, "bytes": self.bytes},
                "access": {"site": _site_dict(self.access_site), "op": self.op},
                "calls": self.calls, "thread": self.thread}


def _site_dict(site: Site | None) -> dict[str, Any] | None:
    return None if site is None else asdict(site)  # (as the trace writes every site)


def race_from_dict(d: Any, site: Any) -> RaceRecord:
    """A race read back (`site`: the trace's reader of a site, None allowed)."""
    d = an_object(d, "a race")
    if d.get("kind") not in RACE_KINDS:
        raise bad("a race's kind", d.get("kind"))
    copy, access = an_object(d["copy"], "race.copy"), an_object(d["access"], "race.access")
    thread = d.get("thread")
    return RaceRecord(kind=d["kind"], copy_site=site(copy["site"]),
                      direction=a_str(copy["direction"]), trigger=a_str(copy["trigger"]),
                      bytes=an_int(copy["bytes"]), access_site=site(access["site"]),
                      op=a_str(access["op"]), calls=an_int(d["calls"]),
                      thread=None if thread is None else a_str(thread))
