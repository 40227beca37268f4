"""Source edits as unified diffs: wrap a statement in `memcpy_doctor.device_guard(...)` (and
what such a guard costs at run time), change one transfer call on a line (drop a
`.to(device)`), the call told apart from others on the line by where the trace says it
ends, or give several lines new texts (`lines_change`).

Reads the user's file (never writes it); the statement that holds the line is found with `ast`,
so a statement spread over several lines is wrapped whole.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections import defaultdict
from typing import Callable, Iterable

from ..core.defaults import GUARD_BLOCK_NS, GUARD_CALL_NS
from ..core.paths import diff_path
from ..core.trace import OpRecord, Site
from .expert_source import Source

GUARD_IMPORT = "import memcpy_doctor"


def guard_cost_ns(ops: Iterable[OpRecord]) -> int:
    """What device_guard blocks around the lines of `ops` cost the host on a real GPU: at each
    line, a block entered as often as its most-called op ran, and one call handled per op
    call (docs/sim-time.md)."""
    calls_at: dict[object, list[int]] = defaultdict(list)
    for op in ops:
        calls_at[(op.site.file, op.site.line) if op.site else None].append(op.calls)
    return sum(max(calls) * GUARD_BLOCK_NS + sum(calls) * GUARD_CALL_NS
               for calls in calls_at.values())


def statement_span(tree: ast.AST, line: int) -> tuple[int, int] | None:
    """The first and last line of the innermost simple statement that holds `line`."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For,
                       ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end:
                if best is None or (end - node.lineno) < (best[1] - best[0]):
                    best = (node.lineno, end)
    return best


def guard_diff(path: str, lines: list[int], device: str, cwd: str | None = None) -> str | None:
    """A unified diff that runs the statements at `lines` of `path` under
    `memcpy_doctor.device_guard(device)`; None when the file cannot be read or parsed here."""
    source = Source.read(path)
    if source is None:
        return None
    tree, old = source.tree, source.lines
    spans = sorted({s for s in (statement_span(tree, ln) for ln in lines) if s is not None})
    if not spans:
        return None
    new = list(old)
    for first, last in reversed(spans):  # bottom up, so earlier line numbers stay valid
        body = old[first - 1:last]
        indent = body[0][:len(body[0]) - len(body[0].lstrip())]
        wrapped = [f'{indent}with memcpy_doctor.device_guard("{device}"):\n']
        wrapped += ["    " + ln if ln.strip() else ln for ln in body]
        new[first - 1:last] = wrapped
    if not any(ln.strip() == GUARD_IMPORT for ln in old):
        at = _import_position(tree)
        new.insert(at, GUARD_IMPORT + "\n")
    return unified_diff(path, old, new, cwd)


def unified_diff(path: str, old: list[str], new: list[str], cwd: str | None) -> str:
    """The edit of `path` from lines `old` to `new`, headed "a/PATH", "b/PATH" with PATH
    relative to `cwd`, as `git apply` and `patch -p1` read it."""
    shown = diff_path(path, cwd)
    return "".join(difflib.unified_diff(old, new, fromfile=f"a/{shown}", tofile=f"b/{shown}"))


def _import_position(tree: ast.Module) -> int:
    """After the last top-level import (or the docstring), where a new import belongs."""
    at = 0
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            at = node.end_lineno or node.lineno
        elif (at == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)):
            at = node.end_lineno or node.lineno
    return at


_TRANSFER_CALL = re.compile(r"\.(to|cuda)\(([^()]*)\)")


#: A one-line edit: its unified diff, and what `profile --apply` reads to make it (a line edit).
LineChange = tuple[str, dict]


