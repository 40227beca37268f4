"""The GPU idle time each host sync caused, in a torch.profiler trace.

When the host waits for the device (a sync copy, `cudaStreamSynchronize`,
`cudaDeviceSynchronize`, `cudaEventSynchronize`), the device runs out of queued work and sits
idle until the host, back from the wait, launches the next. That idle time is what the sync
costs the GPU, and what ranks syncs for a user who wants the GPU busy.

For a sync whose wait began at `c` and returned at `r` (a wait's runtime call; a sync copy's
launch, then its return or that of the stream sync after it): the device
work on the stream it waited for (a sync copy's stream; every stream for the other waits)
that began last at or before `r` ended at `end`; the work that began first after `r` starts
at `next`. The sync's idle time is `next - end` when the sync drained the queue and the host,
back from it, held the next work up: the device was still busy, with work begun before `c`,
when the host began to wait (a sync called, or a copy made, on a device already dry found the
host behind, and caused none of the idle after it), nothing still ran at `r`, and `next`'s
runtime call was made at or after `r` (work queued before the return, such as a pageable
copy's own transfer, was not held up by it). Else 0. This is stricter than
HolisticTraceAnalysis's "host wait" (breakdown_analysis.py `_analyze_idle_time_for_stream`:
any gap whose next op was launched after the gap opened, sync or not). Device work is a
kernel, a copy or a memset. One idle stretch counts once, for the first sync to return
inside it. Work with no runtime call (no launch on record) cannot show who held it up: 0.

The lookups are indexed queries on the events' store (kineto/events.py), a few per sync, so a
trace's size does not change what each costs.
"""

from __future__ import annotations

from typing import Any, Hashable

from .events import KERNEL, MEMSET, Events

_DEVICE = f"k BETWEEN {KERNEL} AND {MEMSET}"
#: Claims written to the store at a time.
_BATCH = 4096


class DeviceIdle:
    """Claims of idle stretches by syncs (`claim`), each stretch kept for the earliest sync
    to return inside it; `totals` sums them per target (what the caller names a sync by).
    The claims are rows of the events' store (table `idle`), so that memory does not grow
    with the number of syncs; only the distinct targets are held."""

    def __init__(self, events: Events) -> None:
        self._events = events
        events.query(f"CREATE INDEX IF NOT EXISTS devops ON ev(sk, ts) WHERE {_DEVICE}")
        events.query(f"CREATE INDEX IF NOT EXISTS devall ON ev(ts) WHERE {_DEVICE}")
        events.query("CREATE TEMP TABLE IF NOT EXISTS idle (next INT, r REAL, ns INT, "
                     "target INT)")
        self._streams = [sk for (sk,) in events.query(
            f"SELECT DISTINCT sk FROM ev WHERE {_DEVICE}")]
        self._targets: dict[Hashable, int] = {}
        self._rows: list[tuple] = []

    def claim(self, began_us: float, returned_us: float, target: Hashable,
              copy: int | None = None) -> None:
        """A sync whose wait began at `began_us` and returned at `returned_us` (trace time,
        us), named `target`: a sync copy (`copy`, its event's id), which waited for its
        stream, or a wait for every stream (None)."""
        stream = None
        if copy is not None:
            stream = self._events.query("SELECT sk FROM ev WHERE id = ?", (copy,)).fetchone()[0]
        found = self._stretch(began_us, returned_us, stream)
        if found is None:
            return
        number = self._targets.setdefault(target, len(self._targets))
        self._rows.append((found[0], returned_us, found[1], number))
        if len(self._rows) >= _BATCH:
            self._flush()

    def _flush(self) -> None:
        self._events.db.executemany("INSERT INTO idle VALUES (?, ?, ?, ?)", self._rows)
        self._rows.clear()

    def totals(self) -> dict[Hashable, int]:
        """Idle ns per target, summed over the stretches it was the first to claim."""
        self._flush()
        names = list(self._targets)
        # (SQLite takes a bare column of a min() aggregate from the row with the minimum)
        return {names[t]: ns for t, ns in self._events.query(
            "SELECT target, sum(ns) FROM (SELECT target, ns, min(r) FROM idle GROUP BY next) "
            "GROUP BY target")}

    def _stretch(self, c: float, r: float, stream: int | None) -> tuple[int, int] | None:
        """(the id of the work that ends the idle stretch after a wait from `c` to `r`, its
        ns), or None when the wait drained nothing, the device was busy at `r`, nothing came
        after, or the host did not hold the next work up."""
        before = self._last_end(c, stream, below=True)
        if before is None or before <= c:  # the device had run dry before the host waited
            return None
        end = self._last_end(r, stream)
        if end is None or end > r:
            return None
        q = self._events.query
        where = "sk = ? AND " if stream is not None else ""
        row = q(f"SELECT id, ts, corr FROM ev WHERE {where}{_DEVICE} AND ts > ? "
                "ORDER BY ts, id LIMIT 1", (*([stream] if stream is not None else []), r)
                ).fetchone()
        if row is None:
            return None
        next_id, next_ts, corr = row
        launch = q("SELECT c.ts FROM callof JOIN ev AS c ON c.id = callof.call "
                   "WHERE callof.corr = ?", (corr,)).fetchone() if corr is not None else None
        if launch is None or launch[0] < r:
            return None
        return next_id, round((next_ts - end) * 1000)

    def _last_end(self, t: float, stream: int | None, below: bool = False) -> float | None:
        """The latest end of the device work that began at or before `t` (`below`: before
        it) on `stream` (on each stream, the work that began last: work on one stream runs
        in order)."""
        ends = [self._stream_end(t, sk, below) for sk in
                ([stream] if stream is not None else self._streams)]
        ends = [e for e in ends if e is not None]
        return max(ends) if ends else None

    def _stream_end(self, t: float, sk: Any, below: bool) -> float | None:
        row = self._events.query(f"SELECT ts + dur FROM ev WHERE sk = ? AND {_DEVICE} AND "
                                 f"ts {'<' if below else '<='} ? ORDER BY ts DESC, id DESC "
                                 "LIMIT 1", (sk, t)).fetchone()
        return None if row is None else row[0]
