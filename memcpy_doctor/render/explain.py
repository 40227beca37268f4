"""`memcpy-doctor explain` output: text, JSON and Markdown of the explanation, the suggestions
and (with --log) the transfer log."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ..analysis.attribution import Chain, End, Explanation, user_site
from ..analysis.bandwidth import copy_rate, rate_words, reference_bps
from ..analysis.suggestion import REPLAYED, Suggestion
from ..core.units import format_value
from ..core.defaults import UNKNOWN_DIRECTION
from ..core.trace import CopyRecord, Trace, TransferRecord
from ..core.paths import format_site
from .text import format_ref

FORMATS = ("text", "json", "markdown")


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.4g} ms"


def _tensor(c: CopyRecord | TransferRecord) -> str:
    if c.shape is None or c.dtype is None:
        return ""
    return f"{c.dtype}[{', '.join(map(str, c.shape))}]"


def _end(label: str, end: End | None, cwd: str | None, none: str) -> str:
    if end is None:
        return f"    {label:<9} {none}"
    text = f"   {end.text}" if end.text else ""
    return f"    {label:<9} {end.op} [{end.device}]  {format_site(end.site, cwd)}{text}"


def _rate_idle(c: CopyRecord, exp: Explanation) -> str:
    """", pageable, 4.4 GB/s of the profile's 12 (37%), GPU idle 24.5 ms after": what a
    copy path's bandwidth and the GPU idle it caused were, where the trace shows them."""
    rate = rate_words(c, exp.reference)
    return ((f", {rate}" if rate else "")
            + (f", GPU idle {_ms(c.idle_ns)} after" if c.idle_ns is not None else ""))


def _chain_text(i: int, chain: Chain, cwd: str | None, exp: Explanation) -> list[str]:
    kind = " -> ".join(["host" if s.copy.direction == "HtoD" else "device" for s in chain.steps]
                       + ["device" if chain.steps[-1].copy.direction == "HtoD" else "host"])
    if chain.steps[0].copy.direction == UNKNOWN_DIRECTION:
        kind = "a sync found by sync-debug mode, direction unknown"
    lines = [f"#{i}  {_ms(chain.time_ns)} ({chain.share:.2%} of total)  {kind}"]
    lines.append(_end("made by", chain.producer, cwd, "(no op: data from Python)"))
    for n, step in enumerate(chain.steps):
        c = step.copy
        text = f"   {step.text}" if step.text else ""
        lines.append(f"    {'copy':<9} {c.direction} sync `{c.trigger}`, {c.calls} calls, "
                     f"{c.bytes} B {_tensor(c)}, {_ms(c.time_ns)}{_rate_idle(c, exp)}  "
                     f"{format_site(c.site, cwd)}"
                     f"{f' [thread {c.thread}]' if c.thread is not None else ''}{text}")
        if step.user is not None:  # made inside a library: the user's line that led there
            lines.append(f"    {'from':<9} your code  {format_site(step.user, cwd)}"
                         f"{f'   {step.user_text}' if step.user_text else ''}")
        if n < len(chain.middle):
            lines.append(_end("op", chain.middle[n], cwd, "?"))
    lines.append(_end("read by", chain.consumer, cwd, "no op (a Python value, or never read)"))
    return lines


def _suggestion_text(i: int, s: Suggestion, cwd: str | None) -> list[str]:
    calls = sum(c.calls for c in s.removes)
    removes = (f"; removes {len(s.removes)} copy path{'s' if len(s.removes) != 1 else ''}, "
               f"{calls} calls" if s.removes else "")
    lines = [f"{i}. {s.title}",
             f"   {saving_words(s)} ({estimate_words(s)}{removes})"
             f"{'' if s.exact else ' [heuristic]'}",
             f"   {s.detail}"]
    if s.changes_results:
        lines.append("   changes what the program computes or prints, by design (see the title)")
    if s.verified is not None:
        lines.append(f"   {verified_words(s.verified)}")
    if s.diff:
        lines += ["", *("   " + ln for ln in s.diff.rstrip("\n").splitlines()), ""]
    elif s.no_diff:
        lines.append(f"   no diff: {s.no_diff}")
    return lines


