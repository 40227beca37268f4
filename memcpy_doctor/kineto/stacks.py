"""What encloses each runtime call of a torch.profiler (Kineto) trace: the `cpu_op`s around
it, and the Python frames around it when the profile was recorded with `with_stack=True`;
and, per stream, which kernel ran just before or after a copy.

Kept apart from kineto/reader.py, which maps copies, so that each stays small; both read the
events from their store (kineto/events.py; parsed dicts are read into one), and the Python
frames are made sites by kineto/frames.py.
"""

from __future__ import annotations

from typing import Any, Iterable

from .events import COLUMNS, FRAME, KERNEL, OP, RUNTIME, Event, Events, as_events
from .frames import MAX_FRAMES, frame_site, user_frame
from ..core.trace import OpRef, Site


class Enclosing:
    """What encloses the runtime calls and cpu_ops of a store of events (see `enclosing`):
    the ops around each (`ops`), the Python frames around each as sites (`frames`,
    `op_sites`; empty without `with_stack`), and the runtime call of a device event by its
    correlation id (`call`). Answers come from the store's database one event at a time."""

    __slots__ = ("events", "has_python", "_sites")

    def __init__(self, events: Events, has_python: bool) -> None:
        self.events, self.has_python = events, has_python
        self._sites: dict[int, Site | None] = {}  # name number -> its site

    def call(self, corr: Any) -> Event | None:
        """The cuda_runtime call with correlation id `corr` (the last one, should several
        have it); None for None or none."""
        if corr is None:
            return None
        row = self.events.query(f"SELECT {COLUMNS} FROM ev WHERE id = (SELECT call FROM "
                                "callof WHERE corr = ?)", (corr,)).fetchone()
        return self.events.record(row) if row is not None else None

    def ops(self, event: Event | None) -> list[Event]:
        """The cpu_ops enclosing the runtime call or cpu_op `event`, outermost first."""
        if event is None:
            return []
        record = self.events.record
        return [record(r) for r in self.events.query(_WALK.format(
            link="op", cols=", ".join(f"ev.{c}" for c in COLUMNS.split(", ")),
            order="DESC", limit=1 << 30), (event.id,))]

    def frames(self, call: Event | None) -> list[Site]:
        """The Python frames (sites) open at the runtime call `call`, innermost first; empty
        when not known (no `with_stack`, or no call)."""
        return self._frames(call.id) if call is not None else []

    def op_sites(self, op: Event) -> list[Site]:
        """The Python frames (sites) open when the cpu_op `op` started, innermost first;
        empty when not known (no `with_stack`)."""
        return self._frames(op.id)

    def _frames(self, id_: int) -> list[Site]:
        sites, names = self._sites, self.events.names
        out = []
        for (name,) in self.events.query(_WALK.format(link="frame", cols="ev.name",
                                                      order="", limit=MAX_FRAMES), (id_,)):
            site = sites.get(name, _UNSEEN)
            if site is _UNSEEN:
                site = sites[name] = frame_site(names[name] if names[name] is not None else "")
            out.append(site)
        return out


_UNSEEN = object()
#: The events up a chain of links (`op`: the ops around an event, `frame`: the user-visible
#: frames around it), innermost at depth 0.
_WALK = ("WITH RECURSIVE up(id, depth) AS (SELECT {link}, 0 FROM link WHERE id = ?1 "
         "UNION ALL SELECT link.{link}, up.depth + 1 FROM link JOIN up ON link.id = up.id "
         "WHERE up.depth + 1 < {limit}) "
         "SELECT {cols} FROM up JOIN ev ON ev.id = up.id ORDER BY up.depth {order}")


