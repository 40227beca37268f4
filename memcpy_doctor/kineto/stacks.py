"""What encloses each runtime call of a torch.profiler (Kineto) trace: the `cpu_op`s around
it, and the Python frames around it when the profile was recorded with `with_stack=True`;
and, per stream, which kernel ran just before or after a copy.

Kept apart from kineto/reader.py, which maps copies, so that each stays small; both read the
events from their store (kineto/events.py; parsed dicts are read into one), and the Python
frames are made sites by kineto/frames.py.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from .events import (COLUMNS, FRAME, KERNEL, MEMCPY, OP, RUNTIME, Event, Events,
                     as_events)
from .frames import MAX_FRAMES, frame_site, user_frame
from ..core.trace import OpRef, Site


class Enclosing:
    """What encloses the runtime calls and cpu_ops of a store of events (see `enclosing`):
    what is around each copy (`copies`: its call, the ops and frames around the call, its
    wait, the kernels before and after it, whose ops `inferred` names), and the frames
    around a cpu_op (`op_sites`); frames are sites, empty without `with_stack`. Answers
    come from the store's database, one copy at a time."""

    __slots__ = ("events", "has_python", "_sites", "_chains")

    def __init__(self, events: Events, has_python: bool) -> None:
        self.events, self.has_python = events, has_python
        self._sites: dict[int, Site | None] = {}  # name number -> its site
        self._chains: dict[int, list[Site]] = {}  # frame id -> its sites (_frames)

    def copies(self, stream_sync: int) -> Iterator[Around]:
        """What is around each gpu_memcpy event, in the trace's order, read in one query (see
        Around); `stream_sync`: the name number of cudaStreamSynchronize."""
        events, record = self.events, self.events.record
        events.query(f"CREATE INDEX IF NOT EXISTS kernels ON ev(sk, ts, id) WHERE k = {KERNEL}")
        events.query(f"CREATE INDEX IF NOT EXISTS waits ON ev(th, name, ts) WHERE k = {RUNTIME}")
        w = len(_EV)
        for row in events.query(_COPIES, (stream_sync,)):
            copy = record(row[:w])
            call = record(row[w:2 * w]) if row[w] is not None else None
            frame, wait, wait_ns = row[2 * w:2 * w + 3]
            before = row[2 * w + 3:2 * w + 7]
            at = 2 * w + 7
            ops = [record(row[at + i * w:at + (i + 1) * w]) for i in (2, 1, 0)
                   if row[at + i * w] is not None]
            above = row[at + 3 * w]  # ops around the third: walked up one by one
            if above is not None:
                ops[:0] = [record(r) for r in events.query(_OPS, (above,))]
            yield Around(copy, call, ops, self._frames(frame), wait, wait_ns, before)

    def launches(self, stream_sync: int) -> Iterator[Around]:
        """What is around each copy's runtime call (`cudaMemcpy*`) of a trace that holds no
        device activity (recorded without ProfilerActivity.CUDA, or CUPTI's runtime calls
        alone): an Around with no copy and no kernel before it, in the trace's order."""
        events, record = self.events, self.events.record
        events.query(f"CREATE INDEX IF NOT EXISTS waits ON ev(th, name, ts) WHERE k = {RUNTIME}")
        w = len(_EV)
        copy_calls = [i for i, name in enumerate(events.names)
                      if isinstance(name, str) and name.startswith("cudaMemcpy")]
        marks = ",".join("?" * len(copy_calls))
        for row in events.query(_LAUNCHES.format(marks=marks), (stream_sync, *copy_calls)):
            call = record(row[:w])
            frame, wait, wait_ns, op = row[w:w + 4]
            ops = [record(r) for r in events.query(_OPS, (op,))] if op is not None else []
            yield Around(None, call, ops, self._frames(frame), wait, wait_ns, _NO_KERNEL)

    def inferred(self, kernel: tuple) -> OpRef | None:
        """The op that launched the kernel before a copy (Around.before): its call's innermost
        cpu_op, labelled as inferred (the trace does not say which tensors a kernel read or
        wrote); None when no op is recorded (a kernel's name is not an op's)."""
        id_, kernel_name, op_name, frame = kernel
        if id_ is None or op_name is None:  # (a kernel's own name is no op: issue 43)
            return None
        name = self.events.names[op_name] or ""
        return OpRef(f"{name} (inferred)", "cuda", user_frame(self._frames(frame)))

    def op_sites(self, op: Event) -> list[Site]:
        """The Python frames (sites) open when the cpu_op `op` started, innermost first;
        empty when not known (no `with_stack`)."""
        row = self.events.query("SELECT frame FROM link WHERE id = ?", (op.id,)).fetchone()
        return self._frames(row[0]) if row is not None else []

    def _frames(self, head: int | None) -> list[Site]:
        """The sites of the user-visible frame `head` (an event id) and those around it,
        innermost first, at most MAX_FRAMES. The copies of a loop share their frames, so
        the last chains asked for are kept (a bounded number)."""
        if head is None:
            return []
        chain = self._chains.get(head)
        if chain is None:
            sites, names = self._sites, self.events.names
            chain = []
            for (name,) in self.events.query(_FRAMES, (head,)):
                site = sites.get(name, _UNSEEN)
                if site is _UNSEEN:
                    site = sites[name] = frame_site(
                        names[name] if names[name] is not None else "")
                chain.append(site)
            if len(self._chains) >= _CHAINS_KEPT:
                self._chains.clear()
            self._chains[head] = chain
        return list(chain)


