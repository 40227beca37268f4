"""The Profiling Report in Paddle's layout (see docs/paddle-report.md)."""

from __future__ import annotations

from ..analysis.steady import StepSplit, estimate_steps, split_sync
from ..core.defaults import DEFAULT_SORT_KEY, REPORT_SYNC_SITES, SORT_KEYS
from ..analysis.attribution import user_site
from ..analysis.bandwidth import path_rates, reference, share_text
from ..core.paths import format_site
from ..core.units import binary_size
from ..core.races import RaceRecord
from ..core.trace import CopyRecord, EventRow, OpRef, Trace
from .compiled import compile_lines

_RULE = "-" * 25
_SORT_WORDS = {"calls": "number of calls", "total": "total time", "max": "maximum time",
               "min": "minimum time", "ave": "average time"}


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.6g}"


def _banner(title: str) -> str:
    return f"{_RULE}{title:^29}{_RULE}"


def _pct(part: int, whole: int) -> str:
    return f"{(part / whole * 100 if whole else 0.0):.6g}%"


def format_ref(ref: OpRef | None, cwd: str | None = None) -> str:
    if ref is None:
        return "-"
    return f"{ref.op} [{ref.device}] at {format_site(ref.site, cwd)}"


def plain_table(rows: list[list[str]], headers: list[str]) -> str:
    """Columns of text in tabulate's "plain" layout: left-aligned, two spaces apart, each at
    least two wider than its header, no trailing spaces; a character is one column wide
    (tests/test_render_text.py holds it to tabulate's output). Built here rather than by
    tabulate, which checks the type of every cell: the report is drawn at the end of every
    run, and tabulate took 1.4 ms of the 1.7 ms that the end of a run of the transformer
    benchmark cost (the trace built, then the report; docs/benchmarks.md).
    """
    rows = [[cell.strip() for cell in row] for row in rows]
    widths = [max([len(h) + 2] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in (headers, *rows))


def _sort_key(sort: str):
    return {
        "calls": lambda e: e.calls,
        "total": lambda e: e.total_ns,
        "max": lambda e: e.max_ns,
        "min": lambda e: e.min_ns,
        "ave": lambda e: e.total_ns / e.calls if e.calls else 0,
    }[sort]


def _event_table(events: list[EventRow], total_ns: int, sort: str) -> str:
    rows = []
    figure = _sort_key(sort)
    for e in sorted(events, key=lambda e: (-figure(e), e.name)):
        tot = e.total_ns
        rows.append([
            e.name, str(e.calls), _ms(tot),
            f"{e.cpu_ns / 1e6:.6f} ({(e.cpu_ns / tot if tot else 0):.6f})",
            f"{e.gpu_ns / 1e6:.6f} ({(e.gpu_ns / tot if tot else 0):.6f})",
            _ms(e.min_ns), _ms(e.max_ns), _ms(tot // e.calls if e.calls else 0),
            f"{(tot / total_ns if total_ns else 0):.6g}",
        ])
    headers = ["Event", "Calls", "Total", "CPU Time (Ratio)", "GPU Time (Ratio)", "Min.",
               "Max.", "Ave.", "Ratio."]
    return plain_table(rows, headers)


def _sync_table(copies: list[CopyRecord], cwd: str | None) -> str:
    """Each sync copy path, costliest first: by the GPU idle time it caused where the trace
    measured it (an imported one: kineto/idle.py), else by its time."""
    sync = [c for c in copies if c.sync]
    idle = any(c.idle_ns is not None for c in sync)
    sync.sort(key=lambda c: (-(c.idle_ns or 0), -c.time_ns, -c.calls))
    if not sync:
        return "No copies the host waited for."
    rows = []
    for c in sync[:REPORT_SYNC_SITES]:
        where = format_site(c.site, cwd)
        user = user_site(c)
        if user is not None and user is not c.site:  # (inside a library: from the user's)
            where += f" from {format_site(user, cwd)}"
        if c.thread is not None:
            where += f" [thread {c.thread}]"
        rows.append([
            f"{c.direction} {c.trigger}", where, str(c.calls), str(c.bytes), _ms(c.time_ns),
            *([_ms(c.idle_ns or 0)] if idle else []),
            f"{format_ref(c.producer, cwd)} -> {format_ref(c.consumer, cwd)}",
        ])
    table = plain_table(rows, ["Copy", "Site", "Calls", "Bytes", "Total",
                               *(["GPU idle"] if idle else []), "Producer -> Consumer"])
    if len(sync) > REPORT_SYNC_SITES:
        table += f"\n... and {len(sync) - REPORT_SYNC_SITES} more sync copy paths in the trace"
    if idle:
        table += ("\nGPU idle: from the device's last work before the host returned from the "
                  "wait to its next work, where the device was busy as the wait began and the "
                  "host launched that work after (docs/kineto.md)")
    return table


def _wait_idle_line(trace: Trace) -> list[str]:
    """The GPU idle time after the host's waits that are not copies, where measured."""
    waits = [w for w in trace.waits if w.idle_ns is not None]
    if not waits:
        return []
    return ["GPU idle after the other waits: " + ", ".join(
        f"{w.kind} {_ms(w.idle_ns)} ({w.calls} call{'s' if w.calls != 1 else ''})"
        for w in sorted(waits, key=lambda w: -w.idle_ns)), ""]


def _race_table(races: list[RaceRecord], cwd: str | None) -> str:
    """The host's accesses to a copy still in flight: kind, the copy's line, the access's
    line and op, calls (copies raced)."""
    rows = [[r.kind, f"{r.direction} {r.trigger} {format_site(r.copy_site, cwd)}",
             f"{r.op} {format_site(r.access_site, cwd)}"
             + (f" [thread {r.thread}]" if r.thread is not None else ""), str(r.calls)]
            for r in races]
    return (plain_table(rows, ["Race", "Copy (non_blocking)", "Access", "Calls"])
            + "\nThe host touched the host side of a copy before anything waited for it "
            "(memcpy-doctor explain gives the edit).")


def _pageable_non_blocking_line(copies: list[CopyRecord]) -> list[str]:
    """The GpuMemCpy Summary's line on the sync host->device copies that asked
    non_blocking=True from pageable memory (none where there are none): the host is blocked
    while the driver stages them, so non_blocking alone did not make them async."""
    calls = sum(c.calls for c in copies if c.non_blocking and c.sync and c.pinned is False
                and c.direction == "HtoD")
    if not calls:
        return []
    many = calls != 1
    return [f"  {calls} sync CPU->GPU cop{'ies' if many else 'y'} asked non_blocking=True "
            f"from pageable memory: the host stages pageable memory, so "
            f"{'they block' if many else 'it blocks'}; pin the source"]


def gbps(bps: float | None) -> str:
    """Bytes per second as GB/s (10^9 bytes), three significant digits; "-" for none."""
    return "-" if bps is None else f"{bps / 1e9:.3g}"


def _path_lines(trace: Trace) -> list[str]:
    """The GpuMemCpy Summary's copy paths: each path's calls, bytes, device time and GB/s,
    beside the device profile's figure for it (analysis/bandwidth.py)."""
    ref = reference(trace)
    paths = path_rates(trace, ref)
    if not paths:
        return []
    rows = [[p.name, str(p.calls), str(p.sync_calls), binary_size(p.bytes), _ms(p.device_ns),
             gbps(p.bps), "-" if p.reference_bps is None else
             f"{gbps(p.reference_bps)} ({share_text(p.bps / p.reference_bps)})" if p.bps else
             gbps(p.reference_bps)] for p in paths]
    where = ("none for this GPU" if ref is None
             else f"{ref.name}, the one the times were modeled with" if ref.modeled
             else f"{ref.name}, shipped for {trace.meta.device_name}")
    table = plain_table(rows, ["Copy path", "Calls", "Sync", "Bytes", "Device time", "GB/s",
                               "Profile GB/s"])
    return ["", *("  " + line for line in table.splitlines()),
            f"  (GB/s: bytes over the copies' device time; profile: {where})"]


def _per_step_line(split: StepSplit) -> str:
    """The GpuMemCpy Summary's one line beyond Paddle's: the sync copies of one step."""
    setup = f"setup and one-off: {split.setup_calls} calls, {_ms(split.setup_ns)}"
    if split.steps is None:
        return f"{'  GpuMemcpySync per step':<25}none repeats ({setup})"
    return (f"{'  GpuMemcpySync per step':<25}Calls: {split.calls_per_step:<12.6g}"
            f"Total: {_ms(round(split.ns_per_step)):<12}"
            f"Steps: {split.steps}, estimated ({setup})")


def _other_threads(trace: Trace) -> list[str]:
    """Threads other than the tracing one that ran ops, made copies or waited."""
    names = {r.thread for r in (*trace.ops, *trace.copies, *trace.waits)}
    names.discard(None)
    return sorted(names)


def _light_time_lines(trace: Trace) -> list[str]:
    """A light trace's time figures: what it measured, the run's wall time and the host's
    time in the syncs it timed, and how many it found only by their warning (untimed);
    no computation/overhead split, which it cannot know."""
    wall = trace.summary.total_ns
    sync = [c for c in trace.copies if c.sync]
    blocked = sum(c.host_ns for c in sync) + sum(w.wait_ns for w in trace.waits)
    timed = sum(c.calls for c in sync if c.host_ns) + sum(w.calls for w in trace.waits)
    untimed = sum(c.calls for c in sync if not c.host_ns)
    return [f"Wall time: {_ms(wall)} (the whole run, measured)",
            f"  Host blocked in syncs  Total: {_ms(blocked):<12}Ratio: {_pct(blocked, wall)}"
            f"  ({timed} timed syncs and waits; {untimed} untimed: "
            f"{'simulated' if trace.meta.simulated else 'found only by their warning'})"]


def place(trace: Trace) -> str:
    m = trace.meta
    if m.light:
        kind = f"simulated {m.device_name}" if m.simulated else m.device_name
        return f"CUDA:0 ({kind}; light mode: syncs counted at their lines, no ops)"
    if m.simulated:
        return (f"CUDA:0 (simulated {m.device_name}; device, copy and host times are "
                "modeled, not measured)")
    if m.imported_from is not None:
        return f"CUDA:0 (measured on {m.device_name}; imported from torch.profiler)"
    return f"CUDA:0 ({m.device_name})"


def render_text(trace: Trace, sort: str = DEFAULT_SORT_KEY, cwd: str | None = None) -> str:
    """The whole report. `cwd` decides which paths are shown relative (default: os.getcwd())."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}")
    s, m = trace.summary, trace.meta
    total = s.total_ns
    lines = [
        _banner("Profiling Report"), "",
        f"Place: {place(trace)}",
        *([f"Rank: {m.rank} of {m.world_size}"] if m.rank is not None else []),
        "Time unit: ms",
        f"Sorted by {_SORT_WORDS[sort]} in descending order in the same thread",
    ]
    if m.simulated and m.wall_ns is not None and not m.light:
        lines.append(f"Measured on this machine, with tracing: wall time {_ms(m.wall_ns)} "
                     "(in no figure below)")
    if m.ended_by != "completed":
        lines.append(f"Run cut short: {m.ended_by} (exit status {m.exit_status})")
    threads = _other_threads(trace)
    if threads:
        lines.append(f"Threads traced: the main thread and {', '.join(threads)} "
                     "(events of all threads together)")
    if m.untraced:
        lines.append("Not traced: " + "; ".join(m.untraced))
    lines += ["", *(_light_time_lines(trace) if m.light else [
        f"Total time: {_ms(total)} (the trace's span, first event to last; torch.profiler "
        "does not split it into computation and framework overhead)"]
        if m.imported_from is not None else [
        f"Total time: {_ms(total)}",
        f"  Computation time       Total: {_ms(s.computation_ns):<12}"
        f"Ratio: {_pct(s.computation_ns, total)}",
        f"  Framework overhead     Total: {_ms(s.overhead_ns):<12}"
        f"Ratio: {_pct(s.overhead_ns, total)}",
    ])]
    if s.peak_device_memory_bytes is not None:
        lines.append(f"Device memory peak: {binary_size(s.peak_device_memory_bytes)}")
    lines += [
        "", _banner("GpuMemCpy Summary"), "",
    ]
    for label, fig in (("GpuMemcpy", s.memcpy_all), ("  GpuMemcpyAsync", s.memcpy_async),
                       ("  GpuMemcpySync", s.memcpy_sync)):
        lines.append(f"{label:<25}Calls: {fig.calls:<12}Total: {_ms(fig.time_ns):<12}"
                     f"Ratio: {_pct(fig.time_ns, total)}")
    split = split_sync(trace)
    lines.append(_per_step_line(split))
    lines += _pageable_non_blocking_line(trace.copies)
    lines += _path_lines(trace)
    lines += ["", _banner("Event Summary"), "", _event_table(trace.events, total, sort),
              "", _banner("Sync copies"), "", _sync_table(trace.copies, cwd), "",
              *_wait_idle_line(trace)]
    if trace.races:
        lines += [_banner("Races"), "", _race_table(trace.races, cwd), ""]
    if trace.compile is not None:
        steps = split.steps or estimate_steps(trace)
        lines += [_banner("Graph breaks"), "",
                  *compile_lines(trace.compile, trace.copies, steps, cwd, plain_table), ""]
    return "\n".join(lines)


def render_reports(traces: list[Trace], names: list[str],
                   sort: str = DEFAULT_SORT_KEY) -> str:
    """The reports of several saved traces (the ranks of one run, say), one after another;
    with more than one, each ends with the file it came from, so that they can be told
    apart."""
    reports = [render_text(t, sort=sort) for t in traces]
    if len(reports) > 1:
        reports = [f"{text}\n(from {name})" for text, name in zip(reports, names)]
    return "\n".join(reports)
