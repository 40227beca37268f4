"""The HTML report (issue 44): one self-contained page of a trace, or of the ranks of one run,
for a reader deciding what to fix.

For each trace: the headline figures (total time, sync copies per step and their share of
the time, device memory peak, where it ran); a picture of one steady step (host and device
lanes, each copy an arrow at its time, the host's waits and the device's idle time shaded;
render/html_timeline.py), and the same step after the suggested edits where explain's replay
can play it; the sync copies table with each path's line, stack and producer -> copy ->
consumer chain; and the suggested edits with their diffs and savings (render/html_tables.py).
Several ranks get one section each, after a table of them side by side.

The page loads nothing: inline CSS and SVG, the reader's system fonts, no script (what the
picture shows on hover, its <title>s, is also in its caption and the table). Everything that
comes from the trace is escaped. Analysis runs here as `explain` runs it (attribution,
rules.suggest on a Replay), so the page and `explain` agree.
"""

from __future__ import annotations

from ..analysis.attribution import Explanation, explain
from ..analysis.replay import Replay, joint_saving
from ..analysis.rules import suggest
from ..analysis.steady import split_sync
from ..analysis.step import StepWindow, pick_step
from ..analysis.suggestion import Suggestion
from ..core.defaults import HTML_SYNC_PATHS
from ..core.trace import Trace
from .html_format import duration, esc, share, site_text, size
from .html_page import CSS, LEGEND
from .html_tables import heaviest_sync, suggestions_html, sync_table
from .html_timeline import X0, X1, draw, facts, replayed_lanes, step_lanes


def where_it_ran(trace: Trace) -> str:
    """Where the trace's figures come from, in words (escaped)."""
    m = trace.meta
    name = esc(m.device_name)
    if m.light:
        on = f"simulated {name}" if m.simulated else name
        return (f"light mode on {on}: syncs counted at their lines, no ops; times are this "
                "machine's wall clock")
    if m.simulated:
        return f"simulated {name}: device, copy and host times are modeled, not measured"
    if m.imported_from is not None:
        return f"measured on {name}; imported from torch.profiler"
    return f"measured on {name}"


def _figure(label: str, cls: str, value: str, small: str = "") -> str:
    extra = f"<small>{small}</small>" if small else ""
    return f'<div><dt>{label}</dt><dd class="{cls}">{value}{extra}</dd></div>'


def headline(trace: Trace, exp: Explanation) -> str:
    """The figures a reader looks at first, as a list of labelled values."""
    s, m = trace.summary, trace.meta
    total = s.total_ns
    split = split_sync(trace)
    if split.steps is None:
        per_step = _figure("Sync copies per step", "per-step", "none repeats",
                           f"setup and one-off: {split.setup_calls} calls, "
                           f"{duration(split.setup_ns)}")
    else:
        per_step = _figure("Sync copies per step", "per-step", f"{split.calls_per_step:.3g}",
                           f"{duration(split.ns_per_step)} a step; {split.steps} steps, "
                           "estimated")
    label = ("Wall time" if m.light else "Total time (the trace's span)"
             if m.imported_from is not None else "Total time")
    peak = s.peak_device_memory_bytes
    figures = [
        _figure(label, "total", duration(total)),
        per_step,
        _figure("Their share of the time", "sync-share", share(exp.sync_time_ns, total),
                f"all sync copies: {exp.sync_calls} calls, {duration(exp.sync_time_ns)}"),
        _figure("Device memory peak", "peak", "not known" if peak is None else size(peak)),
        _figure("Where it ran", "where", where_it_ran(trace)),
    ]
    notes = []
    if m.rank is not None:
        notes.append(f"Rank {m.rank} of {m.world_size}.")
    if m.ended_by != "completed":
        notes.append(f"Run cut short: {esc(m.ended_by)} (exit status {m.exit_status}).")
    notes += [f"Note: {esc(n)}" for n in exp.notes]
    untraced = [u for u in m.untraced if u not in exp.notes]
    body = "".join(f'<p class="note">{n}</p>' for n in notes)
    if untraced:
        items = "".join(f"<li>{esc(u)}</li>" for u in untraced)
        body += (f"<details><summary>Not traced ({len(untraced)})</summary>"
                 f"<ul>{items}</ul></details>")
    return f'<dl class="figures">{"".join(figures)}</dl>{body}'