def _none_line(exp: Explanation) -> str:
    """"No suggestions.", with the reason where one is known (analysis/why_none.py)."""
    why = exp.no_suggestions_reason
    return f"No suggestions: {why}." if why else "No suggestions."


def saving_words(s: Suggestion) -> str:
    """"saves ~X", or, for an edit required whatever it costs, "costs ~X"."""
    if s.saving_ns < 0:
        return f"costs ~{_ms(-s.saving_ns)}"
    return f"saves ~{_ms(s.saving_ns)}"


def estimate_words(s: Suggestion) -> str:
    """How a saving was found, in a few words."""
    if s.estimate == REPLAYED:
        return "estimated by replaying the run's timeline with the edit"
    return f"estimated, {s.estimate}"


def _header_lines(exp: Explanation) -> list[str]:
    """The device memory peak and budget; first of all when the peak exceeds the budget."""
    peak, budget = exp.peak_device_bytes, exp.device_memory_budget
    if peak is None and budget is None:
        return []
    shown = "not known" if peak is None else format_value("bytes", peak)
    line = f"Device memory peak {shown}"
    if budget is not None:
        line += f"; budget {format_value('bytes', budget)}"
        if peak is not None and peak > budget:
            line += (" -- the run does not fit: the placement that fits comes first, "
                     "required, whatever it costs")
    return [line]


def _together_line(exp: Explanation, suggestions: list[Suggestion]) -> list[str]:
    if exp.together is None or len(suggestions) < 2:
        return []
    ns, how = exp.together
    how = ("replayed together" if how == REPLAYED else how)
    return [f"All {len(suggestions)} together save ~{_ms(ns)} ({how}; not the sum of their "
            "savings, which overlap)", ""]


def _setup_lines(chains: list[Chain], cwd: str | None, exp: Explanation) -> list[str]:
    """One line per user line that led to copies made once or in one burst."""
    by_site: dict[Any, list[CopyRecord]] = {}
    for chain in chains:
        for step in chain.steps:
            by_site.setdefault(step.user or step.copy.site, []).append(step.copy)
    out = []
    for site, copies in sorted(by_site.items(), key=lambda kv: -sum(c.time_ns for c in kv[1])):
        calls = sum(c.calls for c in copies)
        kinds = ", ".join(sorted({f"{c.direction} `{c.trigger}`" for c in copies}))
        idle = [c.idle_ns for c in copies if c.idle_ns is not None]
        extra = (_rate_idle(copies[0], exp) if len(copies) == 1
                 else f", GPU idle {_ms(sum(idle))} after" if idle else "")
        out.append(f"    {calls} cop{'y' if calls == 1 else 'ies'} ({kinds}), "
                   f"{_ms(sum(c.time_ns for c in copies))}{extra}, at {format_site(site, cwd)}")
    return out


def verified_words(v: Any) -> str:
    """What `explain --verify`'s re-run measured (a run/verify.Verified), in one line."""
    if v.broke:  # (the broken run's figures measure a run cut short: nothing to show)
        return f"{v.outcome} in a re-run with the edit"
    (calls_b, calls_a), (total_b, total_a) = v.sync_calls, v.total_ns
    total = f"total {_ms(total_b)} -> {_ms(total_a)}"
    if v.races != (0, 0):
        total += f", copies raced {v.races[0]} -> {v.races[1]}"
    if v.helped and not v.fixes_race:
        total = f"saves {_ms(v.saving_ns)} ({total})"
    return (f"{v.outcome} by a re-run with the edit: sync calls {calls_b} -> {calls_a}, "
            f"{total}{f'; {v.note}' if v.note else ''}")


