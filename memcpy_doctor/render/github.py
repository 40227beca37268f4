"""`memcpy-doctor check --format github`: GitHub Actions workflow commands.

Printed in a workflow step, each `::error file=PATH,line=N,...::MESSAGE` line becomes an
annotation on that line of the pull request's diff. PATH is relative to the repository root,
which is where GitHub resolves it; a copy site outside the root keeps its absolute path, which
GitHub cannot place on a file of the diff (it still lists the annotation on the run). Gates have
no site, so a failed gate is an `::error` without a file, and an improvement a `::notice`. The
last line is the same plain-text verdict the text format ends with.

A race (the host touching a copy still in flight) is an `::error` at the line of the access.
GitHub shows at most 10 error and 10 notice annotations per step; the copy paths and races come
first because they are the ones that land on the diff.
"""

from __future__ import annotations

from ..analysis.attribution import user_site
from ..analysis.gates import METRICS, CheckResult, GateResult, PathFinding, site_name
from ..core.units import format_value
from ..core.races import RaceRecord
from ..core.site import Site
from .check import finding_message, race_message, summary_line

TITLE = "memcpy-doctor"


def escape_data(text: str) -> str:
    """A workflow command's message, escaped as GitHub's toolkit does (`escapeData`)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value (`escapeProperty`): also `:` and `,`."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def finding_location(f: PathFinding, root: str) -> tuple[str, int] | None:
    """(path, line) of a finding's copy in the user's own code (its site, or for a copy
    made inside a library the user's line that led there): relative to `root` with forward
    slashes when it lies under it, else absolute; None without a site or for a pseudo-file
    ("<string>")."""
    return site_location(user_site(f.copy) or f.copy.site, root)


def race_location(r: RaceRecord, root: str) -> tuple[str, int] | None:
    """(path, line) of a race's access, as `finding_location` gives a copy's."""
    return site_location(r.access_site, root)


def site_location(site: Site | None, root: str) -> tuple[str, int] | None:
    """(path, line) of `site`: relative to `root` with forward slashes when it lies under it,
    else absolute; None without a site or for a pseudo-file ("<string>")."""
    if site is None or site.file.startswith("<"):
        return None
    return site_name(site, root).rsplit(":", 1)[0], site.line


def gate_message(g: GateResult) -> str:
    """A failed gate in one line: "sync_calls (copies the host waited for): 14 > max 0"."""
    return f"{g.metric} ({METRICS[g.metric].description}): {g.reason}"


def improvement_message(g: GateResult) -> str:
    """A gate that got better than its baseline, in one line."""
    return (f"{g.metric} ({METRICS[g.metric].description}) improved: "
            f"{format_value(g.kind, g.value)} < baseline {format_value(g.kind, g.baseline)}")


def _command(name: str, message: str, **props: str | int) -> str:
    fields = ",".join(f"{k}={escape_property(str(v))}" for k, v in props.items())
    return f"::{name} {fields}::{escape_data(message)}"


def render_github(result: CheckResult, root: str) -> str:
    lines = []
    for f in result.findings:
        loc = finding_location(f, root)
        where = {} if loc is None else {"file": loc[0], "line": loc[1]}
        lines.append(_command("error", finding_message(f, root), **where, title=TITLE))
    for r in result.races:
        loc = race_location(r, root)
        where = {} if loc is None else {"file": loc[0], "line": loc[1]}
        lines.append(_command("error", race_message(r, root), **where, title=TITLE))
    for g in result.gates:
        if not g.passed:
            lines.append(_command("error", gate_message(g), title=TITLE))
    for g in result.gates:
        if g.improved:
            lines.append(_command("notice", improvement_message(g), title=TITLE))
    lines.append(summary_line(result))
    return "\n".join(lines) + "\n"
