"""The HTML report's tables (issue 44): the sync copies, each with its line, its stack on
demand and its producer -> copy -> consumer chain; and the suggested edits with their diffs
and savings (render/html.py puts them on the page)."""

from __future__ import annotations

from ..analysis.attribution import Chain, End, Explanation, read_line, user_site
from ..analysis.suggestion import ASYNC, DROP, ONCE, Suggestion
from ..core.defaults import HTML_SYNC_PATHS
from ..core.trace import CopyRecord, Site
from .explain import estimate_words, saving_words, verified_words
from .html_format import duration, esc, share, site_text, size


def heaviest_sync(copies: list[CopyRecord]) -> list[tuple[int, CopyRecord]]:
    """The sync copy paths (with their index in the trace's copies), costliest first, as the
    text report ranks them: by the GPU idle each caused where measured, then by time."""
    sync = [(i, c) for i, c in enumerate(copies) if c.sync]
    sync.sort(key=lambda ic: (-(ic[1].idle_ns or 0), -ic[1].time_ns, -ic[1].calls))
    return sync


def _code(text: str) -> str:
    return f'<code class="src">{esc(text)}</code>' if text else ""


def _site_cell(site: Site | None, cwd: str | None) -> str:
    """`file:line` and the line's text (read with linecache where the file is here)."""
    if site is None:
        return '<span class="none">no line recorded</span>'
    return f'<span class="site">{site_text(site, cwd)}</span>{_code(read_line(site))}'


def _end(end: End | None, cwd: str | None, none: str) -> str:
    if end is None:
        return f'<li class="end none">{none}</li>'
    return (f'<li class="end"><span class="op">{esc(end.op)}</span> '
            f'<span class="dev">[{esc(end.device)}]</span> '
            f'<span class="site">{site_text(end.site, cwd)}</span>{_code(end.text)}</li>')


def _chain(chain: Chain | None, copy: CopyRecord, cwd: str | None) -> str:
    """producer -> copy [-> op -> copy ...] -> consumer, the copy of this row marked."""
    if chain is None:
        return '<span class="none">-</span>'
    items = [_end(chain.producer, cwd, "made by no op seen")]
    for k, step in enumerate(chain.steps):
        if k:
            items.append(_end(chain.middle[k - 1], cwd, "-"))
        c = step.copy
        mark = ' aria-current="true"' if c is copy else ""
        items.append(f'<li class="copy{" this" if c is copy else ""}"{mark}>{esc(c.direction)} '
                     f'<code>{esc(c.trigger)}</code> {site_text(c.site, cwd)}</li>')
    items.append(_end(chain.consumer, cwd, "read by no op (a Python value, or never read)"))
    return f'<ol class="chain">{"".join(items)}</ol>'


def _stack(copy: CopyRecord, cwd: str | None) -> str:
    """The copy's user frames, innermost first, behind a <details> (keyboard: its summary)."""
    if not copy.stack:
        return '<span class="none">no stack</span>'
    frames = "".join(f'<li><span class="site">{site_text(s, cwd)}</span> '
                     f'<span class="fn">{esc(s.function)}</span>{_code(read_line(s))}</li>'
                     for s in copy.stack)
    n = len(copy.stack)
    return (f'<details><summary>{n} frame{"s" if n != 1 else ""}</summary>'
            f'<ol class="stack">{frames}</ol></details>')


def sync_table(copies: list[CopyRecord], exp: Explanation, numbers: dict[int, int],
               prefix: str, cwd: str | None) -> str:
    """One row per sync copy path (the heaviest HTML_SYNC_PATHS of them; a line says how
    many more the trace has), numbered as the timeline's labels are (`numbers`: copy index
    -> row number)."""
    ranked = heaviest_sync(copies)
    if not ranked:
        return '<p class="none">No copies the host waited for.</p>'
    chains = {id(st.copy): ch for ch in exp.chains for st in ch.steps}
    per_step = {id(st.copy): ch.per_step for ch in exp.chains for st in ch.steps}
    idle = any(c.idle_ns is not None for _, c in ranked)
    total = exp.total_ns
    rows = []
    for i, c in ranked[:HTML_SYNC_PATHS]:
        n = numbers[i]
        mine = user_site(c)
        where = _site_cell(c.site, cwd)
        if mine is not None and mine is not c.site:
            where += f'<span class="from">from</span>{_site_cell(mine, cwd)}'
        if c.thread is not None:
            where += f'<span class="thread">thread {esc(c.thread)}</span>'
        tensor = (f'<br><span class="tensor">{esc(c.dtype)}[{esc(", ".join(map(str, c.shape)))}]'
                  "</span>" if c.dtype is not None and c.shape is not None else "")
        host = "" if c.pinned is None else (" pinned" if c.pinned else " pageable")
        rows.append(
            f'<tr id="{prefix}sync-{n}"><th scope="row">{n}</th>'
            f"<td>{esc(c.direction)} <code>{esc(c.trigger)}</code>{host}{tensor}</td>"
            f'<td class="where">{where}</td>'
            f'<td class="num">{c.calls}</td>'
            f'<td>{"every step" if per_step.get(id(c), False) else "setup, one-off"}</td>'
            f'<td class="num">{size(c.bytes)}</td>'
            f'<td class="num">{duration(c.time_ns)}<br><span class="share">'
            f"{share(c.time_ns, total)}</span></td>"
            + (f'<td class="num">{"-" if c.idle_ns is None else duration(c.idle_ns)}</td>'
               if idle else "")
            + f"<td>{_chain(chains.get(id(c)), c, cwd)}</td><td>{_stack(c, cwd)}</td></tr>")
    head = ("<tr><th scope=\"col\">#</th><th scope=\"col\">Copy</th>"
            "<th scope=\"col\">Line</th><th scope=\"col\">Calls</th><th scope=\"col\">When</th>"
            "<th scope=\"col\">Bytes</th><th scope=\"col\">Time</th>"
            + ("<th scope=\"col\">GPU idle after</th>" if idle else "")
            + "<th scope=\"col\">Producer → copy → consumer</th>"
              "<th scope=\"col\">Stack</th></tr>")
    out = (f'<div class="scroll" tabindex="0" role="region" aria-label="sync copies">'
           f'<table class="sync"><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
           "</table></div>")
    if len(ranked) > HTML_SYNC_PATHS:
        left = ranked[HTML_SYNC_PATHS:]
        out += (f'<p class="left-out">{len(left)} more sync copy paths left out '
                f"({sum(c.calls for _, c in left)} calls, "
                f"{duration(sum(c.time_ns for _, c in left))}): this page shows the "
                f"heaviest {HTML_SYNC_PATHS}; <code>memcpy-doctor explain --format json</code> "
                "lists them all.</p>")
    return out


