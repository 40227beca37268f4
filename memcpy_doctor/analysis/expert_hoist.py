"""An expert rule for what a loop does every step that it need do only once: upload data that
does not change (`HoistInvariantUpload`). It proves from the user's source
(analysis/expert_source.py) and the trace's timeline that its edit keeps what the program
computes, and proposes nothing where it cannot.

Registered by analysis/rules.py (EXPERT_RULES in analysis/expert_rules.py) before the rule
named by its `before`, so that it claims first the copies both would remove.
"""

from __future__ import annotations

import ast
from typing import ClassVar

from ..core.paths import format_site
from ..core.trace import CopyRecord, Site, Trace
from .attribution import Explanation
from .edits import indent_of, lines_change
from .expert_source import (Source, changed_in, declared_shared, dotted, loop_parts,
                            names_in, once_saving, preceding_store, source_cache, stored_in,
                            user_copies)
from .suggestion import ONCE, Suggestion

#: torch functions that make the same tensor from the same arguments, every time.
_PURE_FACTORIES = frozenset({"tensor", "as_tensor", "ones", "zeros", "full", "arange",
                             "linspace", "logspace", "eye", "device"})
#: Tensor methods that make a new tensor (or view) from theirs, changing nothing.
_PURE_METHODS = frozenset({"to", "cuda", "float", "double", "half", "bfloat16", "long", "int",
                           "bool", "view", "reshape", "unsqueeze", "squeeze", "t", "contiguous",
                           "clone", "expand", "flatten", "permute", "transpose", "detach"})


class HoistInvariantUpload:
    """An upload, every step, of data that does not change.

        weights = [0.2, 0.3, 0.5]
        for x, y in loader:
            w = torch.tensor(weights).to(device)   # the same 12 bytes, every step
            loss = F.cross_entropy(model(x), y, weight=w)

    Move the statement before the loop: one copy instead of one a step. Proposed only where
    the value cannot change, as the source shows it: a plain `name = expr` in the loop's body
    (run every step) whose expr is made of constants, torch's pure factories and methods,
    and names the loop never binds nor changes in place, each of them
    - read only as a device or a dtype (`.to(device)`, `device=`, `dtype=`), or
    - bound once to constants (a list of weights) that no use anywhere hands on or changes,
      or
    - the tensor uploaded (`v = h.to(device)`), on the trace's timeline's word: every upload
      reads the same storage, and nothing writes it between them (an optimizer's step
      through another name would);
    and the name itself is neither bound again, changed in place, read before the statement
    in the loop, nor read after the loop (a loop that never ran would leave it unbound).
    Where the trace has a timeline, nothing writes what an upload made either.
    """

    name = "hoist-invariant-upload"
    description = "Upload data that does not change once, before the loop"
    before: ClassVar[str] = "pinned-non-blocking"
    TRIGGERS = ("to", "cuda", "factory")

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        read = source_cache()
        by_loop: dict[tuple, list] = {}
        for index, c in user_copies(trace, "HtoD", self.TRIGGERS, sync=None):
            src = read(c.site.file)
            found = _invariant_statement(src, c) if src is not None else None
            if found is None or not _timeline_agrees(trace, index, found[2]):
                continue  # (a tensor made before the loop needs the timeline's word)
            stmt, loop, _ = found
            by_loop.setdefault((c.site.file, loop.lineno), [src, loop, {}, []])
            entry = by_loop[(c.site.file, loop.lineno)]
            entry[2][stmt.lineno] = stmt
            entry[3].append(c)
        out = []
        for src, loop, stmts, copies in by_loop.values():
            s = self._suggest(src, loop, [stmts[k] for k in sorted(stmts)], copies, cwd)
            if s is not None:
                out.append(s)
        return out

    def _suggest(self, src: Source, loop: ast.AST, stmts: list[ast.Assign],
                 copies: list[CopyRecord], cwd: str | None) -> Suggestion | None:
        loop_indent = indent_of(src.line(loop.lineno))
        moved, edits = [], {}
        for stmt in stmts:
            body_indent = indent_of(src.line(stmt.lineno))
            for n in range(stmt.lineno, stmt.end_lineno + 1):
                text = src.line(n)
                moved.append(loop_indent + text[len(body_indent):]
                             if text.startswith(body_indent) else text)
                edits[n] = ""
        if len(stmts) == len(loop.body):  # the body would be empty: it keeps a `pass`
            edits[stmts[0].lineno] = indent_of(src.line(stmts[0].lineno)) + "pass"
        edits[loop.lineno] = "\n".join(moved + [src.line(loop.lineno)])
        change = lines_change(src.path, edits, cwd)
        if change is None:
            return None
        names = ", ".join(f"`{s.targets[0].id}`" for s in stmts)
        where = format_site(Site(src.path, loop.lineno, ""), cwd)
        calls = sum(c.calls for c in copies)
        return Suggestion(
            rule=self.name,
            title=f"upload {names} once, before the loop at {where}",
            detail=(f"{calls} host->device copies ({len(copies)} path"
                    f"{'s' if len(copies) != 1 else ''}) of data the loop never changes: "
                    f"{names} reads only constants and names the loop neither binds nor "
                    "changes in place; made once before the loop, every step reads the one "
                    "copy (results unchanged)"),
            sites=sorted({c.site for c in copies}, key=lambda s: s.line),
            removes=copies, saving_ns=once_saving(copies), diff=change[0],
            apply=change[1], effect=ONCE)