def render_set_aside(not_worth_it: list[Suggestion], dropped: list[Suggestion],
                     tried: list[Suggestion] | None = None) -> str:
    """What was considered and left out, after the suggestions: edits estimated to save
    nothing, those `explain --verify` re-ran that did not help (`tried`), and those it
    dropped (worse, or the program ended or printed otherwise)."""
    lines = []
    if not_worth_it:
        lines += ["", "Considered, not worth it (estimated to save nothing):"]
        lines += [f"- {s.title}: ~{_ms(s.saving_ns)}; {s.detail}" for s in not_worth_it]
    if tried:
        lines += ["", "Tried, did not help (a re-run with the edit):"]
        lines += [f"- {s.title}: {verified_words(s.verified)}" for s in tried]
    if dropped:
        lines += ["", "Dropped: a re-run with the edit made things worse or changed what the "
                      "program does"]
        lines += [f"- {s.title}: {verified_words(s.verified)}" for s in dropped]
    return "\n".join(lines) + "\n" if lines else ""


def _verify_extra(v: Any) -> dict[str, Any]:
    """What `explain --verify` adds to a suggestion's `verify` object in JSON."""
    out = v.output
    return {"saving_ns": v.saving_ns, "ended": list(v.ended),
            "output": None if out is None else {"line": out.line, "before": out.before,
                                                "after": out.after}}


def render_verification(exp: Explanation, kept: list[Suggestion], tried: list[Suggestion],
                        dropped: list[Suggestion], not_worth_it: list[Suggestion], fmt: str,
                        cwd: str | None = None) -> str:
    """`explain --verify`'s output in `fmt`: render_explain's, with the suggestions whose
    re-run did not help listed apart (JSON: "tried") and each re-run's measured saving
    (JSON: `verify.saving_ns`, how each run ended, the first line printed otherwise)."""
    if not kept and exp.no_suggestions_reason is None and (tried or dropped):
        exp = replace(exp, no_suggestions_reason="each edit found was re-run and left out, "
                                                 "as it did not help (listed below)")
    if fmt != "json":
        return (render_explain(exp, kept, fmt, cwd)
                + render_set_aside(not_worth_it, dropped, tried))
    return render_explain_json(exp, kept, dropped, not_worth_it, tried)


def render_explain_text(exp: Explanation, suggestions: list[Suggestion],
                        cwd: str | None = None) -> str:
    place = exp.device_name
    if exp.simulated:
        place = (f"simulated {place}; light mode: times are this machine's wall clock"
                 if exp.light else f"simulated {place}; times are modeled")
    share = exp.sync_time_ns / exp.total_ns if exp.total_ns else 0.0
    lines = [f"Copies the host waited for ({place})",
             f"Total time {_ms(exp.total_ns)}; sync copies: {exp.sync_calls} calls, "
             f"{_ms(exp.sync_time_ns)} ({share:.2%})", *_header_lines(exp), ""]
    lines += [f"Note: {n}" for n in exp.notes] + ([""] if exp.notes else [])
    if not exp.chains:
        lines.append("No copies the host waited for.")
    steady = [ch for ch in exp.chains if ch.per_step]
    if steady:
        lines += ["Every step:", ""]
    for i, chain in enumerate(steady, 1):
        lines += _chain_text(i, chain, cwd, exp) + [""]
    setup = _setup_lines([ch for ch in exp.chains if not ch.per_step], cwd, exp)
    if setup:
        lines += ["Setup and one-off (not every step):", *setup, ""]
    lines.append("Suggestions (every step's first, then largest estimated saving first)"
                 if suggestions else _none_line(exp))
    if suggestions:
        lines += ["", *_together_line(exp, suggestions)] if len(suggestions) > 1 else []
    for i, s in enumerate(suggestions, 1):
        lines += _suggestion_text(i, s, cwd)
    return "\n".join(lines).rstrip() + "\n"


