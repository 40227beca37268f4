"""An expert rule for a boolean mask that indexes every step and never changes
(`IndexOnce`): turn it into positions once, before the loop.

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
from .expert_source import (Source, changed_in, dotted, loop_parts, source_cache, stored_in,
                            user_copies)
from .suggestion import DROP, Suggestion


class IndexOnce:
    """A loop that indexes with the same boolean mask every step.

        for epoch in range(200):
            out = model(data.x, data.edge_index)
            loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])

    Each `x[mask]` reads the mask's count back to the host (and its backward does again).
    Positions made once before the loop, `train_mask_idx = data.train_mask.nonzero(
    as_tuple=True)`, index the same elements in the same order, so `out[train_mask_idx]` is
    the same tensor with the same gradient, and no step waits. Proposed where the mask is a
    name or an attribute chain (`mask`, `data.train_mask`) that nothing in the loop binds or
    changes in place, and, where the trace has a timeline, every copy it makes reads the same
    storage (then the copies of the backward pass that read it go too).
    """

    name = "index-once"
    description = "Turn a mask that never changes into positions once, before the loop"
    before: ClassVar[str] = "data-dependent-shape"

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        read = source_cache()
        reads = _storages_read(trace)
        groups: dict[tuple, list] = {}
        for i, c in user_copies(trace, "DtoH", ("mask",)):
            if c.end_col is None:
                continue
            src = read(c.site.file)
            found = _masked(src, c) if src is not None else None
            if found is None or len(reads.get(i, ())) > 1:
                continue  # (not that shape; or its mask changed between steps)
            loop, mask = found
            groups.setdefault((c.site.file, loop.lineno, mask), []).append((i, loop))
        out = []
        for (path, _, mask), members in groups.items():
            src = read(path)
            loop = members[0][1]
            storages = set().union(*(reads.get(i, set()) for i, _ in members))
            copies = [trace.copies[i] for i, _ in members]
            # (the backward pass's mask copies in the loop, reading the same storage, go too)
            copies += [c for j, c in enumerate(trace.copies)
                       if c.trigger == "mask" and c.sync and storages and reads.get(j) == storages
                       and c not in copies and c.site is not None and c.site.file == path
                       and loop.lineno <= c.site.line <= loop.end_lineno]
            edit = _edit(src, loop, mask)
            change = lines_change(path, edit[1], cwd) if edit is not None else None
            if change is None:
                continue
            first = min(copies, key=lambda c: c.site.line)
            out.append(Suggestion(
                rule=self.name,
                title=f"turn `{mask}` into positions once, before the loop at "
                      f"{format_site(first.site, cwd)}",
                detail=(f"{sum(c.calls for c in copies)} host waits to count `{mask}`, the "
                        f"same mask every step; `{edit[0]}` before the loop indexes the same "
                        "elements in the same order (the same tensors and gradients), with one "
                        "wait in all"),
                sites=sorted({c.site for c in copies}, key=lambda s: s.line), removes=copies,
                saving_ns=sum(c.host_ns for c in copies) - first.host_ns // first.calls,
                diff=change[0], apply=change[1], effect=DROP,
                cost_ns=first.host_ns // max(first.calls, 1)))
        return out


def _storages_read(trace: Trace) -> dict[int, set[int]]:
    """For each copy record with events in the timeline, the first storage its events read
    (a mask's count: the mask)."""
    out: dict[int, set[int]] = {}
    if trace.timeline is None:
        return out
    for e in trace.timeline.events:
        if e.kind == "copy" and e.reads:
            out.setdefault(e.ref, set()).add(e.reads[0])
    return out


def _masked(src: Source, c: CopyRecord) -> tuple[ast.AST, str] | None:
    """(the loop, the mask's text) for the `x[mask]` that ends at the copy's column, where
    the mask is a name or attribute chain the loop neither binds nor changes."""
    for node in ast.walk(src.tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and node.end_lineno == c.site.line and node.end_col_offset == c.end_col):
            mask = dotted(node.slice)
            loop = src.loop_of(node)
            if mask is None or loop is None:
                return None
            root = mask.split(".")[0]
            parts = [*loop.body, *loop_parts(loop)]
            if any(stored_in(p, root) for p in parts) or any(
                    changed_in(src, p, root) for p in loop.body):
                return None
            if "." in mask and any(isinstance(n, ast.Attribute) and not isinstance(
                    n.ctx, ast.Load) for p in loop.body for n in ast.walk(p)):
                return None  # (an attribute written in the loop may be the mask's)
            if any(_writes(n, mask) for p in loop.body for n in ast.walk(p)):
                return None
            return loop, mask
    return None


def _writes(node: ast.AST, mask: str) -> bool:
    """Whether `node` writes into the mask: `mask[i] = v`, `mask.fill_(v)`, `out=mask`."""
    if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
        return dotted(node.value) == mask
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr.endswith("_") and dotted(node.func.value) == mask:
            return True
        return any(k.arg == "out" and dotted(k.value) == mask for k in node.keywords)
    return False


def _edit(src: Source, loop: ast.AST, mask: str) -> tuple[str, dict[int, str]] | None:
    """The positions' statement, and the lines that make it before `loop` and index with
    it instead of `mask` everywhere in the loop."""
    taken = {n.id for n in ast.walk(src.tree) if isinstance(n, ast.Name)}
    name = mask.split(".")[-1] + "_idx"
    while name in taken:
        name += "_"
    made = f"{name} = {mask}.nonzero(as_tuple=True)"
    lines: dict[int, str] = {}
    uses = sorted(((n.lineno, n.slice.col_offset, n.slice.end_col_offset)
                   for n in ast.walk(loop)
                   if isinstance(n, ast.Subscript) and dotted(n.slice) == mask
                   and n.slice.lineno == n.slice.end_lineno),
                  reverse=True)  # (right to left: earlier columns stay valid)
    for line, start, end in uses:
        text = lines.get(line, src.line(line))
        raw = text.encode("utf-8")
        lines[line] = (raw[:start] + name.encode("utf-8") + raw[end:]).decode("utf-8")
    head = src.line(loop.lineno)
    lines[loop.lineno] = f"{indent_of(head)}{made}\n{lines.get(loop.lineno, head)}"
    return made, lines