def _no_timeline(trace: Trace) -> str | None:
    """Why there is no picture of a step, or None where there is one."""
    m = trace.meta
    if m.light:
        return ("Light mode records no ops, so there is no timeline of a step: the table "
                "below has every sync it counted.")
    if trace.timeline is None:
        if m.imported_from is not None:
            return ("No timeline: a trace imported from torch.profiler keeps no events in "
                    "order here; the table below has every sync copy path.")
        return ("No timeline in this trace (written before traces kept one, or profiled "
                "with --timeline-events 0).")
    return None


def _marker(trace: Trace, win: StepWindow, cwd: str | None) -> str:
    kind, ref = win.marker
    rec = {"op": trace.ops, "copy": trace.copies, "wait": trace.waits}[kind][ref]
    name = rec.op if kind == "op" else rec.trigger if kind == "copy" else rec.kind
    return f"{esc(name)} at {site_text(rec.site, cwd)}"


def _after_words(replay: Replay, suggestions: list[Suggestion], has_after: bool) -> str:
    if not suggestions:
        return "No suggested edits, so no step after them."
    if replay.why_not:
        return ("No step after the suggested edits: the replay cannot play this trace "
                f"({esc(replay.why_not)}).")
    if not has_after:
        return ("No step after the suggested edits: the step's events are past the replayed "
                "window.")
    return ""


def timeline_section(trace: Trace, replay: Replay, suggestions: list[Suggestion],
                     prefix: str, numbers: dict[int, int], cwd: str | None) -> str:
    """The picture of one steady step, and of the same step after the suggested edits."""
    why = _no_timeline(trace)
    win = None if why else pick_step(trace)
    if why is None and win is None:
        why = "The timeline holds no events of the tracer's own thread."
    if why:
        return f'<p class="note no-timeline">{why}</p>'
    before = step_lanes(trace, win)
    spans = replay.spans(suggestions) if suggestions else None
    after = replayed_lanes(trace, win, spans) if spans else None
    width_ns = max(1, before.end_ns - before.start_ns,
                   0 if after is None else after.end_ns - after.start_ns)
    scale = (X1 - X0) / width_ns
    b_id, a_id = f"{prefix}step-b", f"{prefix}step-a"
    svg, pic = draw(trace, before, scale, f"{prefix}b-", numbers, prefix, cwd, b_id,
                    width_ns)
    if win.marker is None:
        what = "The timeline's events (no record repeats once a step)"
    else:
        what = (f"Step {win.number} of the {win.complete} whole steps in the timeline (each "
                f"begun by {_marker(trace, win, cwd)})")
    kept = trace.timeline
    window = (f" The timeline kept the run's first {len(kept.events)} events "
              f"({kept.dropped} later ones are in the totals only)." if kept.dropped else "")
    others = sum(1 for e in kept.events if e.thread is not None)
    if others:
        window += (f" {others} events of other threads are not drawn (their clocks are "
                   "their own).")
    out = (f'<figure class="step before"><figcaption id="{b_id}"><strong>{what}</strong>: '
           f'{facts(pic)}{window}</figcaption>{svg}</figure>')
    if after is not None:
        svg2, pic2 = draw(trace, after, scale, f"{prefix}a-", numbers, prefix, cwd, a_id,
                          width_ns)
        saved = (before.end_ns - before.start_ns) - (after.end_ns - after.start_ns)
        edits = f"{len(suggestions)} suggested edit{'s' if len(suggestions) != 1 else ''}"
        change = f"{duration(abs(saved))} {'shorter' if saved >= 0 else 'longer'}"
        cost = sum(x.cost_ns for x in suggestions)
        cost = (f" Not drawn: what the edits themselves cost the host at run time "
                f"({duration(cost)} in the whole run, a device_guard's own work), which "
                "their savings count." if cost else "")
        out += (f'<figure class="step after"><figcaption id="{a_id}"><strong>The same step '
                f"after the {edits}</strong>, replayed as explain prices them (the cost "
                f"model's host and device clocks; {change}): {facts(pic2)}{cost}</figcaption>"
                f"{svg2}</figure>")
    words = _after_words(replay, suggestions, after is not None)
    if words:
        out += f'<p class="note no-after">{words}</p>'
    return out + LEGEND