def _line_change(site: Site, cwd: str | None,
                 edit: Callable[[str], str | None]) -> LineChange | None:
    """The edit that replaces the line of `site` with `edit(line)` (None: no edit)."""
    try:
        with open(site.file, encoding="utf-8") as f:
            old = f.read().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return None
    new_line = edit(old[site.line - 1]) if site.line <= len(old) else None
    if new_line is None:
        return None
    new = list(old)
    new[site.line - 1] = new_line
    return unified_diff(site.file, old, new, cwd), {
        "kind": "line", "file": site.file, "line": site.line,
        "old": old[site.line - 1].rstrip("\r\n"), "new": new_line.rstrip("\r\n")}


def lines_change(file: str, new_lines: dict[int, str], cwd: str | None) -> LineChange | None:
    """One edit of several lines of `file`: line n (1-based) to read `new_lines[n]` (one or
    more lines, each without its newline; an empty text deletes the line from the diff and
    leaves a blank statement-free line for `--apply`). Its diff, and `--apply`'s entry of
    kind "lines". None when the file cannot be read here or a line is past its end."""
    try:
        with open(file, encoding="utf-8") as f:
            old = f.read().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return None
    if not new_lines or max(new_lines) > len(old) or min(new_lines) < 1:
        return None
    new = list(old)
    edits = []
    for n in sorted(new_lines, reverse=True):  # bottom up: earlier numbers stay valid
        ending = old[n - 1][len(old[n - 1].rstrip("\r\n")):] or "\n"
        text = new_lines[n]
        new[n - 1:n] = [] if text == "" else [ln + ending for ln in text.split("\n")]
        edits.append({"file": file, "line": n, "old": old[n - 1].rstrip("\r\n"),
                      "new": text})
    return unified_diff(file, old, new, cwd), {"kind": "lines", "edits": edits[::-1]}


def keyword_added(call: ast.Call, source: Source, keyword: str) -> tuple[int, str]:
    """Line number and new text of the line of `source` that ends `call`, with `keyword`
    ("name=value") added as its last argument."""
    end = call.end_lineno
    raw = source.line(end).encode("utf-8")
    close = call.end_col_offset - 1  # the ")" (columns are UTF-8 byte offsets)
    before = raw[:close].decode("utf-8").rstrip()
    sep = "" if before.endswith(("(", ",")) else ", "
    return end, before + sep + keyword + raw[close:].decode("utf-8")


def calls_named(tree: ast.AST, name: str) -> list[ast.Call]:
    """Every call of `name` or `something.name` in `tree`."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def indent_of(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def _the_call(line: str, end_col: int | None) -> re.Match | None:
    """The one transfer call on `line` that made a copy: the one ending at `end_col` when the
    trace knows it, else the only one on the line (none when there are several)."""
    calls = list(_TRANSFER_CALL.finditer(line))
    if end_col is not None:
        calls = [m for m in calls if m.end() == end_col]
    return calls[0] if len(calls) == 1 else None


#: `.to(x)` / `.cuda()` arguments that only name a device (no dtype, no copy=, no tensor).
_DEVICE_ONLY = re.compile(r"\s*((device\s*=\s*)?([\w.]+|['\"][\w:]+['\"]|torch\.device\([^()]*\))"
                          r"\s*(,\s*non_blocking\s*=\s*\w+)?)?\s*")
_DTYPE_NAME = re.compile(r"^torch\.(?!device\b)|dtype|float|half|int|long|bool|double")


def drop_transfer_change(site: Site, cwd: str | None,
                          end_col: int | None = None) -> LineChange | None:
    """Drop the one `.to(device)` or `.cuda()` on the line of `site`: the data stays on the
    host, as under device_guard("cpu"), with nothing from memcpy-doctor at run time. None
    when the line has no such call, or more than one, or the call also converts."""
    def edit(line: str) -> str | None:
        call = _the_call(line, end_col)
        if call is None:
            return None
        inner = call.group(2)
        if not _DEVICE_ONLY.fullmatch(inner) or _DTYPE_NAME.search(inner):
            return None
        return line[:call.start()] + line[call.end():]

    return _line_change(site, cwd, edit)
