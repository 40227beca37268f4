"""An expert rule for a module built on the host and then moved (`BuildOnDevice`): build it on
the device. It checks the user's source (analysis/expert_source.py) for what the edit would
break, and says in its title when the program's numbers change.

Registered by analysis/rules.py (EXPERT_RULES in analysis/expert_rules.py) before the rule
named by its `before`, so that it claims first the copies both would remove.
"""

from __future__ import annotations

import ast
from typing import ClassVar

from ..core.paths import format_site
from ..core.trace import CopyRecord, Trace
from .attribution import Explanation
from .edits import indent_of, lines_change
from .expert_source import Source, dotted, source_cache, torch_release, user_copies
from .suggestion import DROP, Suggestion

#: Ops that draw random numbers: where one runs other than in the construction, the numbers
#: it draws follow from how many the construction drew, and on which device.
RANDOM_OPS = frozenset(f"aten::{n}" for n in (
    "normal_", "uniform_", "bernoulli_", "bernoulli", "random_", "exponential_", "geometric_",
    "cauchy_", "log_normal_", "normal", "poisson", "rand", "randn", "randint", "randperm",
    "rand_like", "randn_like", "randint_like", "multinomial", "native_dropout",
    "rrelu_with_noise", "_fused_dropout"))
#: Calls in a constructor that need its tensors on the host (or read them back there).
_HOST_ONLY = frozenset({"numpy", "item", "tolist", "cpu", "data_ptr"})
#: Names a capitalised torch attribute has that are no module (tensor and storage types...).
_NOT_MODULES = ("Tensor", "Storage", "Generator", "Size", "Stream", "Event")
_DTYPES = frozenset({"float", "float16", "float32", "float64", "half", "double", "bfloat16",
                     "int", "int8", "int16", "int32", "int64", "long", "short", "uint8",
                     "bool", "complex64", "complex128", "cfloat", "cdouble"})


class BuildOnDevice:
    """A module built on the host and then moved to the device, a copy per parameter.

        model = Net(cfg).to(device)        # every parameter and buffer copied, waited for

    Build it on the device: `with torch.device(device):` around the construction makes the
    parameters there, and no copy is made (the `.to(device)` stays, at no cost, for what a
    constructor makes outside torch's factories: `torch.from_numpy`, a loaded tensor).
    Proposed for torch.nn's modules and for classes of the same file whose code (read with
    `ast`, with the classes and functions of the file it names, and the statement's own
    arguments, which are made inside the `with` too) needs no tensor on the host. Random
    initial weights are then drawn from the device's generator, not the host's: other numbers,
    which the title says, unless the weights are loaded afterwards (`load_state_dict` on it
    later in the same scope) and nothing else in the run draws random numbers (whose stream
    the construction no longer advances). It is set-up: its saving is the copies' host time,
    once.
    """

    name = "build-on-device"
    description = "Build a module on the device instead of copying its parameters there"
    before: ClassVar[str] = "host-round-trip"

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        release = torch_release(trace.meta.torch_version)
        if release is not None and release < (2, 0):
            return []  # (torch.device is a context manager from torch 2.0 on)
        read = source_cache()
        found: dict[tuple, tuple] = {}
        for _, c in user_copies(trace, "HtoD", ("to", "cuda"), sync=None, every_step=False):
            src = read(c.site.file)
            built = _construction(src, c) if src is not None else None
            if built is not None:
                key = (c.site.file, built[0].lineno)
                found.setdefault(key, (src, built, []))[2].append(c)
        return [s for s in (self._suggest(trace, src, stmt, device, copies, cwd)
                            for src, (stmt, device), copies in found.values()) if s is not None]

    def _suggest(self, trace: Trace, src: Source, stmt: ast.Assign, device: str,
                 copies: list[CopyRecord], cwd: str | None) -> Suggestion | None:
        torch = src.module_alias("torch")
        indent = indent_of(src.line(stmt.lineno))
        edits = {n: "    " + src.line(n) for n in range(stmt.lineno, stmt.end_lineno + 1)}
        edits[stmt.lineno] = f"{indent}with {torch}.device({device}):\n" + edits[stmt.lineno]
        change = lines_change(src.path, edits, cwd)
        if change is None:
            return None
        target = src.segment(stmt.targets[0])
        loaded = _loaded_later(src, stmt, target)
        others = _other_random_ops(trace, stmt, copies)
        changes = not loaded or bool(others)
        calls = sum(c.calls for c in copies)
        if not loaded:
            numbers = ("its random initial weights are drawn from the device's generator, "
                       "not the host's: other numbers (loading the weights afterwards would "
                       "make them the same)")
        elif others:
            numbers = ("the weights are loaded afterwards, but the run draws random numbers "
                       f"elsewhere ({', '.join(sorted(others))}), which the construction no "
                       "longer draws before them on the same generator: other numbers")
        else:
            numbers = "the weights are loaded afterwards: the same numbers"
        return Suggestion(
            rule=self.name,
            title=f"build `{target}` on the device at {format_site(copies[0].site, cwd)} "
                  f"instead of copying its parameters there"
                  + (" (initial weights drawn on the device)" if changes else ""),
            detail=(f"{calls} host->device copies, {sum(c.bytes for c in copies)} bytes, each "
                    "waited for, once: the constructor makes every parameter on the host and "
                    f"`.to` moves it. Under `with {torch}.device({device}):` the constructor "
                    "makes them on the device (the `.to` stays, moving nothing, for what a "
                    f"constructor makes outside torch's factories); {numbers}"),
            sites=[copies[0].site], removes=copies, saving_ns=sum(c.host_ns for c in copies),
            diff=change[0], apply=change[1], effect=DROP, changes_results=changes)


