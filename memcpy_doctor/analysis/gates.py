"""CI gates: thresholds and baselines on named metrics of a trace.

Counts and bytes of copies are the same from run to run; under the simulated GPU the modeled
times are too, except for the program's own (measured) Python time in the total. Metrics are
computed after removing allow-listed copy sites. Expressions are parsed, never evaluated.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Callable

from ..core.races import RaceRecord
from ..core.trace import CopyRecord, Site, Trace
from ..core.units import format_value, parse_bytes
from .attribution import read_line, user_site


class GateError(ValueError):
    """A threshold, tolerance or allow-list the user wrote that cannot be read."""


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # count | bytes | time (ns) | ratio (0..1)
    description: str
    value: Callable[[Trace, list[CopyRecord]], float]


def _copies(pred: Callable[[CopyRecord], bool], attr: str):
    return lambda trace, copies: sum(getattr(c, attr) for c in copies if pred(c))


def _ratio(ns: Callable[[Trace, list[CopyRecord]], float]):
    return lambda trace, copies: (ns(trace, copies) / trace.summary.total_ns
                                  if trace.summary.total_ns else 0.0)


def _build_metrics() -> dict[str, Metric]:
    found: list[Metric] = []

    def add(name: str, kind: str, description: str, value) -> None:
        found.append(Metric(name, kind, description, value))

    add("copy_calls", "count", "copies between host and device", _copies(lambda c: True, "calls"))
    add("sync_calls", "count", "copies the host waited for", _copies(lambda c: c.sync, "calls"))
    add("async_calls", "count", "copies the host did not wait for",
        _copies(lambda c: not c.sync, "calls"))
    for d in ("HtoD", "DtoH", "DtoD"):
        low = d.lower()
        add(f"sync_calls_{low}", "count", f"{d} copies the host waited for",
            _copies(lambda c, d=d: c.sync and c.direction == d, "calls"))
        add(f"async_calls_{low}", "count", f"{d} copies the host did not wait for",
            _copies(lambda c, d=d: not c.sync and c.direction == d, "calls"))
        add(f"bytes_{low}", "bytes", f"bytes copied {d}",
            _copies(lambda c, d=d: c.direction == d, "bytes"))
    add("bytes", "bytes", "bytes copied, all directions", _copies(lambda c: True, "bytes"))
    memcpy = _copies(lambda c: True, "time_ns")
    sync = _copies(lambda c: c.sync, "time_ns")
    add("memcpy_time", "time", "GpuMemcpy Total (host + device time of all copies)", memcpy)
    add("sync_time", "time", "GpuMemcpySync Total", sync)
    add("async_time", "time", "GpuMemcpyAsync Total", _copies(lambda c: not c.sync, "time_ns"))
    add("memcpy_ratio", "ratio", "GpuMemcpy Total over Total time", _ratio(memcpy))
    add("sync_ratio", "ratio", "GpuMemcpySync Total over Total time", _ratio(sync))
    add("wait_calls", "count", "host waits that are not copies (synchronize, ...)",
        lambda trace, copies: sum(w.calls for w in trace.waits))
    add("wait_time", "time", "host time in those waits",
        lambda trace, copies: sum(w.wait_ns for w in trace.waits))
    add("total_time", "time", "Total time of the run",
        lambda trace, copies: trace.summary.total_ns)
    add("races", "count", "host accesses to a copy still in flight (copies raced)",
        lambda trace, copies: sum(r.calls for r in trace.races))
    return {m.name: m for m in found}


#: Every metric a gate can name, in one table (the README lists it).
METRICS = _build_metrics()

_TIME_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_NUMBER = r"(\d+(?:\.\d+)?)"


def parse_value(metric: Metric, text: str) -> float:
    """A limit in the metric's units: counts as integers, bytes with KiB/MB..., times with
    ns/us/ms/s (plain numbers are ms), ratios as 5% or 0.05."""
    t = text.strip().lower()
    if metric.kind == "count":
        if not re.fullmatch(r"\d+", t):
            raise GateError(f"{metric.name}: {text!r} is not a whole number")
        return int(t)
    if metric.kind == "bytes":
        try:
            return parse_bytes(text)
        except (ValueError, TypeError) as e:
            raise GateError(f"{metric.name}: {e}") from None
    if metric.kind == "time":
        m = re.fullmatch(_NUMBER + r"\s*(ns|us|ms|s)?", t)
        if not m:
            raise GateError(f"{metric.name}: {text!r} is not a time (e.g. 5ms, 200us, 1.5s)")
        return float(m.group(1)) * _TIME_UNITS[m.group(2) or "ms"]
    m = re.fullmatch(_NUMBER + r"\s*(%)?", t)
    if not m:
        raise GateError(f"{metric.name}: {text!r} is not a ratio (e.g. 5% or 0.05)")
    return float(m.group(1)) / (100 if m.group(2) else 1)


def parse_threshold(text: str) -> tuple[str, float]:
    """"NAME=VALUE" (also NAME<=VALUE) -> (name, limit)."""
    m = re.fullmatch(r"\s*([a-z_]+)\s*(?:<=|=)\s*(.+?)\s*", text)
    if not m:
        raise GateError(f"{text!r}: write NAME=VALUE, e.g. sync_calls=0 or memcpy_ratio=5%")
    name = m.group(1)
    if name not in METRICS:
        raise GateError(f"unknown metric {name!r}; known: {', '.join(METRICS)}")
    return name, parse_value(METRICS[name], m.group(2))


def parse_tolerance(text: str) -> tuple[str | None, float]:
    """"10%" for every metric, or "NAME=10%" for one -> (name or None, fraction)."""
    name = None
    value = text
    if "=" in text:
        name, value = (s.strip() for s in text.split("=", 1))
        if name not in METRICS:
            raise GateError(f"unknown metric {name!r} in --tolerance {text!r}")
    m = re.fullmatch(_NUMBER + r"\s*(%)?", value.strip())
    if not m:
        raise GateError(f"--tolerance {text!r}: write 10% or NAME=10%")
    return name, float(m.group(1)) / (100 if m.group(2) else 1)


def site_key(c: CopyRecord, root: str) -> str:
    """A copy's site as the user names it: path relative to `root` (when under it), :line."""
    return "?" if c.site is None else site_name(c.site, root)


