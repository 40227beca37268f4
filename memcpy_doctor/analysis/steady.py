"""Steady state and setup: which copy paths repeat every step of a program's loop, and which
happen once (model and optimizer set-up, a first-batch check, teardown).

A copy path (a CopyRecord) is per step when it was made more than once and its calls spread
over at least PER_STEP_MIN_SPREAD of the run, from its first call to its last. One call, or
many calls in one burst (`model.to(device)` copies every parameter once, within a moment of
each other), are setup. Traces written before copies kept their times count every repeated
path as per step.

The number of steps is estimated from the ops the user's own code runs on the device: the
commonest call count among them (a loop body's ops run once a step; a layer used twice, twice),
the smaller of equally common ones. Where the user's code runs no device op itself (a
Trainer runs the model), the commonest call count of the copy paths made every step, sync or
not, stands in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..core.defaults import PER_STEP_MIN_SPREAD
from ..core.paths import is_user_file
from ..core.trace import CopyRecord, Trace


def per_step(copy: CopyRecord, total_ns: int) -> bool:
    """Whether `copy` repeats through a run of `total_ns` rather than once or in one burst."""
    if copy.calls < 2:
        return False
    if copy.first_ns is None or copy.last_ns is None:
        return True
    return copy.last_ns - copy.first_ns >= PER_STEP_MIN_SPREAD * total_ns


@dataclass(frozen=True)
class StepSplit:
    """The sync copies split into those made every step and the rest (setup, one-off)."""

    steps: int | None  # estimated; None when nothing repeats
    step_calls: int  # sync calls of the per-step paths, in the whole run
    step_ns: int
    setup_calls: int
    setup_ns: int

    @property
    def calls_per_step(self) -> float:
        return self.step_calls / self.steps if self.steps else 0.0

    @property
    def ns_per_step(self) -> float:
        return self.step_ns / self.steps if self.steps else 0.0


def split_sync(trace: Trace) -> StepSplit:
    """The run's sync copies, per step and setup."""
    total = trace.summary.total_ns
    steady: list[CopyRecord] = []
    once: list[CopyRecord] = []
    for c in trace.copies:
        if c.sync:
            (steady if per_step(c, total) else once).append(c)
    steps = estimate_steps(trace) if steady else None
    return StepSplit(steps, sum(c.calls for c in steady), sum(c.time_ns for c in steady),
                     sum(c.calls for c in once), sum(c.time_ns for c in once))


def estimate_steps(trace: Trace) -> int | None:
    """How many steps the program's loop ran (see the module docstring); None if unknown."""
    counts = Counter(o.calls for o in trace.ops
                     if o.calls > 1 and o.device != "cpu" and o.site is not None
                     and is_user_file(o.site.file))
    if not counts:  # (asynchronous copies too: a batch uploaded every step counts)
        counts = Counter(c.calls for c in trace.copies if per_step(c, trace.summary.total_ns))
    return min(counts, key=lambda n: (-counts[n], n)) if counts else None
