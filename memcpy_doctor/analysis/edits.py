"""Source edits as unified diffs: wrap a statement in `memcpy_doctor.device_guard(...)`, and
what such a guard costs at run time.

Reads the user's file (never writes it); the statement that holds the line is found with `ast`,
so a statement spread over several lines is wrapped whole.
"""

from __future__ import annotations

import ast
import difflib
from collections import defaultdict
from typing import Iterable

from ..core.defaults import GUARD_BLOCK_NS, GUARD_CALL_NS
from ..core.paths import diff_path
from ..core.trace import OpRecord

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
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    old = text.splitlines(keepends=True)
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