def site_name(site: Site, root: str) -> str:
    """A site as the user names it: path relative to `root` (when under it), :line."""
    path = site.file
    rel = os.path.relpath(path, root) if path.startswith(root.rstrip(os.sep) + os.sep) else path
    return f"{rel.replace(os.sep, '/')}:{site.line}"


def allowed(c: CopyRecord, patterns: list[str], root: str) -> bool:
    """Matches an allow-list entry: "path:LINE", "path" (any line), or a glob of either."""
    key = site_key(c, root)
    path = key.rsplit(":", 1)[0]
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(path, p) for p in patterns)


@dataclass
class GateResult:
    metric: str
    kind: str
    value: float
    limit: float | None = None  # --max
    baseline: float | None = None  # --baseline
    tolerance: float = 0.0
    passed: bool = True
    reason: str = ""
    improved: bool = False


@dataclass
class PathFinding:
    """A sync copy path behind a failure: new against the baseline, grown, or over a limit."""

    status: str  # new | grown | over
    copy: CopyRecord
    key: str  # path:line relative to the root
    baseline_calls: int | None = None


@dataclass
class CheckResult:
    gates: list[GateResult]
    findings: list[PathFinding] = field(default_factory=list)
    simulated: bool = False
    allowed_paths: int = 0
    #: the trace's races (core/races.py), each shown at its access's line by every format
    races: list[RaceRecord] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)