def _site_dict(site: Any) -> Any:
    return None if site is None else {"file": site.file, "line": site.line,
                                      "function": site.function}


def _end_dict(end: End | None) -> Any:
    if end is None:
        return None
    return {"op": end.op, "device": end.device, "site": _site_dict(end.site), "text": end.text}


def suggestion_dict(s: Suggestion) -> dict[str, Any]:
    return {"rule": s.rule, "title": s.title, "detail": s.detail,
            "sites": [_site_dict(x) for x in s.sites], "saving_ns": s.saving_ns,
            "estimate": s.estimate, "changes_results": s.changes_results,
            "required": s.required,
            "exact": s.exact, "removes": [{"direction": c.direction, "trigger": c.trigger,
                                           "site": _site_dict(c.site), "calls": c.calls}
                                          for c in s.removes],
            "diff": s.diff, "no_diff_reason": s.no_diff, "apply": s.apply,
            "verify": None if s.verified is None else {
                "verdict": s.verified.verdict, "sync_calls": list(s.verified.sync_calls),
                "total_ns": list(s.verified.total_ns), **_verify_extra(s.verified)}}


def render_explain_json(exp: Explanation, suggestions: list[Suggestion],
                        dropped: list[Suggestion] | None = None,
                        not_worth_it: list[Suggestion] | None = None,
                        tried: list[Suggestion] | None = None) -> str:
    data = {
        "total_ns": exp.total_ns, "simulated": exp.simulated, "device_name": exp.device_name,
        "sync_calls": exp.sync_calls, "sync_time_ns": exp.sync_time_ns,
        "peak_device_memory_bytes": exp.peak_device_bytes,
        "device_memory_budget_bytes": exp.device_memory_budget,
        "together": None if exp.together is None else {
            "saving_ns": exp.together[0], "estimate": exp.together[1]},
        "chains": [{
            "time_ns": ch.time_ns, "share": ch.share, "producer": _end_dict(ch.producer),
            "copies": [{"direction": st.copy.direction, "trigger": st.copy.trigger,
                        "calls": st.copy.calls, "bytes": st.copy.bytes,
                        "shape": st.copy.shape, "dtype": st.copy.dtype,
                        "time_ns": st.copy.time_ns, "share": st.share,
                        "site": _site_dict(st.copy.site), "text": st.text,
                        "user_site": _site_dict(user_site(st.copy)),
                        "thread": st.copy.thread, "pinned": st.copy.pinned,
                        "device_ns": st.copy.device_ns,
                        "bandwidth_bps": copy_rate(st.copy),
                        "profile_bandwidth_bps": reference_bps(exp.reference, st.copy),
                        "idle_ns": st.copy.idle_ns}
                       for st in ch.steps],
            "between": [_end_dict(m) for m in ch.middle],
            "consumer": _end_dict(ch.consumer)} for ch in exp.chains],
        "suggestions": [suggestion_dict(s) for s in suggestions],
        "no_suggestions_reason": None if suggestions else exp.no_suggestions_reason,
    }
    if exp.notes:  # (an imported torch.profiler trace without Python stacks)
        data["notes"] = exp.notes
    if dropped is not None:  # (explain --verify)
        data["dropped"] = [suggestion_dict(s) for s in dropped]
    if tried is not None:
        data["tried"] = [suggestion_dict(s) for s in tried]
    data["not_worth_it"] = [suggestion_dict(s) for s in not_worth_it or []]
    return json.dumps(data, indent=1) + "\n"


