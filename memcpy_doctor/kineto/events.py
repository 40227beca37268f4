"""A torch.profiler trace's events as the kineto/ readers keep them: each event they look at
cut at once to a row of a private temporary SQLite database, so that the memory a read
takes stays the same whatever the trace's size, and the readers' joins run there.

`json.loads` of a trace holds every event whole: `Input Dims`, kernel occupancies, flow ids,
each in a dict of its own, six times the file in Python objects; even records of only the
fields the readers use grow with the trace (about 330 bytes an event). The readers need
eleven fields of six categories of events (`cpu_op`, `python_function`, `cuda_runtime`,
`kernel`, `gpu_memcpy`, `gpu_memset`), and of the Python frames only those that can be a
site (kineto/frames.py: not torch's, the standard library's or builtins); of every other
event, only its category and its time span (the trace's span and the check for CUDA
activity read them). Not events: the profiler's own `Trace` event (its recording window,
which runs on past the last event: sampled_rank0's 3.37 s window holds 1.23 s of events),
metadata (`ph` "M": process and thread names, stamped with the window's start) and instants
("Iteration Start", 33 ms before a100_alexnet's first event; "Record Window End"): they are
left out of the span, as HTA leaves them out. The rows go to a database SQLite
opens on an empty file name: it lives in SQLite's page cache (CACHE_KIB) and spills to a
temporary file past it, deleted when the store is collected (nothing the readers make of
it refers back to it, so that is when the last reference goes). So what a read holds
is that cache, the distinct names and threads, and what the readers make of the rows (the
copies' records, the event summary's rows), not the events.

A row: `id` (the event's place among `traceEvents`, from 1), `k` (its kind, KINDS), `ph`,
`th` (its (pid, tid), numbered as first seen: `threads`), `ts` and `dur` (microseconds,
floats, `dur` 0 where absent), `ns` (`dur` in whole nanoseconds, rounded as `round` does),
`name` (numbered as first seen: `names`), `corr` (`args.correlation`), `sk` (its (pid,
stream), `args.stream` falling back to the thread, numbered: `streams`), `nbytes`
(`args.bytes`), `rf` (`args.Record function id`). Values are as JSON gave them, None where
absent (a field given as `null` reads as absent). An event whose `ts`/`dur` is not a number,
whose `args` is not an object, or whose field holds a list or an object where the readers
want a value, is kept out, and its error is raised when the events are mapped
(`Events.check`), so a malformed trace still gets one line naming it.

`Event` is one row as a record, made only for the events a reader asks about (a copy, its
runtime call, the ops around it), never for all of them at once.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

try:
    import sqlite3
    #: What a failing store raises (store_error makes it one line)
    STORE_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error,)
except ImportError:  # a Python built without it (pyenv without SQLite's headers)
    sqlite3 = None  # type: ignore[assignment]
    STORE_ERRORS = ()

from .frames import frame_site
from ..core.trace import TraceError

#: The categories of events the readers use, by kind number (the `k` column).
KINDS = ("cpu_op", "python_function", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset")
OP, FRAME, RUNTIME, KERNEL, MEMCPY, MEMSET = range(len(KINDS))
#: What reading a malformed event raises (turned into one line where a trace is read).
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError)
#: Why a Python without sqlite3 cannot read a torch.profiler trace, and what to do.
NO_SQLITE = ("reading a torch.profiler trace needs Python's sqlite3 module, which this Python "
             "was built without (rebuild it with SQLite's headers, e.g. libsqlite3-dev)")
#: The page cache of a store's database, in KiB: what a read holds at most of its rows.
CACHE_KIB = 2048
#: Rows written at a time.
_BATCH = 4096
_KIND = {c: i for i, c in enumerate(KINDS)}
#: Phases that mark a time or name a process, not events with a span: metadata ("M") and
#: instants ("i", "I": "Iteration Start", "Record Window End").
_MARKS = frozenset(("M", "i", "I"))
_SCHEMA = ("CREATE TABLE ev (id INTEGER PRIMARY KEY, k INT, ph, th INT, ts REAL, dur REAL, "
           "ns INT, name INT, corr, sk INT, nbytes, rf)")
_INSERT = "INSERT INTO ev VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
#: The columns a record is made of, in Event's order (see Events.record).
COLUMNS = "id, k, ph, th, ts, dur, name, corr, sk, nbytes, rf"


class Event:
    """One kept event: its place among `traceEvents` (`id`), phase, category, name, process
    and thread, start and duration (microseconds, floats), and from its `args`:
    `correlation`, the stream (`stream`, else the thread), `bytes` and `Record function id`
    (`rf`)."""

    __slots__ = ("id", "ph", "cat", "name", "pid", "tid", "ts", "dur", "corr", "stream",
                 "nbytes", "rf")

    def __init__(self, id: int, ph: Any, cat: Any, name: Any, pid: Any, tid: Any, ts: float,
                 dur: float, corr: Any, stream: Any, nbytes: Any, rf: Any) -> None:
        self.id, self.ph, self.cat, self.name, self.pid, self.tid = id, ph, cat, name, pid, tid
        self.ts, self.dur, self.corr, self.stream, self.nbytes, self.rf = (
            ts, dur, corr, stream, nbytes, rf)

    def __repr__(self) -> str:
        return f"Event({self.cat!r}, {self.name!r}, ts={self.ts}, dur={self.dur})"


class Events:
    """The kept events of one trace (see the module docstring), with what is read from all of
    them: the categories (`cats`), the earliest start and latest end (`start`, `end`, None
    when no event has a start), the first error an event raised (`error`), and how many
    elements were read (`seen`). Iterating gives records in file order, one at a time."""

    def __init__(self) -> None:
        if sqlite3 is None:
            raise TraceError(f"a torch.profiler trace: {NO_SQLITE}")
        self.db = sqlite3.connect("", isolation_level=None)
        self.db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        self.db.execute("PRAGMA journal_mode = OFF")
        self.db.execute("PRAGMA synchronous = OFF")
        self.db.execute(_SCHEMA)
        self.cats: set[Any] = set()
        self.start: float | None = None
        self.end: float | None = None
        self.error: Exception | None = None
        self.seen = 0
        self.names: list[Any] = []  # name number -> the name
        self.threads: list[tuple[Any, Any]] = []  # th -> (pid, tid)
        self.streams: list[tuple[Any, Any]] = []  # sk -> (pid, stream)
        self._name_ids: dict[Any, int] = {}
        #: name number of a python_function -> whether it is a site (kineto/frames.py): a
        #: frame that is not adds nothing to the frames around a call, and is not kept
        self._sites: dict[int, bool] = {}
        self.has_python = False  # whether any python_function span was read (with_stack)
        self._thread_ids: dict[tuple, int] = {}
        self._stream_ids: dict[tuple, int] = {}
        self.linked = False  # whether stacks.enclosing wrote its tables (once per store)

    def read(self, elements: Iterable[Any]) -> None:
        """Read the elements of `traceEvents` as they are parsed (see the module docstring).
        The read's hot path: one pass, each event cut to a row as it comes."""
        cats, kinds = self.cats, _KIND
        names, threads, streams = self._name_ids, self._thread_ids, self._stream_ids
        sites = self._sites
        rows: list[tuple] = []
        start = float("inf") if self.start is None else self.start
        end = float("-inf") if self.end is None else self.end
        seen = self.seen
        self.db.execute("BEGIN")
        try:
            for e in elements:
                seen += 1
                self.seen = seen
                if e.__class__ is not dict or "ts" not in e:
                    continue
                try:
                    cat = e.get("cat")
                    cats.add(cat)
                    if cat == "Trace" or e.get("ph") in _MARKS:  # the profiler's window,
                        continue  # names of processes and threads, instants: no events
                    ts = float(e["ts"])
                    dur = e.get("dur")
                    dur = 0.0 if dur is None else float(dur)
                    if ts < start:
                        start = ts
                    if ts + dur > end:
                        end = ts + dur
                    k = kinds.get(cat)
                    if k is None:
                        continue
                    args = e.get("args", _NO_ARGS)
                    if args.__class__ is not dict:
                        args.get  # noqa: B018 -- the AttributeError the dict readers raised
                    name = e.get("name")
                    n = names.get(name)
                    if n is None:
                        n = _number(name, names, self.names)
                    if k == FRAME:
                        if e.get("ph") == "X":
                            self.has_python = True
                        site = sites.get(n)
                        if site is None:
                            site = sites[n] = frame_site(
                                name if name.__class__ is str else "") is not None
                        if not site:
                            continue
                    pid, tid = e.get("pid"), e.get("tid")
                    th = threads.get((pid, tid))
                    if th is None:
                        th = _number((pid, tid), threads, self.threads)
                    stream = (pid, args.get("stream", tid))
                    sk = streams.get(stream)
                    if sk is None:
                        sk = _number(stream, streams, self.streams)
                    rows.append((seen, k, e.get("ph"), th, ts, dur, round(dur * 1000), n,
                                 args.get("correlation"), sk, args.get("bytes"),
                                 args.get("Record function id")))
                except (TypeError, ValueError, AttributeError, OverflowError) as err:
                    if self.error is None:
                        self.error = err
                    continue
                if len(rows) >= _BATCH:
                    self._write(rows)
            self._write(rows)
        finally:
            self.db.execute("COMMIT")
        if start <= end:
            self.start, self.end = start, end

    def _write(self, rows: list[tuple]) -> None:
        """Write `rows` and empty the list; a row SQLite cannot hold (a list or an object
        where a value should be) is kept out, its error kept for check()."""
        try:
            self.db.executemany(_INSERT, rows)
        except (*STORE_ERRORS, OverflowError):
            for row in rows:  # only for a malformed trace: find the rows at fault
                try:
                    self.db.execute(_INSERT, row)
                except (*STORE_ERRORS, OverflowError):
                    if self.error is None:
                        bad = next((v for v in row if isinstance(v, (list, dict))), row)
                        self.error = TypeError(f"an event's field holds {bad!r}")
        rows.clear()

    def check(self) -> None:
        """Raise the error of the first event that could not be read, if one could not."""
        if self.error is not None:
            raise self.error

    def name_id(self, name: Any) -> int:
        """The number `name` is stored as; -1 (no row) when no kept event has it."""
        return self._name_ids.get(name, -1)

    def record(self, row: tuple) -> Event:
        """The record of a row selected as COLUMNS."""
        id_, k, ph, th, ts, dur, name, corr, sk, nbytes, rf = row
        pid, tid = self.threads[th]
        return Event(id_, ph, KINDS[k], self.names[name], pid, tid, ts, dur, corr,
                     self.streams[sk][1], nbytes, rf)

    def records(self, where: str = "1", params: tuple = ()) -> Iterator[Event]:
        """The records of the rows for which the SQL condition `where` holds, in file order,
        made one at a time."""
        record = self.record
        for row in self.db.execute(f"SELECT {COLUMNS} FROM ev WHERE {where} ORDER BY id",
                                   params):
            yield record(row)

    def end_of(self, id_: int) -> float:
        """When the event numbered `id_` ended (ts + dur, us)."""
        return self.db.execute("SELECT ts + dur FROM ev WHERE id = ?", (id_,)).fetchone()[0]

    def get(self, id_: int | None) -> Event | None:
        """The record of the event numbered `id_`; None for None or no such event."""
        if id_ is None:
            return None
        row = self.db.execute(f"SELECT {COLUMNS} FROM ev WHERE id = ?", (id_,)).fetchone()
        return self.record(row) if row is not None else None

    def query(self, sql: str, params: tuple | list = ()) -> Any:
        """Run `sql` on the store's database (table `ev`, see the module docstring)."""
        return self.db.execute(sql, params)

    def __iter__(self) -> Iterator[Event]:
        return self.records()

    def __len__(self) -> int:
        return self.db.execute("SELECT count(*) FROM ev").fetchone()[0]