def _construction(src: Source, c: CopyRecord) -> tuple[ast.Assign, str] | None:
    """(the statement, its device's source text) where the copy `c` is made by
    `target = Module(...).to(device)` (or `.cuda()`) and the module may be built on the
    device (BuildOnDevice's docstring); None otherwise."""
    moves = [k for k in src.calls_at(c.site.line, c.end_col)
             if isinstance(k.func, ast.Attribute) and k.func.attr in ("to", "cuda")
             and isinstance(k.func.value, ast.Call)]
    if len(moves) != 1:
        return None
    move = moves[0]
    stmt = src.parent.get(move)
    torch = src.module_alias("torch")
    if (torch is None or not isinstance(stmt, ast.Assign) or stmt.value is not move
            or len(stmt.targets) != 1
            or not isinstance(stmt.targets[0], (ast.Name, ast.Attribute))
            or not src.alone_on_its_lines(stmt)
            or any(isinstance(n, ast.NamedExpr) for n in ast.walk(stmt))):
        return None
    device = _device_of(src, move, torch)
    if device is None or _reads_host(src, stmt, set()) or \
            not _buildable(src, move.func.value, torch, set()):
        return None  # (its arguments are made inside the `with` too)
    return stmt, device


def _device_of(src: Source, move: ast.Call, torch: str) -> str | None:
    """The source text of the device `.to(...)` / `.cuda()` moves to, None where it also
    converts or names no device plainly."""
    if move.func.attr == "cuda":
        return '"cuda"' if not move.args and not move.keywords else None
    given = [*move.args, *(k.value for k in move.keywords if k.arg == "device")]
    if len(given) != 1 or any(k.arg not in ("device", "non_blocking") for k in move.keywords):
        return None
    device = given[0]
    if isinstance(device, ast.Constant):
        return src.segment(device) if isinstance(device.value, str) else None
    name = dotted(device) if not isinstance(device, ast.Call) else dotted(device.func)
    if name is None or name.split(".")[-1] in _DTYPES:
        return None  # (a dtype, or more than a name)
    if isinstance(device, ast.Call) and name != f"{torch}.device":
        return None
    return src.segment(device)


def _buildable(src: Source, ctor: ast.Call, torch: str, seen: set[str]) -> bool:
    """Whether the call builds a module that may be built on the device: a torch.nn class
    (`torch.nn.Linear`, `nn.Linear` with nn from torch), or a class of this file whose code,
    with that of the classes and functions of this file it calls or derives from, reads
    nothing back to the host (`_reads_host`)."""
    name = dotted(ctor.func)
    if name is None:
        return False
    parts = name.split(".")
    if not parts[-1][:1].isupper() or parts[-1].endswith(_NOT_MODULES):
        return False
    if parts[:2] == [torch, "nn"] or (len(parts) == 2 and _is_torch_nn(src, parts[0])):
        return True
    classes = [n for n in src.tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return len(parts) == 1 and len(classes) == 1 and not _reads_host(src, classes[0], seen)


def _reads_host(src: Source, node: ast.AST, seen: set[str]) -> bool:
    """Whether `node`, or a class or function of this file it names (its bases, what it
    calls), needs a tensor on the host (`.numpy()`, `.cpu()`) or reads one back (`.item()`,
    `.tolist()`): under a device context its tensors are on the device."""
    if any(isinstance(n, ast.Attribute) and n.attr in _HOST_ONLY for n in ast.walk(node)):
        return True
    named = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - seen
    seen |= named
    return any(isinstance(d, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
               and d.name in named and _reads_host(src, d, seen) for d in src.tree.body)


def _is_torch_nn(src: Source, name: str) -> bool:
    """`name` is torch.nn: `from torch import nn [as name]`, `import torch.nn as name`."""
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ImportFrom) and node.module == "torch" and any(
                a.name == "nn" and (a.asname or a.name) == name for a in node.names):
            return True
        if isinstance(node, ast.Import) and any(
                a.name == "torch.nn" and a.asname == name for a in node.names):
            return True
    return False


def _loaded_later(src: Source, stmt: ast.Assign, target: str) -> bool:
    """`TARGET.load_state_dict(...)` after the statement, in its scope."""
    scope = src.scope_of(stmt)
    end = stmt.end_lineno or stmt.lineno
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "load_state_dict" and n.lineno > end
               and src.segment(n.func.value) == target and src.scope_of(n) is scope
               for n in ast.walk(scope))


def _other_random_ops(trace: Trace, stmt: ast.Assign, copies: list[CopyRecord]) -> set[str]:
    """The random ops of the run other than those that made the moved tensors (at their
    producers' lines, or at the construction's)."""
    made = {c.producer.site for c in copies if c.producer is not None}
    lines = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
    return {o.op for o in trace.ops if o.op in RANDOM_OPS and o.site not in made
            and not (o.site is not None and o.site.file == copies[0].site.file
                     and o.site.line in lines)}

