"""Races as explain sees them: the edit that orders a copy before the host's access, and a check
that an edit of ours would not make a race (issue 42).

A race (core/races.py) is a bug, not a cost: its fix is required whatever it costs, comes
first, and says what it costs (the host now waits for the copy). The edit, as a diff of the
user's file:

- the copy read at once by the next statement: drop its `non_blocking=True` (the host would
  wait for it right away anyway; a blocking copy says so);
- read or written later in the same function: an event recorded after the copy and
  synchronized before the access (`copy_done = torch.cuda.Event(); copy_done.record()` after
  the copy's statement, `copy_done.synchronize()` before the access's): it waits for the copy
  and what was queued before it on its stream, no more;
- the access before the copy in the code (a pinned buffer refilled in a loop, the copy of the
  step before still reading it), or in another function: the device synchronized before the
  access (`torch.cuda.synchronize()`), which orders the copy whatever stream it was on.
"""

from __future__ import annotations

from ..core.costmodel import profile_of
from ..core.paths import format_site, is_user_file
from ..core.races import READ_BEFORE_DONE, RaceRecord
from ..core.timeline import EventTimeline
from ..core.trace import CopyRecord, Trace
from .attribution import Explanation
from .edits import indent_of, lines_change, statement_span
from .expert_source import Source, source_cache
from .suggestion import Suggestion

#: The name the event of an inserted fix takes (a number added where the file has it).
EVENT_NAME = "copy_done"
#: How a fix's cost is found: the raced copies' own modeled time, which the host then waits
#: for (at least: work queued before them on their stream too).
COST_ESTIMATE = "the raced copies' own modeled time, at least"


class RaceFix:
    """The edit that orders each race's copy before its access (see the module's text)."""

    name = "race"
    description = "Wait for a non_blocking copy before the host touches its memory"

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        read = source_cache()
        return [self._fix(trace, r, read, cwd) for r in trace.races]

    def _fix(self, trace: Trace, r: RaceRecord, read, cwd: str | None) -> Suggestion:
        profile = profile_of(trace)
        each = r.bytes // max(r.calls, 1)
        cost = r.calls * profile.copy_ns(r.direction, each, True)
        what = "reads" if r.kind == READ_BEFORE_DONE else "writes"
        where = (f"`{r.op}` at {format_site(r.access_site, cwd)} {what} the host side of the "
                 f"non_blocking {r.direction} copy at {format_site(r.copy_site, cwd)}")
        change, how = None, "wait for the copy before the access"
        ends = (r.copy_site, r.access_site)
        if all(s is not None and is_user_file(s.file) for s in ends):
            src = read(r.access_site.file)
            if src is not None:
                change, how = _edit(src, r, cwd)
        return Suggestion(
            rule=self.name, title=f"race: {how} ({where})",
            detail=(f"{r.calls} cop{'y' if r.calls == 1 else 'ies'} of {each} bytes raced "
                    f"({r.kind}): until the host waits for a non_blocking copy, its host "
                    "memory is still being " + ("written; a read sees old or partial data"
                                                if r.direction == "DtoH" else "read; a write "
                                                "reaches the device, or not, or mixed")
                    + ". The fix is required whatever it costs; the cost shown is the copies' "
                    "own time, which the host now waits for"),
            sites=[s for s in ends if s is not None], removes=[], saving_ns=-cost,
            diff=change[0] if change else None, apply=change[1] if change else None,
            exact=change is not None, required=True, cost_ns=cost, estimate=COST_ESTIMATE)


def _edit(src: Source, r: RaceRecord, cwd: str | None) -> tuple[tuple | None, str]:
    """The change (diff, apply) and what it does, for a race whose ends are in `src`'s
    file; (None, words) where no edit can be made."""
    copy_line, access_line = r.copy_site.line, r.access_site.line
    same = (r.copy_site.file == r.access_site.file
            and r.copy_site.function == r.access_site.function)
    copy_span = statement_span(src.tree, copy_line) if same else None
    access_span = statement_span(src.tree, access_line)
    if access_span is None:
        return None, "wait for the copy before the access"
    before = indent_of(src.line(access_span[0]))
    torch = src.module_alias("torch") or "torch"
    if copy_span is not None and access_line > copy_span[1]:
        next_statement = statement_span(src.tree, copy_span[1] + 1)
        if (r.kind == READ_BEFORE_DONE and next_statement == access_span
                and copy_span[0] == copy_span[1]):
            dropped = _without_non_blocking(src.line(copy_line))
            if dropped is not None:
                change = lines_change(src.path, {copy_line: dropped}, cwd)
                return change, "drop non_blocking: the copy is read at once anyway"
        name = _free_name(src)
        after = indent_of(src.line(copy_span[0]))
        last = src.line(copy_span[1])
        change = lines_change(src.path, {
            copy_span[1]: f"{last}\n{after}{name} = {torch}.cuda.Event()\n"
                          f"{after}{name}.record()",
            access_span[0]: f"{before}{name}.synchronize()\n{src.line(access_span[0])}"}, cwd)
        return change, "record an event after the copy and wait for it before the access"
    change = lines_change(src.path, {
        access_span[0]: f"{before}{torch}.cuda.synchronize()  # the copy must be done first\n"
                        f"{src.line(access_span[0])}"}, cwd)
    return change, "synchronize the device before the access"


def _without_non_blocking(line: str) -> str | None:
    """`line` with its `non_blocking=True` keyword taken out; None where it has none."""
    for text in (", non_blocking=True", "non_blocking=True, ", "non_blocking=True"):
        if text in line:
            return line.replace(text, "", 1)
    return None


def _free_name(src: Source) -> str:
    text = "".join(src.lines)
    name, n = EVENT_NAME, 1
    while name in text:
        n += 1
        name = f"{EVENT_NAME}{n}"
    return name


def writes_before_ordered(trace: Trace, copy: CopyRecord) -> bool | None:
    """Whether, in the trace's timeline, the host writes the source of `copy` (a copy from
    the host) after one of its calls before any sync orders it: making that copy non_blocking
    would make a race. None where the timeline does not hold the copy."""
    timeline: EventTimeline | None = trace.timeline
    if timeline is None:
        return None
    try:
        ref = next(i for i, c in enumerate(trace.copies) if c is copy)
    except StopIteration:
        return None
    copies, seen, pending = trace.copies, False, set()  # (its source, since its last call)
    for e in timeline.events:  # (one pass: each call's source, until a sync orders it)
        if e.kind == "copy" and e.ref == ref:
            seen = True
            pending.update(e.reads)
        elif e.kind == "wait" or e.kind == "copy" and _orders(copies[e.ref]):
            pending.clear()
        elif pending and e.kind == "op" and e.stream is None and not pending.isdisjoint(
                e.writes):
            return True
    return False if seen else None


def _orders(c: CopyRecord) -> bool:
    """Whether the host waited for its stream to drain at copy `c` (a sync copy, but not a
    host->device one from pageable memory with non_blocking, which waits for its staging
    alone: tracer/context.py's `_order`)."""
    return c.sync and not (c.non_blocking and c.direction == "HtoD")
