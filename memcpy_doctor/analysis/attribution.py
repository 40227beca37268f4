"""Attribution: each copy the host waited for, from the op that made the data to the op that
needed it elsewhere, with the lines of code; copies that bounce a tensor host -> device -> host
joined into one chain.

Pure functions over a Trace; the only outside input is `source`, a function that returns the
text of a line (linecache by default), so tests can hand in their own.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field
from typing import Callable

from ..core.paths import is_user_file
from ..core.defaults import LAUNCHES_NOTE, LIGHT_SYNC_NOTE, NO_STACK_NOTE
from ..core.trace import CopyRecord, OpRef, Site, Trace
from .bandwidth import Reference, reference
from .steady import per_step

SourceReader = Callable[[Site], str]


def read_line(site: Site) -> str:
    """The stripped text of a site's line, or "" when the file is not readable here."""
    return linecache.getline(site.file, site.line).strip()


@dataclass(frozen=True)
class End:
    """A producer or consumer as shown to the user."""

    op: str
    device: str
    site: Site | None
    text: str  # the source line

    @classmethod
    def of(cls, ref: OpRef | None, source: SourceReader) -> End | None:
        if ref is None:
            return None
        return cls(ref.op, ref.device, ref.site, source(ref.site) if ref.site else "")


def user_site(copy: CopyRecord) -> Site | None:
    """The innermost frame of the user's own code (paths.is_user_file) that led to `copy`:
    its site, or, for a copy made inside a library, the user's call that led there."""
    if copy.site is not None and is_user_file(copy.site.file):
        return copy.site
    return next((s for s in copy.stack if is_user_file(s.file)), None)


@dataclass(frozen=True)
class CopyStep:
    copy: CopyRecord
    text: str  # the copy's source line
    share: float  # of total time
    #: the user's own line that led to a copy made inside a library (None: the copy's site is
    #: the user's, or no frame of the user's code was seen), and its text
    user: Site | None = None
    user_text: str = ""


@dataclass
class Chain:
    """Copies of one tensor's data in order: producer -> copy -> op -> copy -> ... -> consumer.

    One copy alone is a chain of one. `time_ns` and `share` add up the steps."""

    producer: End | None
    steps: list[CopyStep]
    middle: list[End]  # the ops between consecutive copies (len(steps) - 1)
    consumer: End | None
    time_ns: int = 0
    share: float = 0.0
    per_step: bool = True  # a copy of it repeats through the run (analysis/steady.py)

    @property
    def bounces(self) -> bool:
        return len(self.steps) > 1

    @property
    def idle_ns(self) -> int | None:
        """The GPU idle time its copies caused, where the trace measured it (imported
        torch.profiler traces: kineto/idle.py); None where it did not."""
        known = [s.copy.idle_ns for s in self.steps if s.copy.idle_ns is not None]
        return sum(known) if known else None


@dataclass
class Explanation:
    total_ns: int
    simulated: bool
    device_name: str
    chains: list[Chain] = field(default_factory=list)
    sync_calls: int = 0
    sync_time_ns: int = 0
    #: what the trace lacks for attribution (an imported profile without Python stacks)
    notes: list[str] = field(default_factory=list)
    light: bool = False  # a light-mode trace: its times are the wall clock's, even simulated
    #: what making every suggested edit together saves, from one replay of them all
    #: (analysis/replay.joint_saving), and how it was found; None: not priced
    together: tuple[int, str] | None = None
    #: the run's device memory peak (None: not known) and the budget explain was given
    peak_device_bytes: int | None = None
    device_memory_budget: int | None = None
    #: why no edit is suggested (analysis/why_none.py; set by rules.suggest when it finds
    #: none), in words; None while there are suggestions or none were sought
    no_suggestions_reason: str | None = None
    #: the device profile each copy's bandwidth is set beside (analysis/bandwidth.py)
    reference: Reference | None = None


def explain(trace: Trace, source: SourceReader = read_line) -> Explanation:
    """Every sync copy path, joined into chains where one copy's consumer is the next copy's
    producer (the data goes back where it came from): those that repeat every step first,
    then setup and one-off ones, each most costly first."""
    total = trace.summary.total_ns
    sync = sorted((c for c in trace.copies if c.sync), key=lambda c: (-c.time_ns, -c.calls))
    by_producer: dict[OpRef, list[CopyRecord]] = {}
    for c in sync:
        if c.producer is not None:
            by_producer.setdefault(c.producer, []).append(c)

    used: set[int] = set()
    chains = []
    # Start chains at copies that no other copy feeds, so each chain is found from its head.
    fed = {id(nxt) for c in sync if c.consumer is not None
           for nxt in by_producer.get(c.consumer, []) if _opposite(c, nxt)}
    for head in [c for c in sync if id(c) not in fed] + sync:
        if id(head) in used:
            continue
        steps, middle = [head], []
        used.add(id(head))
        cur = head
        while cur.consumer is not None:
            nxt = next((n for n in by_producer.get(cur.consumer, [])
                        if id(n) not in used and _opposite(cur, n)), None)
            if nxt is None:
                break
            middle.append(End.of(cur.consumer, source))
            steps.append(nxt)
            used.add(id(nxt))
            cur = nxt
        chain = Chain(
            producer=End.of(head.producer, source),
            steps=[_step(c, total, source) for c in steps],
            middle=middle, consumer=End.of(cur.consumer, source))
        chain.time_ns = sum(s.copy.time_ns for s in chain.steps)
        chain.share = chain.time_ns / total if total else 0.0
        chain.per_step = any(per_step(s.copy, total) for s in chain.steps)
        chains.append(chain)
    # the steady state first; then by the GPU idle each caused where measured, and time
    chains.sort(key=lambda ch: (not ch.per_step, -(ch.idle_ns or 0), -ch.time_ns))
    return Explanation(total_ns=total, simulated=trace.meta.simulated,
                       device_name=trace.meta.device_name, chains=chains,
                       sync_calls=sum(c.calls for c in sync),
                       sync_time_ns=sum(c.time_ns for c in sync),
                       notes=[u for u in trace.meta.untraced
                              if u in (NO_STACK_NOTE, LIGHT_SYNC_NOTE, LAUNCHES_NOTE)],
                       reference=reference(trace),
                       light=trace.meta.light,
                       peak_device_bytes=trace.summary.peak_device_memory_bytes)


def _step(c: CopyRecord, total: int, source: SourceReader) -> CopyStep:
    mine = user_site(c)
    user = mine if mine is not c.site else None
    return CopyStep(c, source(c.site) if c.site else "", c.time_ns / total if total else 0.0,
                    user, source(user) if user else "")


def _opposite(a: CopyRecord, b: CopyRecord) -> bool:
    return {a.direction, b.direction} == {"HtoD", "DtoH"}
