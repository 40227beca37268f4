"""An expert rule for a value read back to the host every step only to be summed or listed
(`AccumulateOnDevice`): sum it on the device and read once after the loop. It proves from the
user's source (analysis/expert_source.py) that the edit gives the same numbers, and proposes
nothing where it cannot.

Registered by analysis/rules.py (EXPERT_RULES in analysis/expert_rules.py) before the rule
named by its `before`, so that it claims first the copies both would remove.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import ClassVar

from ..core.costmodel import profile_of
from ..core.paths import format_site
from ..core.trace import CopyRecord, Trace
from .attribution import Explanation
from .edits import indent_of, lines_change
from .expert_source import (SCOPES, Source, declared_shared, names_in, once_saving,
                            preceding_store, source_cache, stored_in, user_copies)
from .suggestion import ONCE, Suggestion

_FLOATS = ("float16", "bfloat16", "float32", "float64")
_INTS = ("bool", "uint8", "int8", "int16", "int32", "int64")


class AccumulateOnDevice:
    """A per-step value read back to the host only to be summed (or listed).

        total = 0.0
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            ...
            total += loss.item()           # the host waits for the device every step
        print(total)

    Sum on the device in float64 (`total += loss.detach().double()`), as Python sums floats
    (in double precision), and read the sum once after the loop (`total = float(total)`):
    the same number, one wait. A list (`losses.append(loss.item())`) keeps the tensors and
    reads them in one copy after the loop. Proposed only where the source shows that nothing
    reads the accumulator inside the loop (a print every step needs every value), nothing
    else binds or shares it, it starts from a number (or `[]`) before the loop, and it is used
    after the loop.
    """

    name = "accumulate-on-device"
    description = "Sum per-step values on the device and read the sum once after the loop"
    before: ClassVar[str] = "host-round-trip"
    TRIGGERS = ("item", "float", "int")

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        read = source_cache()
        out = []
        for _, c in user_copies(trace, "DtoH", self.TRIGGERS):
            src = read(c.site.file)
            plan = accumulation(src, c) if src is not None else None
            change = lines_change(src.path, plan.edits, cwd) if plan is not None else None
            if change is None:
                continue
            p = profile_of(trace)  # each step: the kernels it adds, and the detach (a view)
            cost = c.calls * (plan.kernels * (p.launch_ns + p.python_op_ns)
                              + p.host_op_ns + p.python_op_ns)
            out.append(Suggestion(
                rule=self.name,
                title=f"{plan.verb} `{plan.name}` on the device and read it once after the "
                      f"loop, not {c.calls} times at {format_site(c.site, cwd)}",
                detail=(f"`{c.trigger}` reads a device value {c.calls} times, the host waiting "
                        f"each time, only to {plan.why}; nothing reads `{plan.name}` inside "
                        f"the loop; {plan.how}"),
                sites=[c.site], removes=[c], saving_ns=once_saving([c]),
                diff=change[0], apply=change[1], effect=ONCE, cost_ns=cost))
        return out


@dataclass(frozen=True)
class Plan:
    """An accumulation's edit: the lines to change and what to say about them."""

    name: str  # the accumulator
    verb: str  # "sum" or "keep"
    why: str
    how: str
    edits: dict[int, str]
    kernels: int  # what the edit launches on the device each step (a conversion, an add)


