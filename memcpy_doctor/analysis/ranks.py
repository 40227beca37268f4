"""Several traces of one distributed run, one per rank: merged, and compared rank by rank.

Ranks of a data-parallel job normally run the same code, so their sync copies (the copies the
host waited for) should be the same paths with the same counts. A rank that differs (one that
logs with `.item()`, or takes another branch) stalls the others at the next collective: it is
flagged here. Pure functions over `Trace` objects; nothing is read, printed or formatted.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from ..core.trace import (CopyRecord, EventRow, FlowRecord, Meta, OpRecord, Site, Trace, WaitRecord)
from ..core.summary import summarize

#: A sync copy path as ranks are compared on it: direction, trigger, call site.
PathKey = tuple[str, str, Site | None]


@dataclass(frozen=True)
class RankFigures:
    """One rank's headline figures, for the per-rank table."""

    index: int  # position in the list of traces given
    rank: int | None  # meta.rank (None: a single-process trace)
    total_ns: int
    memcpy_calls: int
    memcpy_ns: int
    sync_calls: int
    sync_ns: int
    ended_by: str
    exit_status: int | None


@dataclass(frozen=True)
class PathDifference:
    """A sync copy path whose count on one rank is not the reference's."""

    direction: str
    trigger: str
    site: Site | None
    calls: int  # on the rank that differs
    reference_calls: int  # on the reference group


@dataclass(frozen=True)
class RankDifference:
    """A rank whose sync copies differ from the reference group's."""

    index: int
    rank: int | None
    paths: list[PathDifference]


@dataclass
class RankComparison:
    """Per-rank figures, the merged trace, the groups of ranks with identical sync copies
    (indices, largest group first) and the ranks that differ from the reference group (the
    largest; on a tie, the one holding the first trace)."""

    ranks: list[RankFigures]
    merged: Trace
    groups: list[list[int]]
    differences: list[RankDifference]

    @property
    def uniform(self) -> bool:
        return not self.differences


def sync_paths(trace: Trace) -> dict[PathKey, int]:
    """Calls per sync copy path (direction, trigger, site) of one trace."""
    out: Counter[PathKey] = Counter()
    for c in trace.copies:
        if c.sync:
            out[(c.direction, c.trigger, c.site)] += c.calls
    return dict(out)


def figures(index: int, trace: Trace) -> RankFigures:
    s = trace.summary
    return RankFigures(index=index, rank=trace.meta.rank, total_ns=s.total_ns,
                       memcpy_calls=s.memcpy_all.calls, memcpy_ns=s.memcpy_all.time_ns,
                       sync_calls=s.memcpy_sync.calls, sync_ns=s.memcpy_sync.time_ns,
                       ended_by=trace.meta.ended_by, exit_status=trace.meta.exit_status)


def _site_order(key: PathKey) -> tuple:
    direction, trigger, site = key
    return ("" if site is None else site.file, 0 if site is None else site.line, direction,
            trigger)


def compare_ranks(traces: list[Trace]) -> RankComparison:
    """Compare the ranks' sync copy paths and merge the traces. At least one trace."""
    if not traces:
        raise ValueError("compare_ranks needs at least one trace")
    signatures = [sync_paths(t) for t in traces]
    groups: list[list[int]] = []
    for i, sig in enumerate(signatures):
        for group in groups:
            if signatures[group[0]] == sig:
                group.append(i)
                break
        else:
            groups.append([i])
    # Largest group first; on a tie the group that holds the earlier trace (rank 0 usually).
    groups.sort(key=lambda g: (-len(g), g[0]))
    reference = signatures[groups[0][0]]
    differences = []
    for group in groups[1:]:
        for i in group:
            sig = signatures[i]
            paths = [PathDifference(k[0], k[1], k[2], sig.get(k, 0), reference.get(k, 0))
                     for k in sorted(set(sig) | set(reference), key=_site_order)
                     if sig.get(k, 0) != reference.get(k, 0)]
            differences.append(RankDifference(i, traces[i].meta.rank, paths))
    differences.sort(key=lambda d: d.index)
    return RankComparison([figures(i, t) for i, t in enumerate(traces)], merge(traces),
                          groups, differences)


