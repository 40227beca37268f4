"""The ranks of one distributed run: `profile --ranks N` starts them here and collects their
traces; `explain` and `diff` put the traces of several ranks side by side.

Each rank of `profile --ranks N` is a `memcpy-doctor profile --no-report` of the script that
finds its rank in the environment (see rankenv and launch) and writes its own trace; this
process then reads the traces back and reports them all. Nothing here prints: the reports
and messages come back as text, in the order the CLI prints them. Problems the user can fix
raise InputError.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..analysis.attribution import explain
from ..analysis.compare import compare
from ..analysis.ranks import compare_ranks, merge as merge_ranks
from ..analysis.rules import suggest
from ..core.defaults import EXIT_INTERRUPTED
from ..core.trace import Trace, TraceError
from ..render.diff import render_diff
from ..analysis.replay import Replay, joint_saving
from ..render.explain import render_explain
from ..render.ranks import (DiffSide, render_diff_ranks, render_explain_ranks, render_ranks_text)
from ..render.text import render_text
from .launch import RankExit, launch, worst_status
from .rankenv import rank_path
from .traces import InputError, load_trace_groups

if TYPE_CHECKING:  # profile_ranks is given the plan; what makes one is not needed here
    from .profile import ProfilePlan


@dataclass(frozen=True)
class RanksRun:
    """What `profile --ranks N` gives back once every rank has ended: the traces the ranks
    wrote (in rank order) and their names as the user gave them, the messages for stderr
    (each rank's report or why it has none, the ranks side by side, where the traces are),
    and the exit status of the run before any gate."""

    traces: list[Trace]
    names: list[str]
    messages: list[str]
    status: int


def rank_command(plan: ProfilePlan) -> list[str]:
    """The command each rank runs: this profile again, without its own report (the launcher
    reports all ranks), with every path made absolute, since it names files here."""
    options = plan.options
    cmd = [sys.executable, "-m", "memcpy_doctor", "profile", "--no-report", "--device",
           options.device, "-o", plan.out_path, "--sort", options.sort, "--log-transfers",
           str(options.log_transfers), "--timeline-events", str(options.timeline_events),
           "--trace-compiled-calls",
           "all" if options.compiled_calls_traced is None else str(options.compiled_calls_traced)]
    if options.device_profile:
        cmd += ["--device-profile", (os.path.abspath(options.device_profile)
                                     if os.path.exists(options.device_profile)
                                     else options.device_profile)]
    if options.apply_path:
        cmd += ["--apply", os.path.abspath(options.apply_path)]
    if plan.chrome_trace:
        cmd += ["--chrome-trace", os.path.abspath(plan.chrome_trace)]
    if options.light:
        cmd.append("--light")
    return cmd + [*options.target, *options.args]


def _trace_paths(plan: ProfilePlan, n: int) -> list[tuple[str, str]]:
    """(absolute path, name for messages) of each rank's trace: one rank keeps the name as
    given, several are named by rank (see rankenv)."""
    if n == 1:
        return [(plan.out_path, plan.output)]
    return [(rank_path(plan.out_path, r), rank_path(plan.output, r)) for r in range(n)]


def profile_ranks(plan: ProfilePlan, n: int) -> RanksRun:
    """Run `n` ranks of the planned profile and wait for all, then read their traces back:
    each rank's report, or why it wrote no trace, then the ranks side by side. The status
    is the worst of the ranks that ended on their own, or that of Ctrl-C."""
    paths = _trace_paths(plan, n)
    for path, _ in paths:  # a trace left from an earlier run must not pass for this one's
        try:
            os.unlink(path)
        except OSError:
            pass
    exits, interrupted = launch(rank_command(plan), n)
    traces, names, messages = _collect(exits, paths, plan.options.sort)
    if len(traces) > 1:
        messages.append(render_ranks_text(compare_ranks(traces), names))
    if traces:
        messages.append(f"memcpy-doctor: trace{'s' if len(names) > 1 else ''} written to "
                        f"{', '.join(names)}")
    status = EXIT_INTERRUPTED if interrupted else worst_status(exits)
    return RanksRun(traces, names, messages, status)


def _collect(exits: list[RankExit], paths: list[tuple[str, str]],
             sort: str) -> tuple[list[Trace], list[str], list[str]]:
    """The traces the ranks wrote, their names, and per rank its report or the line saying
    that it wrote none and how it ended (a rank killed before it could write)."""
    traces, names, messages = [], [], []
    for e, (path, name) in zip(exits, paths):
        try:
            trace = Trace.load(path)
        except TraceError:
            how = f"killed by signal {e.signal}" if e.signal else f"exit status {e.status}"
            messages.append(f"memcpy-doctor: rank {e.rank} wrote no trace ({how})")
            continue
        messages.append(render_text(trace, sort=sort))
        traces.append(trace)
        names.append(name)
    return traces, names, messages


def explain_trace(trace: Trace, fmt: str, cwd: str, budget: int | None) -> str:
    """One trace's explanation and suggested edits in `fmt`. InputError when the device
    memory budget cannot be met at all, since the user chose the budget."""
    explanation = explain(trace)
    not_worth_it: list = []
    replay = Replay(trace)
    try:
        suggestions = suggest(trace, explanation, cwd, budget, not_worth_it, replay)
    except ValueError as e:
        raise InputError(str(e)) from None
    explanation.together = joint_saving(trace, suggestions, replay)
    explanation.device_memory_budget = budget
    return render_explain(explanation, suggestions, fmt, cwd, not_worth_it=not_worth_it)


def explain_traces(traces: list[Trace], names: list[str], fmt: str, cwd: str,
                   budget: int | None) -> str:
    """The explanation of one trace, or of the ranks of one run: the ranks side by side and
    each group of ranks that make the same sync copies explained once (by its first rank),
    rather than N copies of one explanation."""
    if len(traces) == 1:
        return explain_trace(traces[0], fmt, cwd, budget)
    comp = compare_ranks(traces)
    parts = [explain_trace(traces[g[0]], fmt, cwd, budget) for g in comp.groups]
    return render_explain_ranks(comp, names, parts, fmt, cwd)


def diff_traces(before: str, after: str, cwd: str,
                execution_traces: tuple[str, ...] = (), allow_mixed: bool = False) -> str:
    """`diff BEFORE AFTER`, where each may stand for the traces of several ranks: two single
    traces are compared as they are; otherwise rank K with rank K (when both sides have as
    many), then all ranks merged, and a side whose ranks differ is flagged. The torch.profiler
    traces of both sides take `execution_traces` (see traces.load_all). InputError when a
    side names no readable trace, or traces of several runs unless `allow_mixed`."""
    (b, b_names), (a, a_names) = load_trace_groups([(before,), (after,)], execution_traces,
                                                   allow_mixed)
    if len(b) == 1 and len(a) == 1:
        return render_diff(compare(b[0], a[0]), b_names[0], a_names[0], cwd)
    pairs = [compare(x, y) for x, y in zip(b, a)] if len(b) == len(a) else None
    merged = compare(merge_ranks(b), merge_ranks(a))
    return render_diff_ranks(DiffSide(before, b, b_names, compare_ranks(b)),
                             DiffSide(after, a, a_names, compare_ranks(a)), pairs, merged, cwd)