def accumulation(src: Source, c: CopyRecord) -> Plan | None:
    """The edit for the read `c` where it is summed or listed in a loop and nothing else
    needs its value there (AccumulateOnDevice's docstring); None otherwise."""
    reads = [k for k in src.calls_at(c.site.line, c.end_col) if _reads(src, k, c.trigger)]
    if len(reads) != 1:
        return None
    read = reads[0]
    value, up = read, src.parent[read]
    if isinstance(up, ast.BinOp):  # `loss.item() * x.size(0)`: a plain number beside it
        other = up.right if up.left is read else up.left
        if not isinstance(up.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)) or not _int_like(other):
            return None
        value, up = up, src.parent[up]
    kind = _kind(c)
    if kind is None:
        return None
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div):
        kind = "float"  # (int / int is a float in Python: divided in float64 on the device)
    if isinstance(up, ast.AugAssign) and isinstance(up.op, ast.Add) and \
            isinstance(up.target, ast.Name) and up.value is value:
        return _sum(src, up, read, value, kind, c.dtype)
    if (isinstance(up, ast.Call) and up.args == [value] and not up.keywords
            and isinstance(up.func, ast.Attribute) and up.func.attr == "append"
            and isinstance(up.func.value, ast.Name) and isinstance(src.parent[up], ast.Expr)
            and c.shape == []):
        return _listed(src, src.parent[up], up.func.value.id, read, value, kind, c)
    return None


def _reads(src: Source, call: ast.Call, trigger: str) -> bool:
    """`E.item()`, `float(E)` or `int(E)`, as the copy's trigger says, with the builtin not
    rebound in the file."""
    if trigger == "item":
        return (isinstance(call.func, ast.Attribute) and call.func.attr == "item"
                and not call.args and not call.keywords)
    return (isinstance(call.func, ast.Name) and call.func.id == trigger
            and len(call.args) == 1 and not call.keywords
            and not isinstance(call.args[0], ast.Starred) and not stored_in(src.tree, trigger))


def _int_like(node: ast.AST) -> bool:
    """A Python number whatever runs: a numeric constant, `x.size(k)`, `x.shape[k]`,
    `x.numel()`."""
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, float)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            not node.keywords:
        return (node.func.attr == "size" and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)) or \
            (node.func.attr == "numel" and not node.args)
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "shape" and isinstance(node.slice, ast.Constant))


def _kind(c: CopyRecord) -> str | None:
    """What the read gives Python: "float" or "int"; None where the trace does not say."""
    if c.trigger == "float" and c.dtype in _FLOATS + _INTS:
        return "float"
    if c.trigger in ("item", "int") and c.dtype in _INTS:
        return "int"
    if c.trigger == "item" and c.dtype in _FLOATS:
        return "float"
    return None  # (int() of a float tensor truncates, and raises on nan: not the same)


def _sum(src: Source, stmt: ast.AugAssign, read: ast.Call, value: ast.AST, kind: str,
         dtype: str) -> Plan | None:
    name = stmt.target.id
    loop = _loop_for(src, stmt, name, [stmt.target])
    init = _start(src, loop, name)
    if not (isinstance(init, ast.Constant) and type(init.value) in (int, float)):
        return None
    start = "float" if isinstance(init.value, float) else "int"
    result = "float" if "float" in (start, kind) else "int"
    torch = src.module_alias("torch")
    if result == start:
        after = f"{name} = {result}({name})"
    elif torch is not None:  # (a loop that never ran leaves the int it started from)
        after = f"{name} = float({name}) if isinstance({name}, {torch}.Tensor) else {name}"
    else:
        return None
    convert = ".double()" if result == "float" else ".long()"
    edits = _edits(src, stmt, read, convert, loop, after)
    how = ("summed in float64 on the device, as Python sums floats, it is the same number"
           if result == "float" else "summed as int64 on the device, it is the same number")
    return Plan(name, "sum", "add it up", how, edits, 1 + _converts(convert, dtype))


def _listed(src: Source, stmt: ast.Expr, name: str, read: ast.Call, value: ast.AST,
            kind: str, c: CopyRecord) -> Plan | None:
    loop = _loop_for(src, stmt, name, [stmt.value.func.value])
    if loop is not None and _in_a_loop(src, loop):
        return None  # (the list, made numbers after the inner loop, gets tensors again)
    torch = src.module_alias("torch")
    init = _start(src, loop, name)
    if torch is None or not (isinstance(init, ast.List) and not init.elts):
        return None
    if c.trigger == "item" and value is read:
        convert = ""  # (the dtype kept: tolist() gives what item() gives)
    else:
        convert = ".double()" if kind == "float" else ".long()"
    after = f"{name} = {torch}.stack({name}).tolist() if {name} else {name}"
    edits = _edits(src, stmt, read, convert, loop, after)
    return Plan(name, "keep", "list it", "one copy after the loop gives the same numbers",
                edits, _converts(convert, c.dtype))