def diff_html(text: str) -> str:
    """A unified diff with each line classed: `file` (---/+++), `hunk` (@@), `add`, `del`,
    `ctx`; the colours are the stylesheet's, and a +/- mark stays on each line. Each line is
    a block of its own (no newline between them, which a <pre> would show as a blank line)."""
    lines = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith(("+++", "---")):
            cls = "file"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        lines.append(f'<span class="{cls}">{esc(line)}</span>')
    return f'<pre class="diff"><code>{"".join(lines)}</code></pre>'


def _suggestion(n: int, s: Suggestion, prefix: str, cwd: str | None) -> str:
    saving = (f'<p class="saving"><strong>{esc(saving_words(s))}</strong> ({esc(estimate_words(s))})'
              + ("; changes what the program computes or prints" if s.changes_results else "")
              + "</p>")
    verified = ("" if s.verified is None else
                f'<p class="verified">Measured: {esc(verified_words(s.verified))}</p>')
    sites = ", ".join(site_text(x, cwd) for x in s.sites)
    body = (diff_html(s.diff) if s.diff else
            f'<p class="no-diff">No diff: {esc(s.no_diff)}.</p>' if s.no_diff else "")
    calls = sum(c.calls for c in s.removes)
    verb = {DROP: "removes", ONCE: "leaves one call, after the loop, of",
            ASYNC: "makes async"}.get(s.effect, "changes")
    does = ([f'{verb} {len(s.removes)} copy path{"s" if len(s.removes) != 1 else ""} '
             f'({calls} call{"s" if calls != 1 else ""})'] if s.removes else [])
    does += [f"runs {', '.join(sorted({esc(o.op) for o in s.moved}))} on the host"
             ] if s.moved else []
    does += [f"at {sites}"] if sites else []
    words = "; ".join(does)
    removes = f'<p class="removes">{words[:1].upper()}{words[1:]}.</p>' if does else ""
    return (f'<li class="suggestion" id="{prefix}edit-{n}"><h4>{esc(s.title)}</h4>'
            f"{saving}{verified}"
            f'<p class="detail">{esc(s.detail)}</p>{removes}{body}</li>')


def suggestions_html(exp: Explanation, suggestions: list[Suggestion],
                     not_worth_it: list[Suggestion], prefix: str, cwd: str | None) -> str:
    """The suggested edits as explain lists them, each with its diff and savings; those
    estimated to save nothing after them, folded."""
    shown = suggestions[:HTML_SYNC_PATHS]
    out = ""
    if not suggestions:
        why = exp.no_suggestions_reason
        out += f'<p class="none">No suggestions{": " + esc(why) if why else ""}.</p>'
    if exp.together is not None and len(shown) > 1:
        ns, how = exp.together
        out += (f'<p class="together">All {len(suggestions)} together save ~{duration(ns)} '
                f"({'replayed together' if how == 'replayed' else esc(how)}; not the sum of "
                "their savings, which overlap).</p>")
    items = "".join(_suggestion(n, s, prefix, cwd) for n, s in enumerate(shown, 1))
    out += f'<ol class="suggestions">{items}</ol>' if items else ""
    if len(suggestions) > len(shown):
        out += (f'<p class="left-out">{len(suggestions) - len(shown)} more suggestions left '
                f"out: this page shows the first {HTML_SYNC_PATHS}.</p>")
    if not_worth_it:
        items = "".join(f"<li>{esc(s.title)}: ~{duration(s.saving_ns)}; {esc(s.detail)}</li>"
                        for s in not_worth_it)
        out += (f"<details><summary>Considered, not worth it ({len(not_worth_it)})</summary>"
                f"<ul>{items}</ul></details>")
    return out


__all__ = ["heaviest_sync", "sync_table", "suggestions_html"]