def _invariant_statement(src: Source, c: CopyRecord):
    """(the statement, its loop, the uploaded name where its storage is to be checked on the
    timeline, else None) where the copy `c` is made by a statement that may run once before
    its loop (HoistInvariantUpload's docstring); None otherwise."""
    calls = src.calls_at(c.site.line, c.end_col)
    stmts = {id(src.statement_of(k)): src.statement_of(k) for k in calls}
    if len(stmts) != 1:
        return None
    stmt = next(iter(stmts.values()))
    loop = src.parent.get(stmt)
    if (not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1
            or not isinstance(stmt.targets[0], ast.Name)
            or not isinstance(loop, (ast.For, ast.While)) or not any(s is stmt for s in loop.body)
            or stmt.lineno == loop.lineno or not src.alone_on_its_lines(stmt)):
        return None
    torch = src.module_alias("torch")
    reads: dict[str, bool] = {}
    if not _pure(stmt.value, torch, reads):
        return None
    uploaded = {k.func.value.id for k in calls if isinstance(k.func, ast.Attribute)
                and k.func.attr in ("to", "cuda") and isinstance(k.func.value, ast.Name)}
    scope = src.scope_of(loop)
    checked = None
    for name, device_only in reads.items():
        if (stored_in(loop, name) or declared_shared(src.tree, name)
                or not _bound_before(src, loop, scope, name)):
            return None
        if device_only:
            continue  # (a device or a dtype: only what it names is read, never its data)
        if changed_in(src, loop, name):
            return None
        if uploaded == {name}:
            checked = name  # a tensor made before the loop: its storage, on the timeline
        elif not _stays_put(src, scope, name):
            return None
    target = stmt.targets[0].id
    others = [s for s in (*loop.body, *loop.orelse, *loop_parts(loop)) if s is not stmt]
    at = next(i for i, s in enumerate(loop.body) if s is stmt)
    if (any(stored_in(s, target) for s in others) or changed_in(src, loop, target)
            or declared_shared(src.tree, target) or target == torch
            or any(names_in(s, target) for s in (*loop_parts(loop), *loop.body[:at]))
            or _read_outside(src, scope, loop, target)):
        return None
    return stmt, loop, checked


#: Arguments that name a device or a dtype: of `t.to(...)` (every positional one: a device,
#: a dtype, or a tensor whose device and dtype it takes), `t.cuda(...)`, `torch.device(...)`,
#: and the `device=` and `dtype=` of any call.
_META_KEYWORDS = ("device", "dtype")


def _pure(node: ast.AST, torch: str | None, reads: dict[str, bool], meta: bool = False) -> bool:
    """Whether `node` always makes the same value from the same names, which go into
    `reads` (name -> read only as a device or dtype): constants, torch's pure factories,
    pure tensor methods, arithmetic, indexing."""
    def each(nodes, as_meta=False) -> bool:
        return all(n is None or _pure(n, torch, reads, meta or as_meta) for n in nodes)

    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple)):
        return each(node.elts)
    if isinstance(node, ast.UnaryOp):
        return each([node.operand])
    if isinstance(node, ast.BinOp):
        return each([node.left, node.right])
    if isinstance(node, ast.Subscript):
        return each([node.value, node.slice])
    if isinstance(node, ast.Slice):
        return each([node.lower, node.upper, node.step])
    if isinstance(node, ast.Name):
        if node.id != torch:
            reads[node.id] = reads.get(node.id, True) and meta
        return node.id != torch  # (the module alone is no value)
    if isinstance(node, ast.Attribute):  # torch.float32, torch.long: a dtype
        name = dotted(node)
        return torch is not None and name is not None and name.split(".")[0] == torch
    if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
        return False
    if any(k.arg is None or (k.arg == "requires_grad" and not _false(k.value))
           for k in node.keywords):
        return False  # (**kwargs: unknown; a leaf that requires grad would gather grads)
    keywords = [k.value for k in node.keywords if k.arg not in _META_KEYWORDS]
    named = each([k.value for k in node.keywords if k.arg in _META_KEYWORDS], True)
    name = dotted(node.func)
    if name is not None and torch is not None and name.startswith(torch + ".") and \
            name[len(torch) + 1:] in _PURE_FACTORIES:
        return named and each(keywords) and each(node.args, name == f"{torch}.device")
    if isinstance(node.func, ast.Attribute) and node.func.attr in _PURE_METHODS:
        return (named and each([node.func.value]) and each(keywords)
                and each(node.args, node.func.attr in ("to", "cuda")))
    return False


