"""Expert rules: edits that need to know how a library call copies, proven on the user's source
(analysis/expert_source.py) before they are proposed.

- `FusedGradScaler`: GradScaler.step reads found_inf back every step; a fused optimizer takes
  it on the device.
- `BuildOnDevice` (expert_module.py): `Net().to(device)` copies every parameter;
  `with torch.device(device):` makes them there.
- `AccumulateOnDevice` (expert_accumulate.py): `total += loss.item()` summed on the device.
- `HoistInvariantUpload` (expert_hoist.py): a constant uploaded every step, made once.
- `MakeOnDevice` (expert_factory.py): `torch.randn(shape).to(device)` made on the device.
- `IndexOnce` (expert_mask.py): `x[mask]` with the same mask every step, positions made once.

None of them imports analysis/rules.py (which imports this module last, and registers
EXPERT_RULES: no import cycle); each names in `before` the rule it goes before in the
registry, so that it claims first the copies both would remove. Each rule's saving is the
host time of what it removes (the upper bound; `suggest` replays the timeline where it can).
"""

from __future__ import annotations

import ast
from typing import ClassVar

from ..core.paths import format_site, is_user_file
from ..core.trace import CopyRecord, Site, Trace
from .attribution import Explanation
from .edits import lines_change
from .expert_accumulate import AccumulateOnDevice
from .expert_factory import MakeOnDevice
from .expert_hoist import HoistInvariantUpload
from .expert_mask import IndexOnce
from .expert_module import BuildOnDevice
from .expert_source import Source, dotted, last_name, source_cache, torch_release
from .suggestion import DROP, Suggestion

#: torch.optim classes whose fused step takes GradScaler's scale and found_inf on the device
#: (torch 2.13's adam.py, adamw.py, sgd.py and adagrad.py set `_step_supports_amp_scaling`
#: where `fused`), and the first torch release whose CUDA build has their fused kernel: as
#: remembered for Adam, AdamW (2.0) and SGD (2.3), not checked here; Adagrad's was the CPU's
#: alone for a while, and 2.13 (which has a CUDA one) is the only release checked.
FUSED_OPTIMIZERS = {"Adam": (2, 0), "AdamW": (2, 0), "SGD": (2, 3), "Adagrad": (2, 13)}


class FusedGradScaler:
    """GradScaler reads found_inf back to the host every step, to decide whether to step.

        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            ...
            scaler.step(opt)               # GradScaler._maybe_opt_step: found_inf.item()

    With `fused=True` (Adam, AdamW, SGD, Adagrad), the optimizer sets `_step_supports_amp_scaling`:
    GradScaler.step hands it the scale and found_inf as device tensors and the fused kernel
    skips the update itself; nothing is read back. The edit adds
    `fused=torch.cuda.is_available()` where the optimizer is built (in the file of the
    `scaler.step` call), so that a run without a GPU is the run it was. The fused kernel
    rounds the update otherwise than the one it replaces: results may differ in the last
    bits, which the title says.
    """

    name = "fused-grad-scaler"
    description = "Build the optimizer fused, so that GradScaler.step reads nothing back"
    before: ClassVar[str] = "host-round-trip"

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        read = source_cache()
        release = torch_release(trace.meta.torch_version)
        found: dict[tuple, tuple] = {}
        for c in trace.copies:
            if (c.direction != "DtoH" or c.trigger != "item" or not c.sync or c.site is None
                    or not is_user_file(c.site.file) or c.shape != []):
                continue
            src = read(c.site.file)
            built = _optimizer_of(src, c) if src is not None else None
            if built is None or (release is not None and release < FUSED_OPTIMIZERS[built[1]]):
                continue
            key = (c.site.file, built[0].lineno, built[0].col_offset)
            found.setdefault(key, (src, built, []))[2].append(c)
        out = []
        for src, (call, cls), copies in found.values():
            s = self._suggest(src, call, cls, copies, cwd)
            if s is not None:
                out.append(s)
        return out

    def _suggest(self, src: Source, call: ast.Call, cls: str, copies: list[CopyRecord],
                 cwd: str | None) -> Suggestion | None:
        torch = src.module_alias("torch")
        last = max((*call.args, *(k.value for k in call.keywords)),
                   key=lambda n: (n.end_lineno, n.end_col_offset), default=None)
        if torch is None or last is None:
            return None
        line = src.splice(last.end_lineno, last.end_col_offset, last.end_col_offset,
                          f", fused={torch}.cuda.is_available()")
        change = lines_change(src.path, {last.end_lineno: line}, cwd)
        if change is None:
            return None
        built = Site(src.path, call.lineno, "")
        calls = sum(c.calls for c in copies)
        return Suggestion(
            rule=self.name,
            title=f"build the {cls} at {format_site(built, cwd)} with fused=True, so that "
                  f"GradScaler.step reads nothing back (the fused update rounds otherwise)",
            detail=(f"`scaler.step` at {format_site(copies[0].site, cwd)} reads found_inf "
                    f"back to the host {calls} times, to decide on the host whether to step; "
                    f"a fused {cls} takes the scale and found_inf on the device and skips the "
                    f"update itself. fused={torch}.cuda.is_available() leaves a run without "
                    "a GPU as it was. The fused kernel computes the same update in one kernel, "
                    "rounded otherwise: results may differ in the last bits. The saving "
                    "counts the reads it removes only: one kernel instead of the optimizer's "
                    "foreach kernels saves more, not estimated here (explain --verify "
                    "measures it)"),
            sites=[copies[0].site], removes=copies, saving_ns=sum(c.host_ns for c in copies),
            diff=change[0], apply=change[1], effect=DROP, changes_results=True)


