"""The report's "Graph breaks" section: what torch.compile did in the traced run (trace.compile).

Each graph break at its user line, with how often the program reached it, the sync copies made
there per step (the price of the break, where it is a host read), Dynamo's reason and its GB
code; then the host reads left inside compiled graphs, and what the figures cannot show.
"""

from __future__ import annotations

from typing import Callable

from ..core.compiled import CompileInfo
from ..core.paths import format_site


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.6g}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def compile_lines(info: CompileInfo, copies: list, steps: int | None, cwd: str | None,
                  table: Callable) -> list[str]:
    """The section's lines (without its banner); `copies`: the trace's; `table(rows,
    headers)` lays out columns."""
    if not info.supported:
        return [*info.notes]
    backward = len(info.graphs) - info.dynamo_graphs
    lines = [f"torch.compile: {_plural(info.dynamo_graphs, 'graph')}"
             + (f" (and {_plural(backward, 'backward graph')})" if backward else "") + ", "
             f"{_plural(len(info.graph_breaks), 'graph break')}, "
             f"{_plural(info.recompiles, 'recompile')}"]
    calls = sum(g.calls for g in info.graphs)
    untraced = sum(g.calls - g.traced_calls for g in info.graphs
                   if g.traced_calls is not None and g.traced_calls < g.calls)
    if untraced:
        lines.append(f"{untraced} of {calls} calls of compiled graphs ran with the ops inside "
                     "untraced: their graph's first calls made no copy or host wait, so these "
                     "are timed as its region's row alone (--trace-compiled-calls all traces "
                     "every call)")
    if info.graph_breaks:
        per = f"Sync per step ({steps} steps)" if steps else "Sync copies"
        rows = []
        for brk in sorted(info.graph_breaks, key=lambda b: (-b.sync_ns, -b.calls)):
            if brk.sync_copies:
                calls, ns = brk.sync_calls, brk.sync_ns
                if steps:
                    calls, ns = calls / steps, ns / steps
                kinds = ", ".join(sorted({f"{c.direction} {c.trigger}" for c in brk.sync_copies}))
                sync = f"{kinds} {calls:.6g} ({_ms(ns)} ms)"
            else:
                sync = "-"
            reason = brk.reason + (f" [{brk.gb_code}]" if brk.gb_code else "")
            rows.append([format_site(brk.site, cwd), str(brk.calls or "-"), sync, reason])
        lines += ["", *table(rows, ["Site", "Calls", per, "Reason"]).splitlines()]
    reads = [(site, g) for g in info.graphs for site in g.host_reads]
    if reads:
        synced: dict[tuple, int] = {}
        for c in copies:
            if c.sync and c.site is not None:
                key = (c.site.file, c.site.line)
                synced[key] = synced.get(key, 0) + c.calls
        lines += ["", "Host reads captured in compiled graphs:"]
        seen = set()
        for site, g in reads:
            if (site, g.name) in seen:  # (one line, several reads: a tolist() of N values)
                continue
            seen.add((site, g.name))
            calls = synced.get((site.file, site.line), 0)
            what = (f"a sync copy, {calls} calls" if calls else
                    "no sync: the compiled code keeps the value on the device")
            lines.append(f"  {format_site(site, cwd)}  in {g.name} ({g.calls} calls): {what}")
    for skip in info.cudagraph_skips:
        lines.append(f"CUDA graphs skipped: {skip}")
    lines += [f"Note: {note}" for note in info.notes]
    return lines