#: Builtins that read what they are given, and change and keep nothing of it.
_READERS = frozenset({"len", "list", "tuple", "sorted", "sum", "min", "max", "float", "int",
                      "str", "repr", "print", "enumerate", "zip", "range", "abs", "round",
                      "any", "all", "set", "frozenset"})


def _stays_put(src: Source, scope: ast.AST, name: str) -> bool:
    """`name` holds a value made of constants (a list of weights, say), bound once, that
    nothing in the file can change: every use of it reads it (arithmetic, indexing, a loop
    over it, an argument of a pure call), none hands the object on."""
    region = scope if scope is src.tree or stored_in(scope, name) else src.tree
    found = names_in(region, name)
    binds = [n for n in found if not isinstance(n.ctx, ast.Load)]
    bound = src.parent.get(binds[0]) if len(binds) == 1 else None
    if not (isinstance(bound, ast.Assign) and bound.targets == binds and _literal(bound.value)):
        return False
    return all(_harmless(src, n) for n in found if isinstance(n.ctx, ast.Load))


def _literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k) for k in node.keys) and \
            all(_literal(v) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return isinstance(node, ast.IfExp) and _literal(node.body) and _literal(node.orelse)


def _harmless(src: Source, node: ast.Name) -> bool:
    """A read of `node`'s value that neither changes nor hands on the object."""
    up = src.parent.get(node)
    if isinstance(up, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.FormattedValue)):
        return True
    if isinstance(up, ast.Subscript):
        return up.value is node and isinstance(up.ctx, ast.Load)
    if isinstance(up, (ast.For, ast.comprehension)):
        return up.iter is node
    call = src.parent.get(up) if isinstance(up, ast.keyword) else up
    if not isinstance(call, ast.Call) or call.func is node:
        return False
    name = dotted(call.func)
    torch = src.module_alias("torch")
    if name in _READERS:
        return not stored_in(src.tree, name)
    return (torch is not None and name is not None and name.startswith(torch + ".")
            and name[len(torch) + 1:] in _PURE_FACTORIES)


def _false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _bound_before(src: Source, loop: ast.AST, scope: ast.AST, name: str) -> bool:
    """`name` is bound before the loop runs: in its scope before it, or (read from a
    function) at the top of the module."""
    if preceding_store(src, loop, name) is not None:
        return True
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in {
            a.arg for a in (*scope.args.posonlyargs, *scope.args.args,
                            *scope.args.kwonlyargs, scope.args.vararg, scope.args.kwarg)
            if a is not None}:
        return True  # (a parameter)
    return scope is not src.tree and not stored_in(scope, name) and any(
        stored_in(s, name) for s in src.tree.body
        if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))


def _read_outside(src: Source, scope: ast.AST, loop: ast.AST, name: str) -> bool:
    """Whether `name` is used after `loop` in its scope, or by a nested function or class
    (which may run anywhere); at the top of the module, anywhere outside the loop."""
    inside = {id(n) for n in names_in(loop, name)}
    for n in names_in(scope if scope is not src.tree else src.tree, name):
        if id(n) in inside:
            continue
        if scope is src.tree or n.lineno > (loop.end_lineno or loop.lineno):
            return True
        if src.scope_of(n) is not scope:
            return True
    return False


def _timeline_agrees(trace: Trace, index: int, uploaded: str | None) -> bool:
    """Where the trace has a timeline: nothing writes what an upload made (a change in place
    the source did not show). A tensor named before the loop (`uploaded`) is hoisted only on
    the timeline's word: it holds two uploads or more, each reads the same storage, and no
    event between them writes it (an optimizer's step, say, through another name)."""
    events = trace.timeline.events if trace.timeline is not None else []
    mine = [i for i, e in enumerate(events) if e.kind == "copy" and e.ref == index]
    for i in mine if len(mine) > 1 else []:
        made = set(events[i].writes)
        if any(made & set(e.writes) for e in events[i + 1:]):
            return False
    if uploaded is None:
        return True
    if len(mine) < 2:
        return False
    source = set(events[mine[0]].reads)
    if any(set(events[i].reads) != source for i in mine):
        return False
    return not any(source & set(e.writes) for e in events[mine[0]:mine[-1]])