def _converts(convert: str, dtype: str | None) -> int:
    """1 where `convert` launches a kernel on a tensor of `dtype` (0: none, or a no-op)."""
    return int(bool(convert) and (convert, dtype) not in ((".double()", "float64"),
                                                          (".long()", "int64")))


def _start(src: Source, loop: ast.AST | None, name: str) -> ast.expr | None:
    """The value `name` is given by the statement that last binds it before `loop`:
    `name = VALUE`, or its part of `a, name = A, VALUE`; None where that is not how."""
    stmt = preceding_store(src, loop, name) if loop is not None else None
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target, value = stmt.targets[0], stmt.value
    if isinstance(target, ast.Name):
        return value if target.id == name else None
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and \
            len(target.elts) == len(value.elts) and not any(
                isinstance(e, ast.Starred) for e in (*target.elts, *value.elts)):
        found = [v for t, v in zip(target.elts, value.elts)
                 if isinstance(t, ast.Name) and t.id == name]
        return found[0] if len(found) == 1 else None
    return None


def _in_a_loop(src: Source, loop: ast.AST) -> bool:
    """Whether `loop` runs inside another loop of its scope."""
    scope = src.scope_of(loop)
    for a in src.ancestors(loop):
        if a is scope:
            return False
        if isinstance(a, (ast.For, ast.AsyncFor, ast.While)):
            return True
    return False


def _loop_for(src: Source, stmt: ast.stmt, name: str, mine: list[ast.AST]) -> ast.AST | None:
    """The loop `stmt` accumulates `name` in, where nothing else there touches `name` (the
    nodes `mine` are the statement's own), nothing shares it (global, nonlocal, a nested
    function or class), no handler of an exception around the loop reads it (it would see
    the device value), and the scope uses it outside the loop."""
    loop = src.loop_of(stmt)
    if (loop is None or stmt.lineno != stmt.end_lineno or not src.alone_on_its_lines(stmt)
            or declared_shared(src.tree, name)):
        return None
    inside = names_in(loop, name)
    if [id(n) for n in inside] != [id(n) for n in mine]:
        return None
    scope = src.scope_of(loop)
    if any(names_in(n, name) for n in ast.walk(scope) if isinstance(n, SCOPES) and n is not scope):
        return None
    for a in src.ancestors(loop):
        if a is scope:
            break
        if isinstance(a, (ast.Try, ast.TryStar)) and any(
                names_in(n, name) for n in (*a.handlers, *a.finalbody)):
            return None
    outside = [n for n in names_in(scope, name)
               if isinstance(n.ctx, ast.Load) and id(n) not in {id(m) for m in inside}]
    return loop if outside else None


def _edits(src: Source, stmt: ast.stmt, read: ast.Call, convert: str, loop: ast.AST,
           after: str) -> dict[int, str]:
    """The statement with the read replaced by the device value, and `after` put after the
    loop at its indentation (on the same line's edit where the statement ends the loop)."""
    held = read.func.value if isinstance(read.func, ast.Attribute) else read.args[0]
    text = src.segment(held)
    if not isinstance(held, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        text = f"({text})"
    line = src.splice(stmt.lineno, read.col_offset, read.end_col_offset,
                      f"{text}.detach(){convert}")
    edits = {stmt.lineno: line}
    last = loop.end_lineno or loop.lineno
    edits[last] = edits.get(last, src.line(last)) + "\n" + indent_of(src.line(loop.lineno)) + after
    return edits
