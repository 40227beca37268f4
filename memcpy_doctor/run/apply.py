"""`profile --apply`: run a script with suggested edits applied in memory.

The file on disk is never changed. Two kinds of edit: a device_guard edit wraps the statement
at a line in `with memcpy_doctor.device_guard(DEVICE):` (in the syntax tree); a line edit
replaces one line's text with one or more lines (`non_blocking=True` added, a `.to(device)`
dropped, a statement put before a loop), only where the line still reads as it did; a
suggestion's `"kind": "lines"` holds several. Either way the code is compiled with the
original line numbers (lines a line edit adds take the number of the line they replace), so
the re-profile reports the same lines as before.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass
from typing import Any

from ..analysis.edits import statement_span


class ApplyError(Exception):
    """A suggestions file that cannot be read or applied."""


@dataclass(frozen=True)
class GuardEdit:
    file: str
    line: int
    device: str


@dataclass(frozen=True)
class LineEdit:
    """Line `line` of `file`, which reads `old`, to read `new` (without its last newline;
    several lines where `new` holds newlines)."""

    file: str
    line: int
    old: str
    new: str


Edit = GuardEdit | LineEdit


def load_edits(path: str) -> list[Edit]:
    """The edits in an `explain --format json` output (or a list of its suggestions, or of
    their `apply` entries)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ApplyError(f"{path}: cannot read suggestions ({e})") from None
    items: Any = data.get("suggestions", data) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ApplyError(f"{path}: expected explain's JSON or a list of suggestions")
    edits = []
    for item in items:
        spec = item.get("apply", item) if isinstance(item, dict) else None
        if isinstance(spec, dict) and spec.get("kind") in ("line", "lines"):
            specs = spec.get("edits") if spec["kind"] == "lines" else [spec]
            try:
                edits += [LineEdit(os.path.abspath(str(e["file"])), int(e["line"]),
                                   str(e["old"]), str(e["new"])) for e in specs]
            except (KeyError, TypeError, ValueError):
                raise ApplyError(f"{path}: a line edit without file, line, old and new") \
                    from None
            continue
        if not isinstance(spec, dict) or spec.get("kind") != "device_guard":
            continue
        device = spec.get("device")
        for site in spec.get("sites", []):
            try:
                edits.append(GuardEdit(os.path.abspath(str(site["file"])), int(site["line"]),
                                       str(device)))
            except (KeyError, TypeError, ValueError):
                raise ApplyError(f"{path}: a device_guard edit without file and line") from None
    if not edits:
        raise ApplyError(f"{path}: no device_guard or line edit to apply")
    return edits


class _Wrap(ast.NodeTransformer):
    def __init__(self, lines: dict[int, str]) -> None:
        self.lines = lines
        self.done: set[int] = set()

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for name, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, name, [self._wrap(s) for s in value])
        return super().generic_visit(node)

    def _wrap(self, stmt: ast.stmt) -> ast.stmt:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import,
                             ast.ImportFrom)):
            return stmt
        device = self.lines.pop(stmt.lineno, None)  # once: the With holds the same statement
        if device is None:
            return stmt
        self.done.add(stmt.lineno)
        guard = ast.Call(
            func=ast.Attribute(
                value=ast.Call(func=ast.Name("__import__", ast.Load()),
                               args=[ast.Constant("memcpy_doctor")], keywords=[]),
                attr="device_guard", ctx=ast.Load()),
            args=[ast.Constant(device)], keywords=[])
        with_node = ast.With(items=[ast.withitem(context_expr=guard)], body=[stmt])
        return ast.copy_location(with_node, stmt)


def apply_edits(source: bytes, path: str, edits: list[Edit]) -> tuple[Any, list[Edit]]:
    """The script's code with the edits for `path` applied, and the edits it could not apply
    (another file, no statement starting at that line, or a line that reads otherwise)."""
    source, missed_lines, numbers = _replace_lines(
        source, path, [e for e in edits if isinstance(e, LineEdit)])
    edits = [e for e in edits if isinstance(e, GuardEdit)]
    tree = ast.parse(source, filename=path)
    if numbers is not None:
        _renumber(tree, numbers)
    starts: dict[GuardEdit, int] = {}
    for e in edits:
        span = statement_span(tree, e.line) if e.file == path else None
        if span is not None:
            starts[e] = span[0]  # the statement that holds the line starts here
    wrapper = _Wrap({start: e.device for e, start in starts.items()})
    tree = ast.fix_missing_locations(wrapper.visit(tree))
    missed = [e for e in edits if starts.get(e) not in wrapper.done]
    return compile(tree, path, "exec", dont_inherit=True), missed_lines + missed


def _replace_lines(source: bytes, path: str, edits: list[LineEdit]
                   ) -> tuple[bytes, list[LineEdit], list[int] | None]:
    """`source` with the line edits for `path` made, those that could not be, and the
    original number of each line of the result (None: the same lines)."""
    if not edits:
        return source, [], None
    lines = source.decode("utf-8").splitlines(keepends=True)
    missed = []
    for e in edits:
        if e.file != path or not 0 < e.line <= len(lines):
            missed.append(e)
            continue
        text = lines[e.line - 1]
        body = text.rstrip("\r\n")
        if body != e.old:
            missed.append(e)
            continue
        lines[e.line - 1] = e.new + text[len(body):]
    numbers = [n for n, text in enumerate(lines, 1)
               for _ in range(text.rstrip("\r\n").count("\n") + 1)]
    return "".join(lines).encode("utf-8"), missed, numbers


def _renumber(tree: ast.AST, numbers: list[int]) -> None:
    """Give every node of `tree` the original line number of its line (`numbers[i - 1]` for
    line i), so that a line edit that added lines moves no site."""
    last = len(numbers)
    for node in ast.walk(tree):
        for attr in ("lineno", "end_lineno"):
            n = getattr(node, attr, None)
            if n is not None:
                setattr(node, attr, numbers[min(n, last) - 1])
