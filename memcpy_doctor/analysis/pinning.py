"""Pinning: the rule that finds host->device copies the host waits for every step, and the
edit that makes those on one line asynchronous: their source pinned where it is made, and
`non_blocking=True` at the copies, as one edit of the user's file.

`non_blocking=True` alone on pageable memory changes nothing the host waits for (the driver
stages pageable memory, docs/cuda-semantics.md), so a source that is not pinned is pinned
first, where it comes from:
- a batch from a `DataLoader` built in the same file (`for x, y in loader:`):
  `pin_memory=True` where that DataLoader is built (it pins only where a GPU is there);
- a tensor assigned in the same function before the copy: a line after that assignment pins
  it, `x = x.pin_memory() if torch.cuda.is_available() else x` (`pin_memory()` raises on a
  machine without a GPU);
otherwise no edit is offered (the advice says where to pin). Read from the file with `ast`;
nothing is written.

A copy with no frame of Python code around it (a torch.profiler profile recorded without
with_stack) has no line to edit: it gets the same advice without a diff, saying what to
change and what to look for (the op, calls and bytes), priced from the trace's own figures
(`unplaced_suggestions`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..core.costmodel import DeviceProfile, profile_of
from ..core.defaults import NO_STACK_NOTE
from ..core.paths import format_site
from ..core.units import format_value
from ..core.trace import CopyRecord, Site, Trace
from .attribution import Explanation, user_site
from .edits import LineChange, indent_of, keyword_added, lines_change
from .expert_source import Source
from .steady import per_step
from .races import writes_before_ordered
from .suggestion import ASYNC, Suggestion

TRANSFER_METHODS = ("to", "cuda")


@dataclass
class PinPlan:
    """New texts for lines of one file (1-based line -> text, one or more lines), where the
    source gets pinned ("" when it is pinned already), and whether it is pinned for every
    copy (in the loop) or once (made before the loop)."""

    file: str
    lines: dict[int, str]
    pinned_at: str
    every_call: bool = True
    in_thread: bool = False  # pinned by a DataLoader's pin-memory thread, not the main one


def _transfer_calls(tree: ast.AST, line: int) -> list[ast.Call]:
    return [n for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in TRANSFER_METHODS and n.lineno == line == n.end_lineno]


def _with_non_blocking(text: str, calls: list[ast.Call]) -> str:
    """`text` with `non_blocking=True` added to each of `calls` (all on this line; their
    columns are UTF-8 byte offsets)."""
    raw = text.encode("utf-8")
    for call in sorted(calls, key=lambda c: -c.end_col_offset):
        if any(k.arg == "non_blocking" for k in call.keywords):
            continue
        close = call.end_col_offset - 1  # the ")"
        inner = raw[call.func.end_col_offset + 1:close].strip()
        raw = raw[:close] + (b", " if inner else b"") + b"non_blocking=True" + raw[close:]
    return raw.decode("utf-8")


def _names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _root(expr: ast.AST) -> str | None:
    """The name an expression such as `batch["x"].float` starts from."""
    while isinstance(expr, (ast.Subscript, ast.Attribute)):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _loader_of(tree: ast.Module, loop: ast.For) -> ast.Call | None:
    """The `DataLoader(...)` call that builds what `loop` iterates over (directly, or through
    `enumerate`), when it is assigned to a plain name in this file."""
    it = loop.iter
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate":
        it = it.args[0] if it.args else it
    if not isinstance(it, ast.Name):
        return None
    for n in ast.walk(tree):
        if (isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name) and n.targets[0].id == it.id
                and isinstance(n.value, ast.Call)):
            func = n.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "DataLoader":
                return n.value
    return None


def _assignment_before(tree: ast.Module, name: str, line: int) -> ast.Assign | None:
    """The last plain `name = ...` statement before `line` in the function (or module) that
    holds `line`."""
    scope: ast.AST = tree
    for n in ast.walk(tree):
        if (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.lineno <= line <= (n.end_lineno or n.lineno)
                and (scope is tree or n.lineno > scope.lineno)):
            scope = n
    best = None
    for n in ast.walk(scope):
        if (isinstance(n, ast.Assign) and (n.end_lineno or n.lineno) < line
                and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                and n.targets[0].id == name):
            if best is None or n.lineno > best.lineno:
                best = n
    return best


def pin_plan(copies: list[CopyRecord]) -> PinPlan | None:
    """The edit that pins the sources of `copies` (host->device copies made at one line of
    the user's code) and copies them with non_blocking; None when no such edit is found."""
    site = copies[0].site
    src = Source.read(site.file)
    if src is None:
        return None
    ends = {c.end_col for c in copies}
    calls = [c for c in _transfer_calls(src.tree, site.line)
             if None in ends or c.end_col_offset in ends]
    if not calls:
        return None
    lines = {site.line: _with_non_blocking(src.line(site.line), calls)}
    if all(c.pinned for c in copies):
        return PinPlan(site.file, lines, "")
    roots = {_root(c.func.value) for c in calls}
    loop = src.loop_of(calls[0])
    if isinstance(loop, ast.For) and roots <= _names(loop.target):
        loader = _loader_of(src.tree, loop)
        if loader is None:
            return None
        if not any(k.arg == "pin_memory" for k in loader.keywords):
            end, new = keyword_added(loader, src, "pin_memory=True")
            lines[end] = new
        elif not any(k.arg == "pin_memory" and isinstance(k.value, ast.Constant)
                     and k.value.value is True for k in loader.keywords):
            return None  # (pin_memory set some other way: leave it to the user)
        workers = next((k.value for k in loader.keywords if k.arg == "num_workers"), None)
        threaded = (isinstance(workers, ast.Constant) and isinstance(workers.value, int)
                    and workers.value > 0)  # (then a thread of the DataLoader's pins)
        return PinPlan(site.file, lines, f"DataLoader at line {loader.lineno}",
                       every_call=not threaded, in_thread=threaded)
    names = {c.func.value.id for c in calls if isinstance(c.func.value, ast.Name)}
    if src.module_alias("torch") != "torch" or len(names) != len(calls):
        return None  # (a source that is not a plain name: no place to pin it found)
    made = {name: _assignment_before(src.tree, name, site.line) for name in sorted(names)}
    for name, stmt in made.items():
        if stmt is None or stmt.end_lineno in lines:
            return None
        end = stmt.end_lineno
        lines[end] = (f"{src.line(end)}\n{indent_of(src.line(stmt.lineno))}{name} = "
                      f"{name}.pin_memory() if torch.cuda.is_available() else {name}")
    inside = loop is not None and all(loop.lineno < m.lineno for m in made.values())
    return PinPlan(site.file, lines,
                   "after " + ", ".join(f"line {m.lineno}" for m in made.values()), inside)


def plan_change(plan: PinPlan, cwd: str | None) -> LineChange | None:
    return lines_change(plan.file, plan.lines, cwd)


def pin_cost_ns(plan: PinPlan, copies: list[CopyRecord], profile: DeviceProfile) -> int:
    """What pinning costs the host (DeviceProfile.pin_ns), for every copy where the source
    is made in the loop, else once; nothing where a DataLoader's own thread pins (it runs
    beside the main thread)."""
    if plan.in_thread:
        return 0
    return sum(profile.pin_ns(c.bytes // max(c.calls, 1)) * (c.calls if plan.every_call else 1)
               for c in copies if not c.pinned)


class PinnedNonBlocking:
    """Host->device copies from pageable memory, or without non_blocking, that the host waits
    for, every step.

        for x, y in loader:                # DataLoader(ds) pins nothing
            x = x.to("cuda")               # the host stops until the copy is done
            y = y.to("cuda", non_blocking=True)   # still waits: pageable memory is staged

    Pin the source where it is made (`DataLoader(pin_memory=True)`, `.pin_memory()`) and copy
    with `non_blocking=True`, as one edit (analysis/pin_edits.py): the copy overlaps with
    the host's work; results are unchanged (the stream orders the copy before the ops that
    read it). All copies on one line, and every line fed by one DataLoader, are one edit.
    Copies made once (setup: a model moved) are listed by explain, not "fixed": pinning
    memory that is copied once costs the host a copy of its own. Uploads that no Python frame
    places get advice without a diff (`unplaced_suggestions`).
    """

    name = "pinned-non-blocking"
    description = "Pin host memory and copy host->device with non_blocking=True"
    # (a rules.Rule by shape; analysis/rules.py registers it, as this module does not import
    # that one, which imports it)

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        by_line: dict[tuple, list[CopyRecord]] = {}
        advice = []
        unplaced = []  # (no frame at all: a profile without Python stacks)
        for c in trace.copies:
            if not waited_upload(c) or not per_step(c, trace.summary.total_ns):
                continue
            if c.site is None and not c.stack:
                unplaced.append(c)
                continue
            if c.site is None:
                continue
            user = user_site(c)
            if user is None:
                continue
            if user is not c.site:  # made inside a library: advice at the user's call
                advice.append(self._inside(c, user, async_upload_ns(trace)[0], cwd))
            else:
                by_line.setdefault((c.site.file, c.site.line), []).append(c)
        plans = [(copies, pin_plan(copies)) for copies in by_line.values()
                 if not would_race(trace, copies)]
        return [self._suggest(trace, group, plan, cwd)
                for group, plan in _merge_plans(plans)] + advice + unplaced_suggestions(
            trace, [c for c in unplaced if not would_race(trace, [c])])

    @staticmethod
    def _inside(c: CopyRecord, user: Site, launch_ns: int, cwd: str | None) -> Suggestion:
        return Suggestion(
            rule=PinnedNonBlocking.name,
            title=f"copies to the device inside the call at {format_site(user, cwd)}",
            detail=(f"{_each(c)}, made inside {format_site(c.site, cwd)} without "
                    "non_blocking; memcpy-doctor knows no setting of that library that makes "
                    "them non-blocking, so no edit of your code is offered: pinning what the "
                    "call is given would not remove the wait"),
            sites=[user], removes=[c], saving_ns=c.host_ns - c.calls * launch_ns,
            exact=False, effect=ASYNC)

    def _suggest(self, trace: Trace, copies: list[CopyRecord], plan: PinPlan | None,
                 cwd: str | None) -> Suggestion:
        launch = async_upload_ns(trace)[0]
        saving = sum(c.host_ns - c.calls * launch for c in copies)
        sites = sorted({c.site for c in copies}, key=lambda x: (x.file, x.line))
        where = ", ".join(format_site(x, cwd) for x in sites)
        each = "; ".join(_each(c) for c in copies)
        change = plan_change(plan, cwd) if plan is not None else None
        if all(c.pinned for c in copies):
            title, how = (f"copy with non_blocking=True at {where}",
                          "the source is pinned already")
        elif change is not None:
            title = f"pin the source and copy with non_blocking=True at {where}"
            how = f"pinned {plan.pinned_at}, only where a GPU is there"
        else:
            title = f"pin the source and copy with non_blocking=True at {where}"
            how = ("pin the source where it is made (DataLoader(pin_memory=True), or "
                   "x.pin_memory() where a GPU is there), then add non_blocking=True: "
                   "non_blocking alone on pageable memory still blocks (no edit found that "
                   "does both)")
        cost = (pin_cost_ns(plan, copies, profile_of(trace))
                if plan is not None else 0)
        return Suggestion(rule=self.name, title=title, detail=f"{each}; {how}", sites=sites,
                          removes=copies, saving_ns=saving - cost,
                          diff=change[0] if change else None,
                          apply=change[1] if change else None,
                          exact=change is not None, effect=ASYNC, cost_ns=cost)


def would_race(trace: Trace, copies: list[CopyRecord]) -> bool:
    """Whether making these copies non_blocking would make a race (analysis/races.py): a
    source pinned already (a buffer the program reuses) that the host writes again before
    anything waits for the copy, as its timeline shows. Such a copy keeps its wait."""
    return any(c.pinned and writes_before_ordered(trace, c) for c in copies)


def _each(c: CopyRecord) -> str:
    many = c.calls != 1
    asked = " asked non_blocking" if c.non_blocking and not c.pinned else ""
    return (f"{c.calls} host->device cop{'ies' if many else 'y'} of "
            f"{c.bytes // max(c.calls, 1)} bytes{' each' if many else ''} from "
            f"{'pinned' if c.pinned else 'pageable'} memory{asked}, "
            f"{'each ' if many else ''}waited for")


#: From this size a call, pageable uploads made every step look like a DataLoader's batches
#: rather than small tensors the program makes itself (an index list, a scalar).
BATCH_MIN_BYTES = 64 * 1024

#: The op a trigger is in a torch.profiler trace, and the code that makes it: where to look
#: in a profile that names no line.
TRIGGER_OPS = {"to": ("aten::to", "`x.to(device)`, `x.cuda()`"), "cuda": ("aten::to", "`x.cuda()`"),
               "copy_": ("aten::copy_", "`dst.copy_(src)`")}


def waited_upload(c: CopyRecord) -> bool:
    """A host->device copy by `.to`, `.cuda` or `copy_` that the host waited for: what this
    rule makes asynchronous."""
    return c.direction == "HtoD" and c.sync and c.trigger in TRANSFER_METHODS + ("copy_",)


def async_upload_ns(trace: Trace) -> tuple[int, str]:
    """What one asynchronous upload costs the host, and where the figure comes from: on a
    real GPU, the mean host time of the trace's own asynchronous uploads of pinned memory,
    where it has any; else the device profile's launch cost."""
    done = [c for c in trace.copies if c.direction == "HtoD" and c.pinned and not c.sync]
    calls = sum(c.calls for c in done)
    if calls and not trace.meta.simulated:
        ns = sum(c.host_ns for c in done) // calls
        return ns, (f"{ns / 1e3:.3g} us, what this trace's {calls} asynchronous upload"
                    f"{'s' if calls != 1 else ''} of pinned memory took the host each")
    profile = profile_of(trace)
    return profile.launch_ns, (f"{profile.launch_ns / 1e3:.3g} us, the launch cost of the "
                               f"device profile {profile.name}"
                               + ("" if trace.meta.simulated else "; this trace times no "
                                  "asynchronous upload"))


def unplaced_suggestions(trace: Trace, copies: list[CopyRecord]) -> list[Suggestion]:
    """Advice for uploads waited for every step that no frame of Python code places (a
    torch.profiler profile recorded without with_stack): what to change, and the op, calls
    and bytes to look for; no diff, as there is no line to edit. One per kind: uploads of
    pinned memory (non_blocking=True), pageable ones of batch size (the DataLoader pins),
    other pageable ones (pin where the tensor is made). The saving is the host's time in the
    copies beyond an asynchronous upload's each (`async_upload_ns`), at most: less where the
    main thread pins (a host copy of the bytes, which such a trace does not time)."""
    groups: dict[str, list[CopyRecord]] = {}
    for c in copies:
        kind = ("pinned" if c.pinned else "batches"
                if c.bytes // max(c.calls, 1) >= BATCH_MIN_BYTES else "pageable")
        groups.setdefault(kind, []).append(c)
    launch_ns, launch = async_upload_ns(trace)
    why = ("the profile has no Python stacks (record it with torch.profiler.profile(..., "
           "with_stack=True) to get this edit at its line)"
           if NO_STACK_NOTE in trace.meta.untraced
           else "no frame of Python code was recorded around these copies, so no line to edit")
    return [_unplaced(trace, kind, groups[kind], launch_ns, launch, why)
            for kind in ("batches", "pageable", "pinned") if kind in groups]


def _unplaced(trace: Trace, kind: str, copies: list[CopyRecord], launch_ns: int, launch: str,
              why: str) -> Suggestion:
    calls = sum(c.calls for c in copies)
    ops = ", ".join(dict.fromkeys(f"`{TRIGGER_OPS[c.trigger][0]}`" for c in copies))
    each = format_value("bytes", sum(c.bytes for c in copies) // max(calls, 1))
    where = f"{ops}, {calls} calls of {each} each on average, every step"
    if kind == "pinned":
        title = f"copy the uploads of pinned memory with non_blocking=True ({where})"
        how = ("the memory is pinned already: add non_blocking=True at the copy, only if the "
               "host does not write that memory again before the copy is done (a pinned "
               "buffer refilled every step would race: wait for an event recorded after the "
               "copy first)" + ("; this trace cannot show whether it does"
                                if trace.timeline is None else ""))
    elif kind == "batches":
        title = ("pin the batches with DataLoader(pin_memory=True) and copy them with "
                 f"non_blocking=True ({where})")
        how = ("of their size they look like a DataLoader's batches: build it with "
               "pin_memory=True and add non_blocking=True to each batch's .to(device) (a "
               "tensor not from a DataLoader: pin it where it is made, x.pin_memory()); with "
               "num_workers > 0 a thread of the DataLoader pins them, beside the main one; "
               "with num_workers=0 the main thread does, a host copy of each batch that the "
               "saving leaves out")
    else:
        title = f"pin the uploads' host memory and copy with non_blocking=True ({where})"
        how = ("pin each tensor where it is made (x.pin_memory() where a GPU is there, or "
               "made pinned: torch.empty(..., pin_memory=True)), then add non_blocking=True "
               "at the copy (non_blocking alone on pageable memory still blocks); pinning is "
               "a host copy of the bytes, which the saving leaves out")
    found = "; ".join(f"{_each(c)} in `{TRIGGER_OPS[c.trigger][0]}` "
                      f"({TRIGGER_OPS[c.trigger][1]}), {c.host_ns / 1e6:.4g} ms of host time"
                      + (f", read next by `{c.consumer.op}`" if c.consumer else "")
                      for c in copies)
    return Suggestion(
        rule=PinnedNonBlocking.name, title=title,
        detail=(f"{found}; {how}. " + ("A copy without non_blocking" if kind == "pinned"
                                         else "A copy of pageable memory")
                + " blocks the host; from pinned memory with non_blocking=True the host goes "
                "on, and the stream still orders the copy before the ops that read it "
                "(results are unchanged). The saving is the host's time in these copies "
                f"beyond an asynchronous upload's each ({launch}), at most: the device still "
                "makes the copies"),
        sites=[], removes=copies, saving_ns=sum(c.host_ns for c in copies) - calls * launch_ns,
        exact=False, effect=ASYNC, no_diff=why)


def _merge_plans(plans: list[tuple[list[CopyRecord], PinPlan | None]]
                 ) -> list[tuple[list[CopyRecord], PinPlan | None]]:
    """One edit per edited line: groups whose plans edit a line in common become one (a
    DataLoader that feeds copies on two lines is pinned once)."""
    merged: list[tuple[list[CopyRecord], PinPlan | None]] = []
    for copies, plan in plans:
        for i, (other, other_plan) in enumerate(merged):
            if (plan is not None and other_plan is not None and plan.file == other_plan.file
                    and set(plan.lines) & set(other_plan.lines)):
                lines = {**other_plan.lines, **plan.lines}
                at = dict.fromkeys(x for x in (other_plan.pinned_at, plan.pinned_at) if x)
                merged[i] = (other + copies, PinPlan(plan.file, lines, ", ".join(at)))
                break
        else:
            merged.append((copies, plan))
    return merged