def enclosing(events: Iterable[Any]) -> Enclosing:
    """One sweep per thread over its cpu_op, python_function and cuda_runtime events, sorted
    by start, longest first (the database sorts them, on disk when they are many), keeping
    the ops and the user-visible frames still open; each runtime call and cpu_op gets a row
    of table `link`: the innermost op open at it (`op`) and the innermost user-visible frame
    (`frame`), and each user-visible frame one with the frame around it, so that chains of
    them are walked up by id. Done once per store (parsed dicts are read into one first);
    the correlation ids of the runtime calls are indexed (table `callof`) with it."""
    events = as_events(events)
    found = events.derived.get("enclosing")
    if found is not None:
        return found
    db = events.db
    db.execute("CREATE TABLE link (id INTEGER PRIMARY KEY, op INT, frame INT)")
    rows: list[tuple] = []
    db.execute("BEGIN")
    thread = None
    ops: list[tuple[float, int]] = []  # (end, id) of the ops open
    frames: list[tuple[float, int | None]] = []  # (end, innermost user-visible frame)
    for id_, k, th, ts, dur in db.execute(
            f"SELECT id, k, th, ts, dur FROM ev WHERE k <= {RUNTIME} AND ph = 'X' "
            "ORDER BY th, ts, dur DESC, id"):
        if th != thread:
            thread, ops, frames = th, [], []
        while ops and ops[-1][0] < ts:
            ops.pop()
        while frames and frames[-1][0] < ts:
            frames.pop()
        head = frames[-1][1] if frames else None
        if k == FRAME:  # a site: events.py keeps no other frames
            rows.append((id_, None, head))
            frames.append((ts + dur, id_))
        else:
            rows.append((id_, ops[-1][1] if ops else None, head))
            if k == OP:
                ops.append((ts + dur, id_))
        if len(rows) >= 4096:
            db.executemany("INSERT INTO link VALUES (?, ?, ?)", rows)
            rows.clear()
    db.executemany("INSERT INTO link VALUES (?, ?, ?)", rows)
    db.execute("CREATE TABLE callof (corr PRIMARY KEY, call INT)")
    db.execute(f"INSERT OR REPLACE INTO callof SELECT corr, id FROM ev WHERE k = {RUNTIME} "
               "AND corr IS NOT NULL ORDER BY id")
    db.execute("COMMIT")
    found = events.derived["enclosing"] = Enclosing(events, events.has_python)
    return found


class Streams:
    """Each stream's kernels by start (an index of the store's database), to find the one that
    ran just before a copy (its producer, inferred) or just after one."""

    def __init__(self, events: Events) -> None:
        self._events = events
        events.query(f"CREATE INDEX IF NOT EXISTS kernels ON ev(sk, ts, id) WHERE k = {KERNEL}")

    def before(self, copy: Event) -> Event | None:
        """The last kernel on `copy`'s stream that started before it."""
        return self._one("ts < ? ORDER BY ts DESC, id DESC", copy)

    def after(self, copy: Event) -> Event | None:
        """The first kernel on `copy`'s stream that started after it."""
        return self._one("ts >= ? ORDER BY ts, id", copy)

    def _one(self, condition: str, copy: Event) -> Event | None:
        row = self._events.query(
            f"SELECT {COLUMNS} FROM ev WHERE k = {KERNEL} AND sk = (SELECT sk FROM ev "
            f"WHERE id = ?) AND {condition} LIMIT 1", (copy.id, copy.ts)).fetchone()
        return self._events.record(row) if row is not None else None


def inferred_ref(kernel: Event | None, found: Enclosing) -> OpRef | None:
    """The op that launched `kernel` (its innermost cpu_op, through the correlation id), or
    the kernel's own name when no op is recorded, labelled as inferred: the trace does not
    say which tensors a kernel read or wrote."""
    if kernel is None:
        return None
    call = found.call(kernel.corr)
    ops = found.ops(call)
    name = (ops[-1].name or "") if ops else (
        kernel.name if kernel.name is not None else "kernel")[:60]
    return OpRef(f"{name} (inferred)", "cuda", user_frame(found.frames(call)))