def check(trace: Trace, limits: dict[str, float] | None = None, baseline: Trace | None = None,
          tolerance: dict[str | None, float] | None = None, allow: list[str] | None = None,
          root: str | None = None) -> CheckResult:
    """Evaluate the gates. With a baseline, every metric is compared (fail on regression beyond
    the tolerance, say what got better); `limits` are absolute maxima."""
    root = root or os.getcwd()
    limits = limits or {}
    tolerance = tolerance or {}
    allow = allow or []
    copies = [c for c in trace.copies if not allowed(c, allow, root)]
    base_copies = ([c for c in baseline.copies if not allowed(c, allow, root)]
                   if baseline is not None else [])
    names = list(limits)
    if baseline is not None:
        # counts and bytes are the same run to run; times and ratios hold measured Python time,
        # so they are compared only when named
        names += [n for n, m in METRICS.items() if m.kind in ("count", "bytes")]
        names += [n for n in tolerance if n is not None]
    gates = []
    for name in dict.fromkeys(names):
        m = METRICS[name]
        value = m.value(trace, copies)
        g = GateResult(name, m.kind, value)
        reasons = []
        if name in limits:
            g.limit = limits[name]
            if value > g.limit:
                g.passed = False
                reasons.append(f"{format_value(m.kind, value)} > max "
                               f"{format_value(m.kind, g.limit)}")
        if baseline is not None:
            base = m.value(baseline, base_copies)
            tol = tolerance.get(name, tolerance.get(None, 0.0))
            g.baseline, g.tolerance = base, tol
            if value > base * (1 + tol) and value > base:
                g.passed = False
                reasons.append(f"{format_value(m.kind, value)} > baseline "
                               f"{format_value(m.kind, base)}" + (f" +{tol:.0%}" if tol else ""))
            elif value < base:
                g.improved = True
        g.reason = "; ".join(reasons)
        gates.append(g)
    result = CheckResult(gates, simulated=trace.meta.simulated,
                         allowed_paths=len(trace.copies) - len(copies), races=list(trace.races))
    result.findings = _findings(result, copies, base_copies, baseline is not None, root)
    return result


def _findings(result: CheckResult, copies: list[CopyRecord], base: list[CopyRecord],
              has_baseline: bool, root: str) -> list[PathFinding]:
    """The sync copy paths to fix: new or grown against the baseline, else (a limit failed)
    every sync path, costliest first."""
    failed = [g for g in result.gates if not g.passed]
    if not failed:
        return []
    mine: dict[tuple, list[CopyRecord]] = {}
    for c in copies:
        if c.sync:
            mine.setdefault(path_identity(c, root), []).append(c)
    if has_baseline:
        before: dict[tuple, int] = {}
        for c in base:
            if c.sync:
                k = path_identity(c, root)
                before[k] = before.get(k, 0) + c.calls
        out = []
        for k, recs in mine.items():
            calls = sum(c.calls for c in recs)
            top = max(recs, key=lambda c: c.calls)
            if k not in before:
                out.append(PathFinding("new", top, site_key(top, root)))
            elif calls > before[k]:
                out.append(PathFinding("grown", top, site_key(top, root), before[k]))
        if out:
            return sorted(out, key=lambda f: (f.status != "new", -f.copy.calls, f.key))
    return sorted((PathFinding("over", max(recs, key=lambda c: c.calls),
                               site_key(max(recs, key=lambda c: c.calls), root))
                   for recs in mine.values()),
                  key=lambda f: (-f.copy.time_ns, f.key))


def path_identity(c: CopyRecord, root: str) -> tuple:
    """What makes a copy path the same one in a baseline and a new trace: not its line, which
    moves when code is added above it, but its kind, file, function and producer op; for a
    copy made inside a library, also the user's line that led there, by its file, function
    and text (a library line called from two lines of the user's code is two paths)."""
    file = site_key(c, root).rsplit(":", 1)[0]
    user = user_site(c)
    caller = (None if user is None or user is c.site else
              (site_name(user, root).rsplit(":", 1)[0], user.function, read_line(user)))
    return (c.direction, c.trigger, file, c.site.function if c.site else None,
            c.producer.op if c.producer else None, caller)
