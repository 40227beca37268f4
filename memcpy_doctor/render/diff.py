"""`memcpy-doctor diff`: two reports side by side."""

from __future__ import annotations

from ..analysis.compare import Comparison, Figure
from ..core.paths import format_site


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.6g}"


def _change(before: int, after: int) -> str:
    if before == 0:
        return "new" if after else "-"
    return f"{(after - before) / before:+.1%}"


def _row(f: Figure) -> list[str]:
    calls = ("" if f.before_calls is None
             else f"{f.before_calls} -> {f.after_calls}")
    return [f.name, _ms(f.before_ns), _ms(f.after_ns), _change(f.before_ns, f.after_ns), calls]


def _compiled(counts: tuple[int, int, int] | None) -> str:
    if counts is None:
        return "eager (nothing compiled)"
    graphs, breaks, recompiles = counts
    return (f"torch.compile, {graphs} graph{'s' * (graphs != 1)}, {breaks} graph "
            f"break{'s' * (breaks != 1)}, {recompiles} recompile{'s' * (recompiles != 1)}")


def _why(before: tuple | None, after: tuple | None):
    """Where one run is compiled and the other eager: what compiling did to a sync path."""
    if (before is None) == (after is None):
        return None
    compiled_after = after is not None

    def why(p) -> str:
        fewer = p.after_calls < p.before_calls
        if fewer == compiled_after:
            return "removed by compiling" if min(p.after_calls, p.before_calls) == 0 \
                else "fewer compiled"
        return "made by compiling" if min(p.after_calls, p.before_calls) == 0 \
            else "more compiled"

    return why


def render_diff(c: Comparison, before_name: str, after_name: str,
                cwd: str | None = None) -> str:
    from tabulate import tabulate  # here, not at the top: its import alone costs 20 ms
    lines = [f"Before: {before_name}", f"After:  {after_name}"]
    if any(c.light):  # (light mode's syncs: trigger sync_debug, no ops, wall-clock times)
        lines.append("Both light mode: syncs by line, no ops" if all(c.light) else
                     "Warning: one trace is light mode (syncs by line as `sync_debug`, no ops), "
                     "the other full: their sync paths differ in kind, compare them by line")
    modeled = [sim and not light for sim, light in zip(c.simulated, c.light)]  # (a light
    if any(modeled):  # trace's times are wall clock, also on the simulated GPU)
        lines.append("Times are modeled (simulated GPU)" if all(modeled)
                     else "Warning: one trace's times are modeled (simulated GPU), the other's "
                     "measured")
    before, after = c.compiled
    if before != after:
        lines += [f"{side}: {_compiled(counts)}" for side, counts in
                  (("Before", before), ("After", after))]
    lines += ["", tabulate([_row(f) for f in c.figures],
                           headers=["", "Before (ms)", "After (ms)", "Change", "Calls"],
                           tablefmt="plain", disable_numparse=True), ""]
    if c.events:
        lines += ["Event rows that changed", tabulate(
            [_row(f) for f in c.events],
            headers=["Event", "Before (ms)", "After (ms)", "Change", "Calls"],
            tablefmt="plain", disable_numparse=True), ""]
    if c.sync_paths:
        why = _why(before, after)
        lines += ["Sync copy paths that changed", tabulate(
            [[f"{p.direction} {p.trigger}", format_site(p.site, cwd),
              f"{p.before_calls} -> {p.after_calls}", _ms(p.before_ns), _ms(p.after_ns),
              *([why(p)] if why else [])]
             for p in c.sync_paths],
            headers=["Copy", "Site", "Calls", "Before (ms)", "After (ms)",
                     *(["Why"] if why else [])],
            tablefmt="plain", disable_numparse=True), ""]
    else:
        lines += ["No sync copy path changed.", ""]
    return "\n".join(lines)
