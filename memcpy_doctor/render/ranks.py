"""The ranks of a distributed run side by side: a table per rank and merged, and the ranks whose
sync copies differ from the others (text, Markdown and JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..analysis.compare import Comparison
from ..analysis.ranks import RankComparison, RankDifference, RankFigures
from ..core.paths import format_site
from ..core.trace import Trace
from .diff import render_diff


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.6g}"


def rank_label(rank: int | None, index: int) -> str:
    """`rank 3`, or `trace #2` (its position among the files given) for a trace without one."""
    return f"rank {rank}" if rank is not None else f"trace #{index}"


def _labels(ranks: list[RankFigures]) -> list[str]:
    return [rank_label(f.rank, f.index) for f in ranks]


def _group_label(comp: RankComparison, group: list[int]) -> str:
    ranks = [comp.ranks[i] for i in group]
    if all(f.rank is not None for f in ranks):
        word = "rank" if len(ranks) == 1 else "ranks"
        return f"{word} {', '.join(str(f.rank) for f in ranks)}"
    return ", ".join(rank_label(f.rank, f.index) for f in ranks)


def _ended(f: RankFigures) -> str:
    if f.ended_by == "completed" and not f.exit_status:
        return "ok"
    return f"{f.ended_by} ({f.exit_status})"


def _table_rows(comp: RankComparison, names: list[str]) -> list[list[str]]:
    rows = []
    for f, label, name in zip(comp.ranks, _labels(comp.ranks), names):
        rows.append([label, name, _ms(f.total_ns), str(f.memcpy_calls), _ms(f.memcpy_ns),
                     str(f.sync_calls), _ms(f.sync_ns), _ended(f)])
    s = comp.merged.summary
    rows.append(["all", "(merged)", _ms(s.total_ns), str(s.memcpy_all.calls),
                 _ms(s.memcpy_all.time_ns), str(s.memcpy_sync.calls),
                 _ms(s.memcpy_sync.time_ns), ""])
    return rows


_HEADERS = ["Rank", "Trace", "Total (ms)", "Memcpy calls", "Memcpy (ms)", "Sync calls",
            "Sync (ms)", "Ended"]


def _difference_lines(comp: RankComparison, d: RankDifference, cwd: str | None) -> list[str]:
    from tabulate import tabulate  # where a table is drawn (see render/diff.py)
    reference = _group_label(comp, comp.groups[0])
    rows = [[f"{p.direction} {p.trigger}", format_site(p.site, cwd), str(p.calls),
             str(p.reference_calls)] for p in d.paths]
    return [f"{_capital(rank_label(d.rank, d.index))} makes other sync copies than "
            f"{reference}:",
            *("  " + line for line in tabulate(
                rows, headers=["Copy", "Site", "Calls", f"Calls on {reference}"],
                tablefmt="plain", disable_numparse=True).splitlines())]


def render_ranks_text(comp: RankComparison, names: list[str], cwd: str | None = None) -> str:
    """The per-rank table (with the merged figures as `all`) and the differing ranks."""
    from tabulate import tabulate  # where a table is drawn (see render/diff.py)
    meta = comp.merged.meta
    times = ("; light mode: times are this machine's wall clock (simulated GPU)" if meta.light
             else "; times are modeled (simulated GPU)")
    lines = [f"Ranks: {len(comp.ranks)} traces" + (times if meta.simulated else ""),
             tabulate(_table_rows(comp, names), headers=_HEADERS, tablefmt="plain",
                      disable_numparse=True), ""]
    lines += render_differences_text(comp, cwd)
    return "\n".join(lines).rstrip("\n") + "\n"


def render_differences_text(comp: RankComparison, cwd: str | None = None) -> list[str]:
    """Lines flagging each rank whose sync copies differ, or saying that none does."""
    if comp.uniform:
        return [f"All {len(comp.ranks)} traces make the same sync copies."
                if len(comp.ranks) > 1 else "One trace: nothing to compare."]
    lines = []
    for d in comp.differences:
        lines += _difference_lines(comp, d, cwd) + [""]
    return lines


def render_ranks_markdown(comp: RankComparison, names: list[str],
                          cwd: str | None = None) -> str:
    rows = _table_rows(comp, names)
    lines = ["## Ranks", "", "| " + " | ".join(_HEADERS) + " |",
             "|" + "---|" * len(_HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines.append("")
    if comp.uniform:
        lines += [f"All {len(comp.ranks)} traces make the same sync copies.", ""]
    for d in comp.differences:
        reference = _group_label(comp, comp.groups[0])
        lines += [f"**{_capital(rank_label(d.rank, d.index))}** makes other sync copies than "
                  f"{reference}:", ""]
        lines += [f"- {p.direction} `{p.trigger}` at `{format_site(p.site, cwd)}`: "
                  f"{p.calls} calls (on {reference}: {p.reference_calls})" for p in d.paths]
        lines.append("")
    return "\n".join(lines) + "\n"


def group_title(comp: RankComparison, group: list[int]) -> str:
    """`Ranks 0, 2` / `Rank 1` for a heading over a group's explanation."""
    return _capital(_group_label(comp, group))


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def ranks_dict(comp: RankComparison, names: list[str]) -> dict[str, Any]:
    """The comparison as plain data (for JSON)."""
    def site(s):
        return None if s is None else {"file": s.file, "line": s.line, "function": s.function}
    s = comp.merged.summary
    return {
        "ranks": [{"rank": f.rank, "trace": name, "total_ns": f.total_ns,
                   "memcpy_calls": f.memcpy_calls, "memcpy_ns": f.memcpy_ns,
                   "sync_calls": f.sync_calls, "sync_ns": f.sync_ns, "ended_by": f.ended_by,
                   "exit_status": f.exit_status} for f, name in zip(comp.ranks, names)],
        "merged": {"total_ns": s.total_ns, "memcpy_calls": s.memcpy_all.calls,
                   "memcpy_ns": s.memcpy_all.time_ns, "sync_calls": s.memcpy_sync.calls,
                   "sync_ns": s.memcpy_sync.time_ns},
        "uniform": comp.uniform,
        "groups": [[comp.ranks[i].rank if comp.ranks[i].rank is not None else names[i]
                    for i in g] for g in comp.groups],
        "differences": [{"rank": d.rank, "trace": names[d.index], "paths": [
            {"direction": p.direction, "trigger": p.trigger, "site": site(p.site),
             "calls": p.calls, "reference_calls": p.reference_calls} for p in d.paths]}
            for d in comp.differences],
    }