def render_explain_markdown(exp: Explanation, suggestions: list[Suggestion],
                            cwd: str | None = None) -> str:
    place = (f"simulated {exp.device_name}, times modeled" if exp.simulated
             else exp.device_name)
    lines = [f"## Copies the host waited for ({place})", "",
             f"Total time {_ms(exp.total_ns)}; sync copies: {exp.sync_calls} calls, "
             f"{_ms(exp.sync_time_ns)}.", ""]
    if exp.chains:
        lines += ["| # | time | share | producer | copies | consumer |",
                  "|---|---|---|---|---|---|"]
        for i, ch in enumerate(exp.chains, 1):
            copies = "<br>".join(f"{st.copy.direction} `{st.copy.trigger}` x{st.copy.calls} at "
                                 f"`{format_site(st.copy.site, cwd)}`{_rate_idle(st.copy, exp)}"
                                 for st in ch.steps)
            prod = (f"`{ch.producer.op}` at `{format_site(ch.producer.site, cwd)}`"
                    if ch.producer else "-")
            cons = (f"`{ch.consumer.op}` at `{format_site(ch.consumer.site, cwd)}`"
                    if ch.consumer else "-")
            lines.append(f"| {i} | {_ms(ch.time_ns)} | {ch.share:.2%} | {prod} | {copies} | "
                         f"{cons} |")
    else:
        lines.append("No copies the host waited for.")
    if suggestions:
        lines += ["", "## Suggestions", ""]
        for i, s in enumerate(suggestions, 1):
            lines += [f"{i}. **{s.title}**: {saving_words(s)} ({estimate_words(s)}). {s.detail}"]
            if s.verified is not None:
                lines += ["", f"   {verified_words(s.verified)}"]
            if s.diff:
                lines += ["", "```diff", s.diff.rstrip("\n"), "```", ""]
            elif s.no_diff:
                lines += ["", f"   No diff: {s.no_diff}."]
    else:
        lines += ["", _none_line(exp)]
    return "\n".join(lines).rstrip() + "\n"


def render_log(trace: Trace, cwd: str | None = None) -> str:
    """Every logged transfer in program order, like Paddle's verbose operator log."""
    if not trace.transfers:
        return ("No transfer log in this trace: profile with --log-transfers N to keep the "
                "first N copies in order.\n")
    lines = []
    for t in trace.transfers:
        src, dst = {"HtoD": ("cpu", "cuda:0"), "DtoH": ("cuda:0", "cpu"),
                    "DtoD": ("cuda", "cuda")}[t.direction]
        lines.append(
            f"#{t.seq:<5} {'sync ' if t.sync else 'async'} {t.trigger:<8} {_tensor(t):<18} "
            f"{src} -> {dst}  {t.bytes} B  at {format_site(t.site, cwd)}  "
            f"from {format_ref(t.producer, cwd)}  to {format_ref(t.consumer, cwd)}")
    dropped = [u for u in trace.meta.untraced if u.startswith("transfer log")]
    lines += dropped
    return "\n".join(lines) + "\n"


def render_explain(exp: Explanation, suggestions: list[Suggestion], fmt: str,
                   cwd: str | None = None, dropped: list[Suggestion] | None = None,
                   not_worth_it: list[Suggestion] | None = None) -> str:
    """The explanation and its suggestions in `fmt`, one of FORMATS; the one entry point for
    callers that let the user choose the format. `dropped`: what `explain --verify` took
    out; `not_worth_it`: edits estimated to save nothing."""
    if fmt == "json":
        return render_explain_json(exp, suggestions, dropped, not_worth_it)
    aside = render_set_aside(not_worth_it or [], dropped or [])
    if fmt == "markdown":
        return render_explain_markdown(exp, suggestions, cwd) + aside
    return render_explain_text(exp, suggestions, cwd) + aside


def render_logs(traces: list[Trace], names: list[str], cwd: str | None = None) -> str:
    """The transfer log of each trace (see render_log); with several traces, each under a
    `== NAME ==` line, so that the ranks' logs can be told apart."""
    parts = []
    for trace, name in zip(traces, names):
        if len(traces) > 1:
            parts.append(f"== {name} ==\n")
        parts.append(render_log(trace, cwd))
    return "".join(parts)


__all__ = ["FORMATS", "render_explain", "render_explain_text", "render_explain_json",
           "render_explain_markdown", "render_log", "render_logs"]
