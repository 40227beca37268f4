"""What the expert rules (analysis/expert_rules.py and the modules it names) read in the
user's source: one file parsed with `ast`, each node's parent, the call a copy came from, the
loop and the scope a statement is in, and who reads, writes or changes a name there.

Only reads the file (never writes it). Every question answers conservatively: where the
source does not say for certain, the answer is the one that makes a rule propose nothing.
Columns are those of `ast` and of the trace's `end_col` (Python's code positions): UTF-8 bytes.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterator

from ..core.paths import is_user_file
from ..core.trace import CopyRecord, Trace
from .steady import per_step

#: Nodes that open a scope of their own: a name inside one is not the name outside.
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
#: Tensor (and list) methods that change their receiver, beyond those named with a final "_".
MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update",
                      "setdefault", "popitem", "add", "discard", "sort", "reverse",
                      "resize_", "set_", "share_memory_", "register_hook", "retain_grad",
                      "requires_grad_", "backward"})


@dataclass
class Source:
    """One parsed file of the user's: its lines (with their endings), tree and parents."""

    path: str
    lines: list[str]
    tree: ast.Module
    parent: dict[ast.AST, ast.AST] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str) -> Source | None:
        """The file parsed, or None when it cannot be read or parsed here."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            return None
        source = cls(path, text.splitlines(keepends=True), tree)
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                source.parent[child] = node
        return source

    def line(self, n: int) -> str:
        """Line n (1-based) without its ending."""
        return self.lines[n - 1].rstrip("\r\n") if 0 < n <= len(self.lines) else ""

    def segment(self, node: ast.AST) -> str:
        """The source text of `node` (one line or several)."""
        first, last = node.lineno, node.end_lineno or node.lineno
        raw = [self.line(n).encode("utf-8") for n in range(first, last + 1)]
        if first == last:
            return raw[0][node.col_offset:node.end_col_offset].decode("utf-8")
        raw[0] = raw[0][node.col_offset:]
        raw[-1] = raw[-1][:node.end_col_offset]
        return "\n".join(r.decode("utf-8") for r in raw)

    def splice(self, line: int, start: int, end: int, text: str) -> str:
        """Line `line` with its bytes [start, end) replaced by `text`."""
        raw = self.line(line).encode("utf-8")
        return (raw[:start] + text.encode("utf-8") + raw[end:]).decode("utf-8")

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parent:
            node = self.parent[node]
            yield node

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The function (or the module) whose names `node`'s names are."""
        return next(a for a in self.ancestors(node) if isinstance(a, SCOPES))

    def loop_of(self, node: ast.AST) -> ast.For | ast.AsyncFor | ast.While | None:
        """The innermost loop of `node`'s own scope that holds it, None if none does."""
        for a in self.ancestors(node):
            if isinstance(a, LOOPS):
                return a
            if isinstance(a, SCOPES):
                return None
        return None

    def statement_of(self, node: ast.AST) -> ast.stmt:
        return node if isinstance(node, ast.stmt) else next(
            a for a in self.ancestors(node) if isinstance(a, ast.stmt))

    def calls_at(self, line: int, end_col: int | None) -> list[ast.Call]:
        """The calls that may have made a copy the trace places at `line`: those that end
        there at byte column `end_col` where it is known (a call on one line), else those
        whose lines hold `line` (the caller picks the one of the shape it looks for)."""
        return [n for n in ast.walk(self.tree) if isinstance(n, ast.Call) and (
            n.end_lineno == line and n.end_col_offset == end_col if end_col is not None
            else n.lineno <= line <= (n.end_lineno or n.lineno))]

    def alone_on_its_lines(self, stmt: ast.stmt) -> bool:
        """`stmt` starts its line, no other statement starts or ends on the lines it spans
        (no `a; b`, no `if c: a`), and no string in it spans lines (re-indenting it would
        change the string)."""
        first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
        head = self.line(first).encode("utf-8")
        if stmt.col_offset != len(head) - len(head.lstrip()):
            return False
        for n in ast.walk(self.tree):
            if (isinstance(n, ast.stmt) and n is not stmt
                    and (first <= n.lineno <= last or first <= (n.end_lineno or 0) <= last)
                    and not _holds(stmt, n) and not (n.lineno < first and _holds(n, stmt))):
                return False
        return not any(isinstance(n, (ast.Constant, ast.JoinedStr))
                       and n.lineno != n.end_lineno for n in ast.walk(stmt))

    def module_alias(self, module: str) -> str | None:
        """The name `import MODULE` (or `import MODULE as X`) binds at the top of the file."""
        for node in self.tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == module:
                        return a.asname or module
        return None

    def assigned_calls(self, name: str) -> list[ast.Call]:
        """The calls assigned to `name` anywhere in the file, as `name = CALL(...)` or
        `obj.name = CALL(...)` (an attribute matches by its last name)."""
        out = []
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and any(
                    last_name(t) == name for t in n.targets):
                out.append(n.value)
        return out


