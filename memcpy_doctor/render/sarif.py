"""`memcpy-doctor check --format sarif`: SARIF 2.1.0 for GitHub code scanning and other viewers.

One run. Each copy path to fix is a result at its site, its URI relative to the repository root
(`%SRCROOT%`, given in `originalUriBaseIds`). Its `partialFingerprints` hash the direction,
trigger, relative path and function but not the line, so code scanning keeps tracking the same
alert when the code above it moves. A failed gate is an "error" result and an improved one a
"note"; a race (the host touching a copy still in flight) is an "error" result at the line of
the access; rules are those the results name: one per finding status, gate metric, race kind.

GitHub rejects a whole upload when any result lacks a location, and a gate has no site, so
results without one (gates; copies without a site or in a pseudo-file) are placed on line 1 of
`anchor`, by default pyproject.toml, where `[tool.memcpy-doctor]` sets the gates. Sites outside
the root keep an absolute file:// URI, which code scanning cannot show on a file of the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import urllib.parse
from typing import Any

from ..core import __version__
from ..analysis.gates import METRICS, CheckResult, GateResult, PathFinding
from ..core.races import READ_BEFORE_DONE, RaceRecord
from .check import finding_message, race_message
from .github import (finding_location, gate_message, improvement_message, race_location,
                     site_location)

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
TOOL_NAME = "memcpy-doctor"
# The project has no homepage yet; its package index page is the one address it will have.
INFORMATION_URI = "https://pypi.org/project/memcpy-doctor/"
SRCROOT = "%SRCROOT%"
#: partialFingerprints key; bump the version if what the hash covers changes.
FINGERPRINT_KEY = "memcpyDoctorCopyPath/v1"
GATE_FINGERPRINT_KEY = "memcpyDoctorGate/v1"
RACE_FINGERPRINT_KEY = "memcpyDoctorRace/v1"

_HOW_TO_FIX = (
    "Run `memcpy-doctor explain` on the trace: it follows the copy from the op that made the "
    "tensor to the op that first reads the result, and suggests a change (run those ops on the "
    "host, pin the memory and copy with non_blocking=True, read a value once after the loop "
    "instead of in it, ...). If the copy is intended, add its site to `allow` in "
    "[tool.memcpy-doctor].")

#: status -> (rule id suffix, name, short description, what the status means)
_FINDING_RULES = {
    "new": ("new-sync-copy", "NewSyncCopy",
            "A copy the host waits for that the baseline did not have",
            "This copy between host and GPU is synchronous: the host stops until it is done. "
            "The baseline trace has no copy with the same direction, trigger and site, so the "
            "change under review added it."),
    "grown": ("grown-sync-copy", "GrownSyncCopy",
              "A copy the host waits for that runs more often than in the baseline",
              "This copy between host and GPU is synchronous: the host stops until it is done. "
              "It already existed in the baseline trace, but it now runs more times."),
    "over": ("sync-copy-over-limit", "SyncCopyOverLimit",
             "A copy the host waits for, behind a metric over its limit",
             "This copy between host and GPU is synchronous: the host stops until it is done. "
             "A gate's limit failed and this is one of the synchronous copy paths that count "
             "toward it, costliest first."),
}


def finding_rule_id(status: str) -> str:
    return f"{TOOL_NAME}/{_FINDING_RULES[status][0]}"


def gate_rule_id(metric: str) -> str:
    return f"{TOOL_NAME}/gate/{metric}"


def path_fingerprint(f: PathFinding, root: str) -> str:
    """Stable across line moves: direction, trigger, path relative to `root`, function."""
    c = f.copy
    loc = finding_location(f, root)
    parts = [c.direction, c.trigger, loc[0] if loc else "?",
             c.site.function if c.site is not None else ""]
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _text(s: str) -> dict[str, str]:
    return {"text": s}


def _finding_rule(status: str) -> dict[str, Any]:
    _, name, short, meaning = _FINDING_RULES[status]
    return {"id": finding_rule_id(status), "name": name, "shortDescription": _text(short),
            "fullDescription": _text(meaning), "help": _text(f"{meaning}\n\n{_HOW_TO_FIX}"),
            "defaultConfiguration": {"level": "error"},
            "properties": {"tags": ["performance", "gpu"]}}


def _gate_rule(metric: str) -> dict[str, Any]:
    m = METRICS[metric]
    return {"id": gate_rule_id(metric), "name": f"Gate:{metric}",
            "shortDescription": _text(f"{metric}: {m.description}"),
            "fullDescription": _text(
                f"The check gate on the metric {metric} ({m.description}, a {m.kind}): it "
                "fails when the value is above its limit (--max) or above the baseline plus "
                "the tolerance (--baseline, --tolerance)."),
            "help": _text(
                f"{metric} measures {m.description} in the profiled run. Gates are set by "
                "--max, --baseline and --tolerance, or in [tool.memcpy-doctor] in "
                "pyproject.toml. A failure lists the synchronous copy paths behind it as "
                f"separate results.\n\n{_HOW_TO_FIX}"),
            "defaultConfiguration": {"level": "error"},
            "properties": {"tags": ["performance", "gpu"]}}


def _location(uri: str, line: int, base: bool) -> dict[str, Any]:
    artifact: dict[str, Any] = {"uri": uri}
    if base:
        artifact["uriBaseId"] = SRCROOT
    return {"physicalLocation": {"artifactLocation": artifact, "region": {"startLine": line}}}


def _relative_uri(path: str) -> str:
    return urllib.parse.quote(path.replace(os.sep, "/"), safe="/", errors="surrogateescape")


def _finding_location(f: PathFinding, root: str, anchor) -> dict[str, Any]:
    return _at(finding_location(f, root), anchor)


def _at(loc: tuple[str, int] | None, anchor) -> dict[str, Any]:
    if loc is None:
        return anchor()
    path, line = loc
    if os.path.isabs(path):
        return _location(pathlib.Path(path).as_uri(), line, base=False)
    return _location(_relative_uri(path), line, base=True)


def race_rule_id(kind: str) -> str:
    return f"{TOOL_NAME}/race/{kind}"


def _race_rule(kind: str) -> dict[str, Any]:
    reads = kind == READ_BEFORE_DONE
    short = ("The host read a device-to-host copy's destination before waiting for it" if reads
             else "The host wrote the host side of a copy still in flight")
    meaning = ("A copy with non_blocking=True returns before it is done. Until the host "
               "waits for it (a synchronize of its stream or device, an event recorded after "
               "it, or a sync on its stream such as .item()), its host memory holds "
               + ("whatever was there before: this read may see old or partial data."
                  if reads else "data the copy is still using: this write may reach the "
                  "device, or be overwritten, or mix with the copy's."))
    return {"id": race_rule_id(kind), "name": "ReadBeforeCopyDone" if reads else
            "WriteDuringCopy", "shortDescription": _text(short),
            "fullDescription": _text(meaning),
            "help": _text(f"{meaning}\n\nRun `memcpy-doctor explain` on the trace: it gives "
                          "the edit that waits for the copy before the access."),
            "defaultConfiguration": {"level": "error"},
            "properties": {"tags": ["correctness", "gpu"]}}


def race_fingerprint(r: RaceRecord, root: str) -> str:
    """Stable across line moves: the kind, and each end's path and function."""
    parts = [r.kind]
    for site in (r.copy_site, r.access_site):
        loc = site_location(site, root)
        parts += [loc[0] if loc else "?", site.function if site is not None else ""]
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _root_uri(root: str) -> str:
    uri = pathlib.Path(os.path.abspath(root)).as_uri()
    return uri if uri.endswith("/") else uri + "/"


