"""`memcpy-doctor check` output as text and JSON (other formats: github, sarif, junit)."""

from __future__ import annotations

import json
from typing import Any

from ..analysis.attribution import user_site
from ..analysis.gates import CheckResult, PathFinding
from ..core.paths import format_site
from ..core.races import READ_BEFORE_DONE, RaceRecord
from ..core.units import format_value
from .text import format_ref


def _finding_line(f: PathFinding, cwd: str | None) -> str:
    c = f.copy
    grown = f" (was {f.baseline_calls} calls)" if f.status == "grown" else ""
    return (f"{f.key}: {f.status} {c.direction} sync copy `{c.trigger}`, {c.calls} calls"
            f"{grown}, {c.bytes} B; {format_ref(c.producer, cwd)} -> "
            f"{format_ref(c.consumer, cwd)}")


def finding_message(f: PathFinding, cwd: str | None = None) -> str:
    """One line naming the copy path, its change and producer -> consumer, and for a copy
    made inside a library the user's line that led there (used by every format, and by the
    pytest plugin)."""
    mine = user_site(f.copy)
    if mine is None or mine is f.copy.site:
        return _finding_line(f, cwd)
    return f"{_finding_line(f, cwd)}; from your code at {format_site(mine, cwd)}"


def race_message(r: RaceRecord, cwd: str | None = None) -> str:
    """One line naming a race: what the host did at the access's line to which copy, and
    how often (used by every format and the report)."""
    side = "destination" if r.direction == "DtoH" else "source"
    did = "reads" if r.kind == READ_BEFORE_DONE else "writes"
    copies = f"{r.calls} cop{'y' if r.calls == 1 else 'ies'}"
    thread = f" [thread {r.thread}]" if r.thread is not None else ""
    return (f"race ({r.kind}): `{r.op}` at {format_site(r.access_site, cwd)}{thread} {did} "
            f"the {side} of the non_blocking {r.direction} copy `{r.trigger}` at "
            f"{format_site(r.copy_site, cwd)} before anything waited for it ({copies}, "
            f"{r.bytes} B); wait for the copy first (explain gives the edit)")


def render_check_text(result: CheckResult, cwd: str | None = None) -> str:
    lines = []
    for g in result.gates:
        status = "ok  " if g.passed else "FAIL"
        base = (f", baseline {format_value(g.kind, g.baseline)}"
                if g.baseline is not None else "")
        limit = f", max {format_value(g.kind, g.limit)}" if g.limit is not None else ""
        better = "  (improved)" if g.improved else ""
        why = f"  <- {g.reason}" if g.reason else ""
        lines.append(f"{status} {g.metric} = {format_value(g.kind, g.value)}{limit}{base}"
                     f"{better}{why}")
    if result.findings:
        lines += ["", "Copy paths to fix:"]
        lines += [f"  {finding_message(f, cwd)}" for f in result.findings]
    if result.races:
        lines += ["", "Races (the host touched a copy still in flight):"]
        lines += [f"  {race_message(r, cwd)}" for r in result.races]
    if result.allowed_paths:
        lines.append(f"\n{result.allowed_paths} allow-listed copy paths not counted")
    lines += ["", summary_line(result)]
    return "\n".join(lines) + "\n"


def summary_line(result: CheckResult) -> str:
    """The verdict, worded as the text format's last line."""
    failed = sum(not g.passed for g in result.gates)
    return (f"memcpy-doctor check: {'passed' if result.passed else 'FAILED'} "
            f"({len(result.gates) - failed} passed, {failed} failed"
            f"{'; simulated GPU' if result.simulated else ''})")


def check_dict(result: CheckResult) -> dict[str, Any]:
    def site(c):
        return None if c.site is None else {"file": c.site.file, "line": c.site.line,
                                            "function": c.site.function}
    return {
        "passed": result.passed, "simulated": result.simulated,
        "allowed_paths": result.allowed_paths,
        "gates": [{"metric": g.metric, "kind": g.kind, "value": g.value, "limit": g.limit,
                   "baseline": g.baseline, "tolerance": g.tolerance, "passed": g.passed,
                   "improved": g.improved, "reason": g.reason} for g in result.gates],
        "findings": [{"status": f.status, "key": f.key, "baseline_calls": f.baseline_calls,
                      "direction": f.copy.direction, "trigger": f.copy.trigger,
                      "calls": f.copy.calls, "bytes": f.copy.bytes, "site": site(f.copy),
                      "message": finding_message(f)} for f in result.findings],
    }


def render_check_json(result: CheckResult) -> str:
    return json.dumps(check_dict(result), indent=1) + "\n"