def _holds(outer: ast.AST, inner: ast.AST) -> bool:
    return any(n is inner for n in ast.walk(outer))


def last_name(node: ast.AST) -> str | None:
    """`x` for `x` and for `a.b.x`; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def dotted(node: ast.AST) -> str | None:
    """"a.b.c" for the expression `a.b.c`, None where it is not such a chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def names_in(node: ast.AST, name: str) -> list[ast.Name]:
    """Every occurrence of `name` below `node`, in nested scopes too (a closure that reads
    or writes it counts: where it runs is not known)."""
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name]


def declared_shared(scope: ast.AST, name: str) -> bool:
    """`global name` or `nonlocal name` anywhere under `scope`."""
    return any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names
               for n in ast.walk(scope))


def stored_in(node: ast.AST, name: str) -> bool:
    """Whether `name` is bound anywhere under `node`: assigned, a loop's or a with's target,
    deleted, imported, a def or class of that name."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load):
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                n.name == name:
            return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name for a in n.names):
            return True
        if isinstance(n, ast.ExceptHandler) and n.name == name:
            return True
    return False


def changed_in(source: Source, node: ast.AST, name: str) -> bool:
    """Whether code under `node` may change the object `name` holds in place: an in-place
    method (`x.add_(1)`, `xs.append(v)`), an item or attribute written (`x[0] = 1`,
    `x.data = y`), or `out=x`."""
    for n in names_in(node, name):
        up = source.parent.get(n)
        if isinstance(up, ast.Attribute) and up.value is n:
            if not isinstance(up.ctx, ast.Load):
                return True
            call = source.parent.get(up)
            if isinstance(call, ast.Call) and call.func is up and (
                    up.attr.endswith("_") or up.attr in MUTATORS):
                return True
        if isinstance(up, ast.Subscript) and up.value is n and not isinstance(up.ctx, ast.Load):
            return True
        if isinstance(up, ast.keyword) and up.arg == "out":
            return True
        if isinstance(up, ast.AugAssign):  # (a Store too; an in-place add on a tensor)
            return True
    return False


def loop_parts(loop: ast.AST) -> list[ast.AST]:
    """What a loop runs besides its body: a for's target and iterable, a while's test."""
    if isinstance(loop, ast.While):
        return [loop.test]
    return [loop.target, loop.iter]


def preceding_store(source: Source, loop: ast.AST, name: str) -> ast.stmt | None:
    """The statement that last binds `name` before `loop` runs, walking back through the
    statements before it and those before the blocks that hold it, within its scope; None
    when none does."""
    node: ast.AST = loop
    scope = source.scope_of(loop)
    while node is not scope:
        up = source.parent[node]
        for _, value in ast.iter_fields(up):
            if isinstance(value, list) and any(v is node for v in value):
                at = next(i for i, v in enumerate(value) if v is node)
                for before in reversed(value[:at]):
                    if stored_in(before, name):
                        return before
        node = up
    return None


def source_cache() -> Callable[[str], Source | None]:
    """`read(path)`: each file parsed once (for one rule's pass over a trace)."""
    cache: dict[str, Source | None] = {}

    def read(path: str) -> Source | None:
        if path not in cache:
            cache[path] = Source.read(path)
        return cache[path]
    return read


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string ("2.13.0+cpu"), None where it is not one."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def user_copies(trace: Trace, direction: str, triggers: Collection[str], *,
                sync: bool | None = True,
                every_step: bool = True) -> Iterator[tuple[int, CopyRecord]]:
    """(index, copy) of the trace's copies in `direction` made by one of `triggers` at a line
    of the user's own code, what an expert rule reads the source of: those the host waited
    for (`sync` None: any), made every step (`every_step` False: once or in one burst)."""
    total = trace.summary.total_ns
    for i, c in enumerate(trace.copies):
        if (c.direction == direction and c.trigger in triggers
                and (sync is None or c.sync == sync) and c.site is not None
                and is_user_file(c.site.file) and per_step(c, total) == every_step):
            yield i, c


def once_saving(copies: list[CopyRecord]) -> int:
    """The host time of every call but one of each path: what an edit that leaves one call
    of each saves at most (the rules' upper bound)."""
    return sum(c.host_ns * (c.calls - 1) // c.calls for c in copies)
