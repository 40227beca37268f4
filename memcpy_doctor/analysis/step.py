"""One steady step of a run, picked from its timeline (the run's first events in order), for
a picture of where the host waits in a step (render/html_timeline.py).

A step starts where the loop body's first repeated event starts: the first event, in the
timeline's order, of a record (an op, a copy path, a wait) made exactly once a step, i.e.
with as many calls as the run's estimated steps (analysis/steady.py). Its occurrences split
the timeline into steps; the first step (warm-up: caches, first allocations) is passed over
when there are others, and of the rest the one of median length is taken. Of the records
that could mark a step, the first (ops first) whose step holds a sync copy made every step
(analysis/steady.py per_step) is taken, where the run has such copies: a record called once a
step by count alone may be the model's setup (16 weight initialisations in a run of 16
steps: an HF Trainer's), whose "steps" hold none of the loop. Events of other threads than
the tracer's are left out: their host clocks are their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.timeline import TimelineEvent
from ..core.trace import Trace
from .steady import estimate_steps, per_step


@dataclass(frozen=True)
class StepWindow:
    """Events `first` to `end` (exclusive) of the trace's timeline, and their span on the
    host's clock (`start_ns` to `end_ns`: the start of the next step's first event).

    `number` is the step's place among the `complete` steps the timeline holds whole
    (1-based); `marker` is the (kind, ref) of the record that starts each step. Where no
    record repeats once a step, the window is the timeline's whole span, `number` is 0 and
    `marker` None."""

    first: int
    end: int
    start_ns: int
    end_ns: int
    number: int
    complete: int
    marker: tuple[str, int] | None


def _calls(trace: Trace, kind: str, ref: int) -> int | None:
    table = {"op": trace.ops, "copy": trace.copies, "wait": trace.waits}[kind]
    return table[ref].calls if ref < len(table) else None


def _whole(events: list[TimelineEvent], main: list[int]) -> StepWindow | None:
    if not main:
        return None
    end_ns = max(max(events[i].host_end_ns, events[i].device_end_ns or 0) for i in main)
    return StepWindow(main[0], main[-1] + 1, events[main[0]].host_start_ns, end_ns, 0, 0, None)


def pick_step(trace: Trace) -> StepWindow | None:
    """The steady step to show (see the module docstring); the timeline's whole span where no
    record repeats once a step; None where the trace has no timeline events of the tracer's
    thread."""
    timeline = trace.timeline
    if timeline is None:
        return None
    events = timeline.events
    main = [i for i, e in enumerate(events) if e.thread is None]
    steps = estimate_steps(trace)
    if steps is None or steps < 2:
        return _whole(events, main)
    seen: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int]] = []
    for i in main:
        key = (events[i].kind, events[i].ref)
        if key not in seen:
            if _calls(trace, *key) != steps:
                seen[key] = []  # (not once a step: never a marker)
                continue
            order.append(key)
            seen[key] = []
        seen[key].append(i)
    # ops mark a step best (a copy or a wait may be what an edit removes); then the earliest
    markers = ([k for k in order if k[0] == "op" and len(seen[k]) >= 2]
               + [k for k in order if k[0] != "op" and len(seen[k]) >= 2])
    steady = {i for i, c in enumerate(trace.copies)
              if c.sync and per_step(c, trace.summary.total_ns)}
    windows = [_median_step(events, seen[k], k) for k in markers]
    for win in windows:
        if not steady or any(events[i].kind == "copy" and events[i].ref in steady
                             for i in range(win.first, win.end)):
            return win
    return windows[0] if windows else _whole(events, main)


def _median_step(events: list[TimelineEvent], at: list[int],
                 marker: tuple[str, int]) -> StepWindow:
    """The step of median length of those `marker`'s occurrences `at` split the timeline
    into, the first (warm-up) passed over when there are others."""
    spans = [(at[k], at[k + 1]) for k in range(len(at) - 1)]
    candidates = list(range(1, len(spans))) or [0]  # (the first step warms up)
    candidates.sort(key=lambda k: (events[spans[k][1]].host_start_ns
                                   - events[spans[k][0]].host_start_ns, k))
    k = candidates[(len(candidates) - 1) // 2]
    first, end = spans[k]
    return StepWindow(first, end, events[first].host_start_ns, events[end].host_start_ns,
                      k + 1, len(spans), marker)


__all__ = ["StepWindow", "pick_step"]