_UNSEEN = object()
#: Frame chains kept by Enclosing._frames before it starts afresh.
_CHAINS_KEPT = 1024
_EV = COLUMNS.split(", ")
#: An op (by id) and the ops around it, outermost first.
_OPS = ("WITH RECURSIVE up(id, depth) AS (SELECT ?1, 0 UNION ALL SELECT link.op, up.depth + 1 "
        "FROM link JOIN up ON link.id = up.id WHERE link.op IS NOT NULL) "
        f"SELECT {', '.join(f'ev.{c}' for c in _EV)} FROM up JOIN ev ON ev.id = up.id "
        "ORDER BY up.depth DESC")
#: Each gpu_memcpy event (in the trace's order) with its runtime call (by correlation id,
#: the last call with it), the innermost frame around the call, the first stream sync (?1)
#: on the call's thread from its end to its innermost op's end, the kernel that started
#: last before it on its stream, with its call's innermost op's name and frame, and the three innermost ops around the call (most copies have no more)
#: with the id of the op around the third.
_COPIES = f"""
SELECT {', '.join(f'm.{c}' for c in _EV)}, {', '.join(f'c.{c}' for c in _EV)},
  link.frame, q.wait, w.ns,
  kb.id, kb.name, kbop.name, kbl.frame,
  {', '.join(f'o1.{c}' for c in _EV)}, {', '.join(f'o2.{c}' for c in _EV)},
  {', '.join(f'o3.{c}' for c in _EV)}, l3.op
FROM (
  SELECT m.id AS id, c.id AS call,
    (SELECT w.id FROM ev AS w WHERE w.k = {RUNTIME} AND w.th = c.th AND w.name = ?1
       AND w.ts BETWEEN c.ts + c.dur AND op.ts + op.dur ORDER BY w.id LIMIT 1) AS wait,
    (SELECT b.id FROM ev AS b WHERE b.k = {KERNEL} AND b.sk = m.sk AND b.ts < m.ts
       ORDER BY b.ts DESC, b.id DESC LIMIT 1) AS before
  FROM ev AS m
  LEFT JOIN callof ON callof.corr = m.corr
  LEFT JOIN ev AS c ON c.id = callof.call
  LEFT JOIN link ON link.id = c.id
  LEFT JOIN ev AS op ON op.id = link.op
  WHERE m.k = {MEMCPY}
) AS q
JOIN ev AS m ON m.id = q.id
LEFT JOIN ev AS c ON c.id = q.call
LEFT JOIN link ON link.id = q.call
LEFT JOIN ev AS w ON w.id = q.wait
LEFT JOIN ev AS kb ON kb.id = q.before
LEFT JOIN callof AS kbc ON kbc.corr = kb.corr
LEFT JOIN link AS kbl ON kbl.id = kbc.call
LEFT JOIN ev AS kbop ON kbop.id = kbl.op
LEFT JOIN ev AS o1 ON o1.id = link.op
LEFT JOIN link AS l1 ON l1.id = link.op
LEFT JOIN ev AS o2 ON o2.id = l1.op
LEFT JOIN link AS l2 ON l2.id = l1.op
LEFT JOIN ev AS o3 ON o3.id = l2.op
LEFT JOIN link AS l3 ON l3.id = l2.op
ORDER BY m.id"""
#: Each copy's runtime call (names ?2...) of a trace without device activity, with the
#: innermost frame around it, the first stream sync (?1) on its thread from its end to its
#: innermost op's end, and that op.
_LAUNCHES = f"""
SELECT {', '.join(f'c.{c}' for c in _EV)}, q.frame, q.wait, w.ns, q.op
FROM (
  SELECT c.id AS id, link.frame AS frame, link.op AS op,
    (SELECT w.id FROM ev AS w WHERE w.k = {RUNTIME} AND w.th = c.th AND w.name = ?1
       AND w.ts BETWEEN c.ts + c.dur AND op.ts + op.dur ORDER BY w.id LIMIT 1) AS wait
  FROM ev AS c
  LEFT JOIN link ON link.id = c.id
  LEFT JOIN ev AS op ON op.id = link.op
  WHERE c.k = {RUNTIME} AND c.name IN ({{marks}})
) AS q
JOIN ev AS c ON c.id = q.id
LEFT JOIN ev AS w ON w.id = q.wait
ORDER BY c.id"""
_NO_KERNEL = (None, None, None, None)
#: The names of a user-visible frame (by id) and of those around it, innermost first, at
#: most MAX_FRAMES.
_FRAMES = ("WITH RECURSIVE up(id, depth) AS (SELECT ?1, 0 UNION ALL SELECT link.frame, "
           "up.depth + 1 FROM link JOIN up ON link.id = up.id WHERE link.frame IS NOT NULL "
           f"AND up.depth + 1 < {MAX_FRAMES}) "
           "SELECT ev.name FROM up JOIN ev ON ev.id = up.id ORDER BY up.depth")


