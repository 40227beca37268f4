"""The gates of `check` and `profile --gate`, run on one trace or on the traces of several ranks.

A GateConfig (thresholds, a baseline, allowed sites) comes from the command line and
pyproject.toml (see config). Each trace is checked against it; a rank compares with the same
rank's baseline where there is one. The result comes back as (passed, text in the format
asked for); the CLI prints the text and turns `passed` into the exit status. Problems the
user can fix (an unreadable baseline, a format that takes one trace only) raise InputError.
"""

from __future__ import annotations

import dataclasses
import os

from ..analysis.gates import CheckResult, check
from ..analysis.ranks import compare_ranks
from ..core.trace import Trace
from ..render.check import render_check_json, render_check_text
from ..render.ranks import render_rank_checks
from .config import GateConfig
from .rankenv import RankInfo, path_for
from .traces import InputError, load_trace

#: The output formats of a gate result.
CHECK_FORMATS = ("text", "json", "github", "sarif", "junit")


def rank_baseline(config: GateConfig, rank: RankInfo | None) -> GateConfig:
    """The config a rank is gated with: a rank compares with the same rank's baseline where
    there is one (base.rank1.json for --baseline base.json), else with the baseline as
    named, so that a run of several ranks can keep one baseline per rank."""
    own = path_for(config.baseline, rank)
    if own != config.baseline and os.path.exists(own):
        return dataclasses.replace(config, baseline=own)
    return config


def check_formats(fmt: str, count: int) -> None:
    """InputError when `fmt` cannot hold the results of `count` traces: SARIF and JUnit
    documents describe one run, so several ranks would need several files."""
    if count > 1 and fmt in ("sarif", "junit"):
        raise InputError(f"--format {fmt} gates one trace at a time, not {count}: give one "
                         "rank's trace, or use text, json or github")


def render_gate(result: CheckResult, config: GateConfig, fmt: str) -> str:
    """The gate result in `fmt`. Paths are shown relative to the config's root; SARIF also
    points at the pyproject.toml the thresholds came from. The renderers of the CI formats
    are imported only when asked for, to keep the CLI's start quick."""
    if fmt == "json":
        return render_check_json(result)
    if fmt == "github":
        from ..render.github import render_github
        return render_github(result, config.root)
    if fmt == "sarif":
        from ..render.sarif import render_sarif
        anchor = (os.path.relpath(config.source, config.root) if config.source
                  else "pyproject.toml")
        return render_sarif(result, config.root, anchor=anchor)
    if fmt == "junit":
        from ..render.junit import render_junit
        return render_junit(result, config.root)
    return render_check_text(result, config.root)


def gate_trace(trace: Trace, config: GateConfig, fmt: str) -> tuple[bool, str]:
    """Check one trace against the config: whether it passed, and the result in `fmt`.
    InputError when the baseline cannot be read."""
    base = load_trace(config.baseline) if config.baseline else None
    result = check(trace, config.limits, base, config.tolerance, config.allow, config.root)
    return result.passed, render_gate(result, config, fmt)


def gate_traces(traces: list[Trace], names: list[str], config: GateConfig,
                fmt: str) -> tuple[bool, str]:
    """Gate each trace, each rank against its own baseline (see rank_baseline); it passes
    when every trace does. The output of several: each rank's result under its label, then
    the ranks whose copies differ. InputError for a one-trace format or an unreadable
    baseline."""
    if len(traces) == 1:
        return gate_trace(traces[0], config, fmt)
    check_formats(fmt, len(traces))
    outcomes = []
    for trace in traces:
        rank = (RankInfo(trace.meta.rank, trace.meta.world_size or len(traces), 0)
                if trace.meta.rank is not None else None)
        own = rank_baseline(config, rank) if config.baseline else config
        outcomes.append(gate_trace(trace, own, fmt))
    passed = all(ok for ok, _ in outcomes)
    text = render_rank_checks([t.meta.rank for t in traces], names, outcomes,
                              compare_ranks(traces), fmt, config.root)
    return passed, text
