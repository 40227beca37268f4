"""Suggestions for the graph breaks of a compiled program that make the host wait.

A graph break at a host read (`.item()`, `.tolist()`, a mask index, `nonzero`) costs twice: the
sync itself, and the graph split in two around it. The fix Dynamo names in its reason is a
setting read when the function is compiled:

    s = y.sum().item()     # Graph break: Unsupported Tensor.item() call [GB0124]

- a scalar read: `torch._dynamo.config.capture_scalar_outputs = True` keeps the read in the
  graph, where Inductor can keep the value on the device (no sync) when only tensor code uses
  it; where the host needs it (a shape, a branch), the sync stays and the graph is whole;
- a data-dependent shape (a mask index, `nonzero`): `capture_dynamic_output_shape_ops = True`
  keeps the graph whole; the count is still read, so the lasting fix is code that keeps the
  shape static (`torch.where(mask, x, 0)`, `nonzero_static(size=...)`).

The edit is one line: the program's `import torch` made to set the option too, so that
`explain --verify` can prove it by re-running the program with it.
"""

from __future__ import annotations

from ..core.compiled import GraphBreak
from ..core.paths import format_site
from ..core.trace import CopyRecord, Site, Trace
from .edits import LineChange, _line_change
from .suggestion import Suggestion

_SCALAR_READS = {"item", "tolist", "float", "int", "bool", "index", "format", "print"}
_SHAPE_READS = {"mask", "nonzero", "masked_select", "unique", "repeat_interleave"}


def _setting(brk: GraphBreak, copies: list[CopyRecord]) -> tuple[str, str] | None:
    """The Dynamo option that keeps the graph whole at `brk`, and what else to do."""
    text = f"{brk.reason}\n{brk.detail}"
    triggers = {c.trigger for c in copies}
    if "capture_scalar_outputs" in text or triggers & _SCALAR_READS and brk.gb_code == "GB0124":
        return ("capture_scalar_outputs",
                "the read joins the graph; where only tensor code uses the value, the compiled "
                "code keeps it on the device and the sync goes; where the host needs it (a "
                "shape, a branch) the sync stays and the graph is whole")
    if "capture_dynamic_output_shape_ops" in text or triggers & _SHAPE_READS:
        return ("capture_dynamic_output_shape_ops",
                "the graph stays whole, but the count is still read back: keep the shape "
                "static to remove the sync (torch.where(mask, x, 0) for a masked value, "
                "nonzero_static(size=N) for indices)")
    return None


def _import_torch_line(path: str) -> int | None:
    """The line of the program's own top-level `import torch`, if it has one."""
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.rstrip() == "import torch":
                    return number
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _config_change(path: str, option: str, cwd: str | None) -> LineChange | None:
    line = _import_torch_line(path)
    if line is None:
        return None
    return _line_change(Site(path, line, "<module>"), cwd, lambda old: (
        f"import torch; torch._dynamo.config.{option} = True  # memcpy-doctor: keep the "
        f"graph whole\n"))


def graph_break_suggestions(trace: Trace, cwd: str | None = None) -> list[Suggestion]:
    """One suggestion per graph break that syncs, largest saving first."""
    if trace.compile is None or not trace.compile.supported:
        return []
    out = []
    for brk in trace.compile.graph_breaks:
        if brk.site is None:
            continue
        copies = [c for c in trace.copies if c.sync and c.site is not None
                  and (c.site.file, c.site.line) == (brk.site.file, brk.site.line)]
        found = _setting(brk, copies) if copies else None
        if found is None:
            continue
        option, effect = found
        where = format_site(brk.site, cwd)
        code = f" [{brk.gb_code}]" if brk.gb_code else ""
        calls = sum(c.calls for c in copies)
        said = (f"Dynamo breaks the graph at {where} ({brk.reason}{code}), reached "
                f"{brk.calls} times, and the host waits there {calls} times; ")
        saving = sum(c.host_ns for c in copies)
        if option == "capture_dynamic_output_shape_ops":  # the sync stays with the option
            out.append(Suggestion(
                rule="graph-break-sync", title=f"keep the shape static at {where}",
                detail=said + f"torch._dynamo.config.{option} = True keeps the graph whole; "
                + effect, sites=[brk.site], removes=copies, saving_ns=saving, exact=False))
            continue
        change = _config_change(brk.site.file, option, cwd)
        out.append(Suggestion(
            rule="graph-break-sync",
            title=f"set torch._dynamo.config.{option} = True for the graph break at {where}",
            detail=said + effect, sites=[brk.site], removes=copies, saving_ns=saving,
            diff=change[0] if change else None, apply=change[1] if change else None,
            exact=False))
    return out