def render_rank_checks(ranks: list[int | None], names: list[str],
                       outcomes: list[tuple[bool, str]], comp: RankComparison, fmt: str,
                       root: str | None = None) -> str:
    """The gate results of several traces in one output. `outcomes` holds each trace's
    (passed, result already rendered in `fmt`), in the order of `ranks` and `names`. JSON
    nests each result under its rank beside the comparison; github annotations simply
    follow each other; text puts each result under its label, then the ranks whose copies
    differ and a verdict over all traces."""
    passed = all(ok for ok, _ in outcomes)
    if fmt == "json":
        return json.dumps({
            "passed": passed,
            "ranks": [{"rank": rank, "trace": name, **json.loads(text)}
                      for rank, name, (_, text) in zip(ranks, names, outcomes)],
            "comparison": ranks_dict(comp, names)}, indent=1) + "\n"
    if fmt == "github":
        return "".join(text for _, text in outcomes)
    parts = [f"== {rank_label(rank, i)} ({names[i]}) ==\n{text}"
             for i, (rank, (_, text)) in enumerate(zip(ranks, outcomes))]
    failed = sum(not ok for ok, _ in outcomes)
    parts.append("\n".join(render_differences_text(comp, root)).rstrip("\n") + "\n")
    parts.append(f"memcpy-doctor check: {'passed' if passed else 'FAILED'} "
                 f"({len(outcomes) - failed} of {len(outcomes)} traces passed)\n")
    return "\n".join(parts)


def render_explain_ranks(comp: RankComparison, names: list[str], parts: list[str], fmt: str,
                         cwd: str | None = None) -> str:
    """The explanation of several ranks: the ranks side by side, then one explanation per
    group of ranks that make the same sync copies (`parts`, already rendered in `fmt`, in
    the order of comp.groups), so that identical ranks are explained once."""
    if fmt == "json":
        return json.dumps({
            "ranks": ranks_dict(comp, names),
            "explanations": [{"traces": [names[i] for i in g], **json.loads(part)}
                             for g, part in zip(comp.groups, parts)]}, indent=1) + "\n"
    if fmt == "markdown":
        return "\n".join([render_ranks_markdown(comp, names, cwd)] + [
            f"# {group_title(comp, g)}\n\n{part}" for g, part in zip(comp.groups, parts)])
    return "\n".join([render_ranks_text(comp, names, cwd)] + [
        f"== {group_title(comp, g)} ==\n\n{part}" for g, part in zip(comp.groups, parts)])


@dataclass(frozen=True)
class DiffSide:
    """One side of a `diff` of rank traces: the name the user gave, its traces in rank order
    with their file names, and how its ranks compare with each other."""

    name: str
    traces: list[Trace]
    names: list[str]
    ranks: RankComparison


def render_diff_ranks(before: DiffSide, after: DiffSide, pairs: list[Comparison] | None,
                      merged: Comparison, cwd: str | None = None) -> str:
    """The diff of two runs of several ranks: rank K against rank K (`pairs`, None when the
    sides have different numbers of traces), then all ranks merged, then each side whose
    ranks make different sync copies. A user sees first where a rank changed, then the
    whole run."""
    b, a = before.traces, after.traces
    parts = []
    if pairs is not None:
        for i, c in enumerate(pairs):
            parts.append(f"== {rank_label(b[i].meta.rank, i)} ==\n"
                         + render_diff(c, before.names[i], after.names[i], cwd))
    else:
        parts.append(f"{len(b)} traces before, {len(a)} after: compared merged only\n")
    parts.append("== all ranks (merged) ==\n"
                 + render_diff(merged, f"{before.name} ({len(b)} traces)",
                               f"{after.name} ({len(a)} traces)", cwd))
    for word, side in (("Before", before), ("After", after)):
        if not side.ranks.uniform:
            parts.append(f"{word} ({side.name}): "
                         + "\n".join(render_differences_text(side.ranks, cwd)))
    return "\n".join(parts)
