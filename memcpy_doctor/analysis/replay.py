"""What an edit would save: the run's ordered timeline replayed with the edit and without it.

A removed sync copy does not give back its whole host time: the host waited in it for every
kernel queued before it, and without the copy the host runs ahead only until the device is
the bottleneck. Replaying the timeline's events (core/timeline.py) on two clocks, as the
simulated GPU runs them (core/costmodel.Timeline), gives back the device's idle time and the
host's wait only as far as they were on the critical path.

Each event is played from its recorded spans:
- the host's time between events (Python code) is kept as it was;
- host work (an op on the host) takes its recorded host time;
- device work (a kernel, an async copy) costs the host its launch, and the device its recorded
  time, from when both the host has launched it and the device is free;
- a sync copy queues behind earlier work, and the host waits until it is done, then pays the
  tail after it (the sync's own cost); where a real GPU did not place it, the host waits for
  the device to drain and pays the copy's own recorded time;
- a host wait (synchronize) waits for the device to drain, then pays its own time;
- a sync copy asked non_blocking from pageable memory blocks the host for its staging but does
  not wait for earlier work (the driver stages it at once).
An edit changes some copies (`Suggestion.effect`: dropped; one call left, after the loop; made
async, as pinned memory copies) and runs some ops on the host (their modeled or measured host
time, `OpRecord.run_ns`). The saving is the difference of the two replays' ends.

The timeline is a bounded prefix of the run, and the replay plays at most its first
REPLAY_EVENTS. Where the run went on past them, the saving of the window is scaled by the calls the edit changes in the whole run over those in the window (a
steady loop repeats its steps); where none of them is in the window, or the trace has no
timeline (older traces, light ones, imported ones), the estimate stays the rule's upper
bound and says so. Events of other threads than the tracer's are not replayed (their host
clocks are their own): their device work is left out of both replays alike.

`Replay.spans` gives each replayed event's host and device spans with the edits made, for a
picture of a step after them (render/html_timeline.py); the replay records them on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.costmodel import profile_of
from ..core.defaults import REPLAY_EVENTS
from ..core.trace import Trace
from .suggestion import ASYNC, DROP, ONCE, REPLAYED, UPPER_BOUND, Suggestion

#: Effects from strongest to weakest: where two edits change one copy, the strongest holds.
_STRENGTH = {DROP: 0, ONCE: 1, ASYNC: 2}

#: How an event is played (the `_Step.mode`).
_HOST, _ENQUEUE, _BLOCKING, _STAGED, _DRAIN = range(5)


@dataclass(frozen=True)
class _Step:
    """One event of the timeline as the replay needs it."""

    kind: str  # "op", "copy", "wait"
    ref: int
    mode: int
    gap_ns: int  # the host's own time since the previous event ended
    host_ns: int  # the host's own time in it (launch, staging; a wait's own cost)
    device_ns: int
    tail_ns: int  # after a sync copy's device work, before the host goes on


class Replay:
    """A trace's timeline made ready to replay, once, for any number of edits."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        timeline = trace.timeline
        self.why_not: str | None = None
        if timeline is None or not timeline.events:
            self.why_not = UPPER_BOUND
        elif trace.meta.light:
            self.why_not = "upper bound (a light trace's timeline has no ops)"
        self.complete = (timeline is not None and timeline.dropped == 0
                         and len(timeline.events) <= REPLAY_EVENTS)
        self.profile = profile_of(trace)
        self.trailing_ns = 0
        #: the timeline index of each of `steps` (events of other threads are skipped)
        self.event_index: list[int] = []
        self.steps = [] if self.why_not else self._steps()
        self.copy_index = {id(c): i for i, c in enumerate(trace.copies)}
        self.op_index = {id(o): i for i, o in enumerate(trace.ops)}
        self.base_ns = self.run({}, set())

    def _steps(self) -> list[_Step]:
        copies, launch = self.trace.copies, self.profile.launch_ns
        steps: list[_Step] = []
        last_end = 0
        device_free = 0  # as recorded: to tell a blocking event's own time from its wait
        for index, e in enumerate(self.trace.timeline.events[:REPLAY_EVENTS]):
            if e.thread is not None:
                continue
            self.event_index.append(index)
            gap = max(0, e.host_start_ns - last_end)
            last_end = e.host_end_ns
            span = e.host_end_ns - e.host_start_ns
            device = (0 if e.device_start_ns is None
                      else e.device_end_ns - e.device_start_ns)
            waited = max(0, device_free - e.host_start_ns)
            if e.device_end_ns is not None:
                device_free = max(device_free, e.device_end_ns)
            copy = copies[e.ref] if e.kind == "copy" and e.ref < len(copies) else None
            if e.kind == "wait":
                step = _Step(e.kind, e.ref, _DRAIN, gap, max(0, span - waited), 0, 0)
            elif copy is not None and copy.sync:
                if getattr(copy, "non_blocking", None) and copy.direction == "HtoD":
                    step = _Step(e.kind, e.ref, _STAGED, gap, span, device, 0)
                elif e.device_end_ns is None:  # (a real GPU's: the host's time is its all)
                    step = _Step(e.kind, e.ref, _DRAIN, gap, max(0, span - waited), 0, 0)
                else:
                    step = _Step(e.kind, e.ref, _BLOCKING, gap, min(launch, span), device,
                                 max(0, e.host_end_ns - e.device_end_ns))
            elif e.device_start_ns is None:
                step = _Step(e.kind, e.ref, _HOST, gap, span, 0, 0)
            else:
                step = _Step(e.kind, e.ref, _ENQUEUE, gap, span, device, 0)
            steps.append(step)
        total = self.trace.summary.total_ns
        self.trailing_ns = max(0, total - last_end) if self.complete else 0
        return steps

    def run(self, copies: dict[int, str], moved: set[int],
            spans: dict[int, tuple[int, int, int | None, int | None]] | None = None) -> int:
        """When the replay ends with `copies` (copy record index -> effect) changed and the
        ops at `moved` (op record indices) run on the host. With `spans`, each event played
        in the window is put there: timeline index -> (host start, host end, device start,
        device end; None for host work); an event the edits remove is not."""
        host = device = 0
        ops = self.trace.ops
        left: dict[int, _Step] = {}  # (ONCE: the last call, played after the window)
        for n, s in enumerate(self.steps):
            host += s.gap_ns
            start, begun = host, None  # (begun: when its device work starts)
            effect = copies.get(s.ref) if s.kind == "copy" else None
            if effect is not None:
                if effect != ASYNC:
                    if effect == ONCE:
                        left[s.ref] = s
                    continue
                host += self.profile.launch_ns
                begun = max(host, device)
                device = begun + self._pinned_ns(s.ref)
            elif s.kind == "op" and s.ref in moved:
                op = ops[s.ref]
                host += op.run_ns // max(op.calls, 1)
            elif s.mode == _HOST:
                host += s.host_ns
            elif s.mode == _ENQUEUE:
                host += s.host_ns
                begun = max(host, device)
                device = begun + s.device_ns
            elif s.mode == _BLOCKING:
                host += s.host_ns
                begun = max(host, device)
                device = begun + s.device_ns
                host = device + s.tail_ns
            elif s.mode == _STAGED:
                host += s.host_ns
                begun = max(host - s.device_ns, device)
                device = begun + s.device_ns
            else:  # _DRAIN
                host = max(host, device) + s.host_ns
            if spans is not None:
                spans[self.event_index[n]] = (start, host, begun,
                                              None if begun is None else device)
        host += self.trailing_ns
        if self.complete:  # the one read left of each path, once the loop is done
            for s in left.values():
                host = max(host, device) + s.host_ns + s.device_ns + s.tail_ns
        return max(host, device)

    def _pinned_ns(self, ref: int) -> int:
        c = self.trace.copies[ref]
        return self.profile.copy_ns(c.direction, c.bytes // max(c.calls, 1), True)

    def saving(self, suggestions: list[Suggestion]) -> int | None:
        """The time the edits of `suggestions`, made together, save; None when the timeline
        cannot say (none of their changes is in it)."""
        copies, moved = self._changes(suggestions)
        in_window = sum(1 for st in self.steps
                        if (st.kind == "copy" and st.ref in copies)
                        or (st.kind == "op" and st.ref in moved))
        if not in_window:
            return None
        saved = self.base_ns - self.run(copies, moved)
        if self.complete:
            return saved
        # the run went on past the window: scale by the calls changed in all of it
        trace = self.trace
        everywhere = (sum(trace.copies[i].calls - (e == ONCE) for i, e in copies.items())
                      + sum(trace.ops[i].calls for i in moved))
        return saved * everywhere // in_window

    def _changes(self, suggestions: list[Suggestion]) -> tuple[dict[int, str], set[int]]:
        """What the edits of `suggestions` change: copy record index -> effect (the strongest
        where two edits change one copy), and the op record indices they run on the host."""
        copies: dict[int, str] = {}
        moved: set[int] = set()
        for s in suggestions:
            for c in s.removes:
                i, effect = self.copy_index.get(id(c)), s.effect_on(c)
                if i is not None and _STRENGTH[effect] < _STRENGTH.get(copies.get(i), 9):
                    copies[i] = effect
            moved.update(i for i in (self.op_index.get(id(o)) for o in s.moved)
                         if i is not None)
        return copies, moved

    def spans(self, suggestions: list[Suggestion]
              ) -> dict[int, tuple[int, int, int | None, int | None]] | None:
        """Each event of the window as the replay plays it with every edit of `suggestions`
        made (see `run`); None where the trace has no timeline to replay."""
        if self.why_not:
            return None
        out: dict[int, tuple[int, int, int | None, int | None]] = {}
        self.run(*self._changes(suggestions), out)
        return out


def price(trace: Trace, suggestions: list[Suggestion], replay: Replay | None = None) -> None:
    """Set each suggestion's `saving_ns` and `estimate` from the replay, less what the edit
    itself costs (`cost_ns`); a suggestion the timeline cannot price keeps its upper bound."""
    replay = replay or Replay(trace)
    for s in suggestions:
        if not s.removes and not s.moved:  # (an edit that adds a wait: the rule's figure)
            continue
        saved = None if replay.why_not else replay.saving([s])
        if saved is None:
            s.estimate = replay.why_not or (
                f"upper bound (its copies are past the timeline's first "
                f"{len(replay.steps)} events replayed)")
            continue
        s.saving_ns = saved - s.cost_ns
        s.estimate = REPLAYED


def joint_saving(trace: Trace, suggestions: list[Suggestion],
                 replay: Replay | None = None) -> tuple[int, str] | None:
    """What making every edit of `suggestions` together saves, from one replay of them all
    (never a sum: one edit's saving can be another's), and how it was found; None when there
    is nothing to replay or the timeline cannot price them."""
    if not suggestions:
        return None
    replay = replay or Replay(trace)
    saved = None if replay.why_not else replay.saving(suggestions)
    if saved is None:
        return None
    return saved - sum(s.cost_ns for s in suggestions), REPLAYED


__all__ = ["Replay", "price", "joint_saving"]
