"""Why explain suggests nothing: one line saying, for the copies the host waited for, what
kept every rule from an edit, where that is knowable (issue 43: a bare "No suggestions." on a
profile whose sync copies took most of the run said nothing).

Each sync copy is put in the first of these that holds, and the line gives each group its
copies (calls, kinds, time) and the reason:
- an edit was considered for it and estimated to save nothing (listed under "Considered");
- making it non_blocking would race (analysis/races.py);
- an upload made once or in one burst (setup: a model moved): pinning is proposed only for
  uploads made every step, as pinning memory copied once costs the host a copy of its own;
- no frame of Python code around it (a profile without Python stacks), made every step, or
  once where a rule edits such a copy (a data-dependent size, a host round trip): the edit
  goes at the line that makes it, which the profile does not name;
- made inside a library with no frame of the user's code around it;
- made once or in one burst (the rules edit what repeats);
- made every step, and no rule knows an edit for it.
"""

from __future__ import annotations

from typing import Collection

from ..core.defaults import NO_STACK_NOTE
from ..core.trace import CopyRecord, Trace
from .attribution import Explanation, user_site
from .pinning import waited_upload, would_race
from .steady import per_step
from .suggestion import Suggestion

#: Where the reasons' text says to record a profile that names lines.
WITH_STACK = "torch.profiler.profile(..., with_stack=True)"

ASIDE, RACE, ONCE_UPLOAD, LINE, LINE_ONCE, LIBRARY, ONCE, NO_RULE = range(8)

#: Each reason, with {them} and {they} for the copies (one call: "it").
_REASONS = {
    ASIDE: "the edits that would remove {them} are estimated to save nothing (listed below)",
    RACE: "made non_blocking, {they} would race: the host writes {their} pinned memory "
          "again before anything waits for {them}",
    ONCE_UPLOAD: "made once or in one burst (setup: a model or data moved to the device, "
                 "say), and pinning is proposed only for uploads made every step, as pinning "
                 "memory that is copied once costs the host a copy of its own",
    LIBRARY: "made inside a library's code with no frame of your own code around {them}, "
             "and no setting of that library is known to remove {them}",
    ONCE: "made once or in one burst (setup or teardown), not every step, where the rules "
          "propose no edit",
    NO_RULE: "made every step, and no rule knows an edit for {them}",
}


def no_suggestions_reason(trace: Trace, explanation: Explanation, aside: list[Suggestion],
                          once_triggers: Collection[str] = ()) -> str:
    """Why no edit is suggested for `trace` (see the module's text), given the edits set
    aside as saving nothing and the triggers of copies a rule edits even when made once
    (rules.DataDependentShape's); words, without a final period."""
    sync = [c for c in trace.copies if c.sync]
    if not sync:
        return "no copy the host waited for" + (
            f"; {_edits(len(aside))} considered would save nothing (listed below)"
            if aside else "")
    set_aside = {id(c) for s in aside for c in s.removes}
    bounced = {id(st.copy) for ch in explanation.chains if ch.bounces for st in ch.steps}
    groups: dict[int, list[CopyRecord]] = {}
    for c in sync:
        groups.setdefault(_why(trace, c, set_aside, bounced, once_triggers), []).append(c)
    parts = []
    for key in sorted(groups):
        copies = groups[key]
        if key in (LINE, LINE_ONCE):
            why = (("made every step; " if key == LINE else "made once or in one burst; ")
                   + _line_reason(trace))
        else:
            why = _REASONS[key]
        one = sum(c.calls for c in copies) == 1
        words = ({"them": "it", "they": "it", "their": "its"} if one else
                 {"them": "them", "they": "they", "their": "their"})
        parts.append(f"{_copies(copies)}: {why.format(**words)}")
    loose = [s for s in aside if not s.removes]
    if loose:
        parts.append(f"{_edits(len(loose))} considered would save nothing (listed below)")
    return "; ".join(parts)


def _why(trace: Trace, c: CopyRecord, set_aside: set[int], bounced: set[int],
         once_triggers: Collection[str]) -> int:
    steady = per_step(c, trace.summary.total_ns)
    if id(c) in set_aside:
        return ASIDE
    if waited_upload(c) and steady and would_race(trace, [c]):
        return RACE
    if waited_upload(c) and not steady and id(c) not in bounced:
        return ONCE_UPLOAD
    if c.site is None and not c.stack:  # (rules that edit a copy made once need its line)
        once_edited = id(c) in bounced or c.trigger in once_triggers
        return LINE if steady else LINE_ONCE if once_edited else ONCE
    if user_site(c) is None:
        return LIBRARY
    return NO_RULE if steady else ONCE


def _line_reason(trace: Trace) -> str:
    if NO_STACK_NOTE in trace.meta.untraced:
        return ("an edit for {them} goes at the line that makes {them}, which this profile "
                f"does not name: record it with {WITH_STACK} to get edits at lines")
    return "no frame of Python code was recorded around {them}, so no line to edit"


def _copies(copies: list[CopyRecord]) -> str:
    """"16 sync copies (HtoD `to`, 113.1 ms)"."""
    calls = sum(c.calls for c in copies)
    kinds = ", ".join(sorted({f"{c.direction} `{c.trigger}`" for c in copies}))
    ms = sum(c.time_ns for c in copies) / 1e6
    return f"{calls} sync cop{'y' if calls == 1 else 'ies'} ({kinds}, {ms:.4g} ms)"


def _edits(n: int) -> str:
    return "the one edit" if n == 1 else f"the {n} edits"


__all__ = ["no_suggestions_reason"]