def _optimizer_of(src: Source, c: CopyRecord) -> tuple[ast.Call, str] | None:
    """The construction (and class) of the optimizer that `scaler.step(opt)` at the copy's
    call steps, where the scaler is a GradScaler and the optimizer one of FUSED_OPTIMIZERS
    built once in the file, with nothing that rules `fused` out (`foreach`,
    `differentiable`, `fused` already given, `**kwargs`)."""
    steps = [k for k in src.calls_at(c.site.line, c.end_col)
             if isinstance(k.func, ast.Attribute) and k.func.attr == "step" and k.args]
    if len(steps) != 1:
        return None
    step = steps[0]
    scaler, opt = last_name(step.func.value), last_name(step.args[0])
    if scaler is None or opt is None or not any(
            last_name(k.func) == "GradScaler" for k in src.assigned_calls(scaler)):
        return None
    built = src.assigned_calls(opt)
    classes = [_optimizer_class(src, k) for k in built]
    if len(built) != 1 or classes[0] is None:
        return None
    for k in built[0].keywords:
        if k.arg is None or k.arg == "fused":
            return None
        if k.arg in ("foreach", "differentiable") and not (
                isinstance(k.value, ast.Constant) and k.value.value in (False, None)):
            return None
    return built[0], classes[0]


def _optimizer_class(src: Source, call: ast.Call) -> str | None:
    """"AdamW" for `torch.optim.AdamW(...)`, `optim.AdamW(...)` (optim imported from torch)
    or `AdamW(...)` (imported from torch.optim, under any name); None for any other call."""
    name = dotted(call.func)
    parts = name.split(".") if name else []
    if len(parts) == 3 and parts[:2] == [src.module_alias("torch"), "optim"]:
        return parts[2] if parts[2] in FUSED_OPTIMIZERS else None
    for node in ast.walk(src.tree):
        if len(parts) == 2 and parts[1] in FUSED_OPTIMIZERS and (
                (isinstance(node, ast.ImportFrom) and node.module == "torch" and any(
                    a.name == "optim" and (a.asname or a.name) == parts[0] for a in node.names))
                or (isinstance(node, ast.Import) and any(
                    a.name == "torch.optim" and a.asname == parts[0] for a in node.names))):
            return parts[1]
        if len(parts) == 1 and isinstance(node, ast.ImportFrom) and node.module == "torch.optim":
            for a in node.names:
                if (a.asname or a.name) == parts[0] and a.name in FUSED_OPTIMIZERS:
                    return a.name
    return None


#: The expert rules, in the order analysis/rules.py registers them.
EXPERT_RULES = (FusedGradScaler, AccumulateOnDevice, BuildOnDevice, HoistInvariantUpload,
                MakeOnDevice, IndexOnce)