def _worst(statuses: list[int | None]) -> int | None:
    known = [s for s in statuses if s is not None]
    return max(known) if known else None


def merge_meta(traces: list[Trace]) -> Meta:
    """The first trace's meta for the whole job: no single rank, the highest exit status, the
    first way a rank was cut short, and each rank's untraced notes labelled by rank."""
    metas = [t.meta for t in traces]
    first = metas[0]
    cut = next((m.ended_by for m in metas if m.ended_by != "completed"), "completed")
    untraced = []
    for i, m in enumerate(metas):
        label = f"rank {m.rank}" if m.rank is not None else f"trace {i}"
        untraced += [f"{label}: {u}" for u in m.untraced]
    worlds = {m.world_size for m in metas if m.world_size is not None}
    return dataclasses.replace(
        first, exit_status=_worst([m.exit_status for m in metas]), ended_by=cut,
        untraced=untraced, rank=None,
        world_size=max(worlds) if worlds else None,
        device_profile=first.device_profile)


def merge(traces: list[Trace]) -> Trace:
    """One trace for all ranks: every count, byte and time summed over the ranks (so the total
    time is rank-time, and each ratio an average over ranks weighted by time), a row's min and
    max over all ranks, the peak device memory the highest of any rank. Records are merged
    where their identity (op, device, site; copy path; wait kind and site) is the same. The
    transfer log is dropped: program order across ranks means nothing."""
    if not traces:
        raise ValueError("merge needs at least one trace")
    events: dict[str, EventRow] = {}
    for t in traces:
        for e in t.events:
            m = events.get(e.name)
            if m is None:
                events[e.name] = dataclasses.replace(e)
            else:
                m.calls += e.calls
                m.cpu_ns += e.cpu_ns
                m.gpu_ns += e.gpu_ns
                m.min_ns = min(m.min_ns, e.min_ns)
                m.max_ns = max(m.max_ns, e.max_ns)
    ops: dict[tuple, OpRecord] = {}
    for t in traces:
        for o in t.ops:
            m = ops.get((o.op, o.device, o.site, o.thread))
            if m is None:
                ops[(o.op, o.device, o.site, o.thread)] = dataclasses.replace(o)
            else:
                for name in ("calls", "host_ns", "device_ns", "run_ns", "flops", "bytes"):
                    setattr(m, name, getattr(m, name) + getattr(o, name))
    copies: dict[tuple, CopyRecord] = {}
    for t in traces:
        for c in t.copies:
            key = (c.direction, c.sync, c.pinned, c.trigger, c.site, c.producer, c.consumer,
                   c.thread)
            m = copies.get(key)
            if m is None:
                copies[key] = dataclasses.replace(c, stack=list(c.stack))
            else:
                for name in ("calls", "bytes", "host_ns", "device_ns"):
                    setattr(m, name, getattr(m, name) + getattr(c, name))
    waits: dict[tuple, WaitRecord] = {}
    for t in traces:
        for w in t.waits:
            m = waits.get((w.kind, w.site, w.thread))
            if m is None:
                waits[(w.kind, w.site, w.thread)] = dataclasses.replace(w)
            else:
                m.calls += w.calls
                m.wait_ns += w.wait_ns
    flows: dict[tuple, FlowRecord] = {}
    for t in traces:
        for f in t.flows:
            m = flows.get((f.producer, f.consumer))
            if m is None:
                flows[(f.producer, f.consumer)] = dataclasses.replace(f)
            else:
                m.calls += f.calls
                m.bytes += f.bytes
    peaks = [t.summary.peak_device_memory_bytes for t in traces
             if t.summary.peak_device_memory_bytes is not None]
    event_rows, copy_records = list(events.values()), list(copies.values())
    summary = summarize(sum(t.summary.total_ns for t in traces), event_rows, copy_records,
                        max(peaks) if peaks else None)
    # summarize caps computation at each trace's own total; keep the ranks' own split.
    summary.computation_ns = sum(t.summary.computation_ns for t in traces)
    summary.overhead_ns = sum(t.summary.overhead_ns for t in traces)
    return Trace(meta=merge_meta(traces), summary=summary, events=event_rows,
                 ops=list(ops.values()), copies=copy_records, waits=list(waits.values()),
                 flows=list(flows.values()), transfers=[])