def _gate_fingerprint(g: GateResult) -> dict[str, str]:
    return {GATE_FINGERPRINT_KEY: hashlib.sha256(g.metric.encode()).hexdigest()}


def sarif_dict(result: CheckResult, root: str, anchor: str = "pyproject.toml") -> dict[str, Any]:
    """The SARIF log as a dict (see the module docstring for `anchor`)."""
    def anchor_loc() -> dict[str, Any]:  # a fresh dict each time: no shared objects in the log
        return _location(_relative_uri(anchor), 1, base=True)

    rules: list[dict[str, Any]] = []
    index: dict[str, int] = {}

    def rule(rule_id: str, make) -> dict[str, Any]:
        if rule_id not in index:
            index[rule_id] = len(rules)
            rules.append(make())
        return {"ruleId": rule_id, "ruleIndex": index[rule_id]}

    results = []
    for f in result.findings:
        c = f.copy
        props: dict[str, Any] = {"status": f.status, "direction": c.direction,
                                 "trigger": c.trigger, "calls": c.calls, "bytes": c.bytes,
                                 "timeNs": c.time_ns}
        if f.baseline_calls is not None:
            props["baselineCalls"] = f.baseline_calls
        results.append({
            **rule(finding_rule_id(f.status), lambda: _finding_rule(f.status)),
            "level": "error",
            "message": _text(finding_message(f, root)),
            "locations": [_finding_location(f, root, anchor_loc)],
            "partialFingerprints": {FINGERPRINT_KEY: path_fingerprint(f, root)},
            "properties": props,
        })
    for r in result.races:
        results.append({
            **rule(race_rule_id(r.kind), lambda: _race_rule(r.kind)),
            "level": "error",
            "message": _text(race_message(r, root)),
            "locations": [_at(race_location(r, root), anchor_loc)],
            "partialFingerprints": {RACE_FINGERPRINT_KEY: race_fingerprint(r, root)},
            "properties": {"kind": r.kind, "direction": r.direction, "op": r.op,
                           "calls": r.calls, "bytes": r.bytes},
        })
    # failures first, then improvements, as the other formats list them
    for g in [g for g in result.gates if not g.passed] + [g for g in result.gates if g.improved]:
        props = {"metric": g.metric, "kind": g.kind, "value": g.value}
        if g.limit is not None:
            props["limit"] = g.limit
        if g.baseline is not None:
            props.update(baseline=g.baseline, tolerance=g.tolerance)
        results.append({
            **rule(gate_rule_id(g.metric), lambda: _gate_rule(g.metric)),
            "level": "error" if not g.passed else "note",
            "message": _text(gate_message(g) if not g.passed else improvement_message(g)),
            "locations": [anchor_loc()],
            "partialFingerprints": _gate_fingerprint(g),
            "properties": props,
        })
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {"name": TOOL_NAME, "version": __version__,
                                "informationUri": INFORMATION_URI, "rules": rules}},
            "originalUriBaseIds": {SRCROOT: {"uri": _root_uri(root)}},
            "results": results,
            "properties": {"passed": result.passed, "simulated": result.simulated,
                           "allowedPaths": result.allowed_paths},
        }],
    }


def render_sarif(result: CheckResult, root: str, anchor: str = "pyproject.toml") -> str:
    return json.dumps(sarif_dict(result, root, anchor), indent=1) + "\n"