_NO_ARGS: dict = {}


def _number(value: Any, ids: dict, values: list) -> int:
    """The next number, given to `value` (a name, a thread, a stream) first seen."""
    ids[value] = len(values)
    values.append(value)
    return ids[value]


def require_store(path: str) -> None:
    """TraceError, one line, where this Python cannot keep a store (no sqlite3 module)."""
    if sqlite3 is None:
        raise TraceError(f"{path}: {NO_SQLITE}")


def store_error(path: str, e: Exception) -> TraceError:
    """The one line for a store SQLite could not keep (no room, or no folder it may write,
    for its temporary file)."""
    return TraceError(f"{path}: reading it needs a temporary file, which SQLite could not "
                      f"keep ({e}); SQLITE_TMPDIR names the folder it uses")


@contextmanager
def one_line(path: str) -> Iterator[None]:
    """Turn what mapping a malformed trace raises (MALFORMED), or a store SQLite could not
    keep, into one TraceError line naming `path`."""
    try:
        yield
    except MALFORMED as e:
        raise TraceError(f"{path}: a torch.profiler trace this version cannot read "
                         f"({type(e).__name__}: {e})") from None
    except STORE_ERRORS as e:
        raise store_error(path, e) from None


def as_events(events: Iterable[Any]) -> Events:
    """`events` as Events: as they are when they already are; else parsed dicts, read."""
    if isinstance(events, Events):
        return events
    out = Events()
    out.read(events)
    return out


def to_records(elements: Iterable[Any]) -> list[Event]:
    """Parsed dicts (or records) as a list of records, in order: for the few events a caller
    holds as dicts (the ops around a copy, in tests)."""
    elements = list(elements)
    if all(isinstance(e, Event) for e in elements):
        return elements
    return list(as_events(elements))