def trace_section(trace: Trace, prefix: str, cwd: str | None) -> str:
    """Everything the page shows of one trace."""
    exp = explain(trace)
    not_worth_it: list[Suggestion] = []
    replay = Replay(trace)
    suggestions = suggest(trace, exp, cwd, None, not_worth_it, replay)
    exp.together = joint_saving(trace, suggestions, replay)
    ranked = heaviest_sync(trace.copies)
    numbers = {i: n for n, (i, _) in enumerate(ranked[:HTML_SYNC_PATHS], 1)}
    n_paths = len(ranked)
    return (headline(trace, exp)
            + f'<h3 id="{prefix}timeline">One step, host and device</h3>'
            + timeline_section(trace, replay, suggestions, prefix, numbers, cwd)
            + f'<h3 id="{prefix}sync">Sync copies ({n_paths} path{"s" if n_paths != 1 else ""})'
              "</h3>"
            + sync_table(trace.copies, exp, numbers, prefix, cwd)
            + f'<h3 id="{prefix}edits">Suggested edits</h3>'
            + suggestions_html(exp, suggestions, not_worth_it, prefix, cwd))


def _ranks_table(traces: list[Trace], names: list[str]) -> str:
    rows = []
    for k, (t, name) in enumerate(zip(traces, names)):
        split = split_sync(t)
        sync = sum(c.time_ns for c in t.copies if c.sync)
        per_step = ("none repeats" if split.steps is None
                    else f"{split.calls_per_step:.3g} ({duration(split.ns_per_step)})")
        rank = "-" if t.meta.rank is None else str(t.meta.rank)
        rows.append(f'<tr><th scope="row"><a href="#r{k}-">{rank}</a></th><td>{esc(name)}</td>'
                    f'<td class="num">{duration(t.summary.total_ns)}</td>'
                    f'<td class="num">{per_step}</td>'
                    f'<td class="num">{share(sync, t.summary.total_ns)}</td></tr>')
    return ('<nav class="ranks" aria-label="ranks"><div class="scroll"><table><thead><tr>'
            '<th scope="col">Rank</th><th scope="col">Trace</th><th scope="col">Total</th>'
            '<th scope="col">Sync copies per step</th><th scope="col">Share</th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table></div></nav>')


def render_html(traces: list[Trace], names: list[str], cwd: str | None = None) -> str:
    """The whole page for `traces` (one, or the ranks of one run) read from the files
    `names`; `cwd` decides which paths are shown relative (default: os.getcwd())."""
    if len(traces) != len(names):
        raise ValueError(f"{len(traces)} traces, {len(names)} names")
    several = len(traces) > 1
    parts = []
    for k, (trace, name) in enumerate(zip(traces, names)):
        prefix = f"r{k}-" if several else ""
        body = trace_section(trace, prefix, cwd)
        if several:
            rank = trace.meta.rank if trace.meta.rank is not None else k
            body = (f'<section class="trace" id="r{k}-" aria-labelledby="r{k}-h">'
                    f'<h2 id="r{k}-h">Rank {rank}: {esc(name)}</h2>{body}</section>')
        else:
            body = f'<section class="trace">{body}</section>'
        parts.append(body)
    files = ", ".join(esc(n) for n in names)
    first = traces[0].meta if traces else None
    command = esc(" ".join(first.command)) if first is not None else ""
    version = esc(first.memcpy_doctor_version) if first is not None else ""
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>memcpy-doctor: {files}</title><style>{CSS}</style></head>\n"
            "<body><main><header><h1>Copies the host waited for</h1>"
            f'<p class="files">{files}</p>'
            + (f'<p class="meta">Command: <code>{command}</code></p>' if command else "")
            + "</header>\n"
            + (_ranks_table(traces, names) if several else "")
            + "\n".join(parts)
            + f"\n<footer>memcpy-doctor{' ' + version if version else ''}: one "
              "self-contained page; it loads nothing from elsewhere.</footer>"
            "</main></body></html>\n")


__all__ = ["render_html", "where_it_ran", "headline"]
