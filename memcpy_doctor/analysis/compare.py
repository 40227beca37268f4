"""Two traces side by side: the figures of the report and the rows and copy paths that changed."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.trace import Site, Trace


@dataclass(frozen=True)
class Figure:
    name: str
    before_ns: int
    after_ns: int
    before_calls: int | None = None
    after_calls: int | None = None


@dataclass(frozen=True)
class PathChange:
    """A sync copy path (direction, trigger, site) in one trace and not, or less, in the other."""

    direction: str
    trigger: str
    site: Site | None
    before_calls: int
    after_calls: int
    before_ns: int
    after_ns: int


@dataclass
class Comparison:
    figures: list[Figure]
    events: list[Figure]  # Event Summary rows whose calls or total changed
    sync_paths: list[PathChange]
    simulated: tuple[bool, bool]
    #: how each run compiled: None for a run that compiled nothing, else its graphs, graph
    #: breaks and recompiles (trace.compile)
    compiled: tuple[tuple[int, int, int] | None, tuple[int, int, int] | None] = (None, None)
    light: tuple[bool, bool] = (False, False)  # which run `profile --light` recorded


def _paths(trace: Trace) -> dict[tuple, list[int]]:
    out: dict[tuple, list[int]] = {}
    for c in trace.copies:
        if c.sync:
            entry = out.setdefault((c.direction, c.trigger, c.site), [0, 0])
            entry[0] += c.calls
            entry[1] += c.time_ns
    return out


def compare(before: Trace, after: Trace) -> Comparison:
    b, a = before.summary, after.summary
    figures = [
        Figure("Total time", b.total_ns, a.total_ns),
        Figure("Computation time", b.computation_ns, a.computation_ns),
        Figure("Framework overhead", b.overhead_ns, a.overhead_ns),
        Figure("GpuMemcpy", b.memcpy_all.time_ns, a.memcpy_all.time_ns,
               b.memcpy_all.calls, a.memcpy_all.calls),
        Figure("GpuMemcpyAsync", b.memcpy_async.time_ns, a.memcpy_async.time_ns,
               b.memcpy_async.calls, a.memcpy_async.calls),
        Figure("GpuMemcpySync", b.memcpy_sync.time_ns, a.memcpy_sync.time_ns,
               b.memcpy_sync.calls, a.memcpy_sync.calls),
    ]
    rows_b = {e.name: e for e in before.events}
    rows_a = {e.name: e for e in after.events}
    events = []
    for name in sorted(set(rows_b) | set(rows_a)):
        eb, ea = rows_b.get(name), rows_a.get(name)
        calls_b, calls_a = (eb.calls if eb else 0), (ea.calls if ea else 0)
        tot_b, tot_a = (eb.total_ns if eb else 0), (ea.total_ns if ea else 0)
        if calls_b != calls_a or name.startswith("GpuMemcpy"):
            events.append(Figure(name, tot_b, tot_a, calls_b, calls_a))
    pb, pa = _paths(before), _paths(after)
    paths = [PathChange(k[0], k[1], k[2], pb.get(k, [0, 0])[0], pa.get(k, [0, 0])[0],
                        pb.get(k, [0, 0])[1], pa.get(k, [0, 0])[1])
             for k in sorted(set(pb) | set(pa), key=lambda k: (str(k[2]), k[0], k[1]))
             if pb.get(k, [0, 0])[0] != pa.get(k, [0, 0])[0]]
    return Comparison(figures, events, paths,
                      (before.meta.simulated, after.meta.simulated),
                      (_compiled(before), _compiled(after)),
                      (before.meta.light, after.meta.light))


def _compiled(trace: Trace) -> tuple[int, int, int] | None:
    info = trace.compile
    if info is None or not info.supported:
        return None
    return info.dynamo_graphs, len(info.graph_breaks), info.recompiles


def removed_copies(c: Comparison) -> list[PathChange]:
    return [p for p in c.sync_paths if p.after_calls < p.before_calls]


def sync_sites(trace: Trace) -> dict[tuple[Site | None, str | None, str], int]:
    """Calls of every host sync per (site, thread, direction), a wait's direction its kind
    ("wait:synchronize"): what `profile --light` and the full tracer must agree on on the
    simulated GPU, where light mode knows each sync's line and direction but not every
    op's trigger (a real GPU's light mode may say a direction is unknown)."""
    out: dict[tuple[Site | None, str | None, str], int] = {}
    for c in trace.copies:
        if c.sync:
            key = (c.site, c.thread, c.direction)
            out[key] = out.get(key, 0) + c.calls
    for w in trace.waits:
        key = (w.site, w.thread, f"wait:{w.kind}")
        out[key] = out.get(key, 0) + w.calls
    return out