def enclosing(events: Iterable[Any]) -> Enclosing:
    """One sweep per thread over its cpu_op, python_function and cuda_runtime events, sorted
    by start, longest first (the database sorts them, on disk when they are many), keeping
    the ops and the user-visible frames still open; each runtime call and cpu_op gets a row
    of table `link`: the innermost op open at it (`op`) and the innermost user-visible frame
    (`frame`), and each user-visible frame one with the frame around it, so that chains of
    them are walked up by id. Done once per store (parsed dicts are read into one first);
    the correlation ids of the runtime calls are indexed (table `callof`) with it."""
    events = as_events(events)
    if events.linked:  # (an Enclosing is not kept on the store: it would hold it in a cycle)
        return Enclosing(events, events.has_python)
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
    events.linked = True
    return Enclosing(events, events.has_python)


class Around:
    """What is around one copy (a gpu_memcpy event; None for a launch of a trace with no
    device activity, Enclosing.launches): its runtime call (None when the trace
    has none with its correlation id), the cpu_ops around the call (outermost first), the
    Python frames around it as sites (innermost first), the first stream sync after the
    call inside its innermost op (`wait`, an event id, and `wait_ns`), and the kernel that
    ran just before it on its stream (`before`: for Enclosing.inferred)."""

    __slots__ = ("copy", "call", "ops", "sites", "wait", "wait_ns", "before")

    def __init__(self, copy: Event | None, call: Event | None, ops: list[Event], sites: list[Site],
                 wait: int | None, wait_ns: int | None, before: tuple) -> None:
        self.copy, self.call, self.ops, self.sites = copy, call, ops, sites
        self.wait, self.wait_ns, self.before = wait, wait_ns, before
