"""An expert rule for a tensor made on the host only to be copied to the device
(`MakeOnDevice`): make it there.

Registered by analysis/rules.py (EXPERT_RULES in analysis/expert_rules.py) before the rule
named by its `before`, so that it claims first the copies both would remove.
"""

from __future__ import annotations

import ast
from typing import ClassVar

from ..core.costmodel import profile_of
from ..core.paths import format_site
from ..core.trace import CopyRecord, Trace
from .attribution import Explanation
from .edits import lines_change
from .expert_source import Source, source_cache, user_copies
from .suggestion import DROP, Suggestion

#: Factories whose values do not depend on where they are made.
SAME_VALUES = frozenset({"zeros", "ones", "full", "empty", "arange", "linspace", "logspace",
                         "eye"})
#: Factories that draw random numbers: on the device, from its generator (other numbers).
RANDOM = frozenset({"rand", "randn", "randint", "randperm", "normal"})


class MakeOnDevice:
    """A tensor made on the host by a torch factory and copied to the device at once.

        noise = torch.randn(x.shape).to(device)      # made on the host, copied, waited for
        mask = torch.ones(n, n).to(device)

    Make it on the device: `torch.randn(x.shape, device=device)`. No copy; the device fills
    it (one kernel, which the saving counts). `zeros`, `ones`, `full`, `arange`, ... give the
    same values; `rand`, `randn`, `randint`, `randperm` draw from the device's generator,
    other numbers than the host's, which the title says (changes_results). Not proposed
    where the factory is given a `generator=` (a host generator cannot draw on the device),
    a `device=` or `out=`, or the `.to` converts more than the device.
    """

    name = "make-on-device"
    description = "Make a tensor on the device instead of making it on the host and copying it"
    before: ClassVar[str] = "pinned-non-blocking"

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        read = source_cache()
        profile = profile_of(trace)
        out = []
        for _, c in user_copies(trace, "HtoD", ("to", "cuda")):
            src = read(c.site.file)
            found = _factory_then_to(src, c) if src is not None else None
            if found is None:
                continue
            name, new_line = found
            change = lines_change(src.path, {c.site.line: new_line}, cwd)
            if change is None:
                continue
            random = name in RANDOM
            out.append(Suggestion(
                rule=self.name,
                title=f"make the `torch.{name}` tensor on the device at "
                      f"{format_site(c.site, cwd)} instead of copying it there"
                      + (" (random numbers drawn on the device: other numbers)"
                         if random else ""),
                detail=(f"{c.calls} copies of {c.bytes // max(c.calls, 1)} bytes made on the "
                        f"host by torch.{name} and copied at once, each waited for; made with "
                        "device=, the device fills it and no copy is made"
                        + ("; its random numbers then come from the device's generator"
                           if random else "; the same values")),
                sites=[c.site], removes=[c], saving_ns=c.host_ns - c.calls * profile.launch_ns,
                diff=change[0], apply=change[1], effect=DROP,
                cost_ns=c.calls * profile.launch_ns, changes_results=random))
        return out


def _factory_then_to(src: Source, c: CopyRecord) -> tuple[str, str] | None:
    """(the factory's name, the line rewritten) for `torch.F(ARGS).to(DEVICE)` or
    `.cuda()` made on one line at the copy's site; None where it is not that shape."""
    torch = src.module_alias("torch")
    for call in src.calls_at(c.site.line, c.end_col):
        func = call.func
        if (not isinstance(func, ast.Attribute) or func.attr not in ("to", "cuda")
                or call.lineno != call.end_lineno):
            continue
        made = func.value
        if not (isinstance(made, ast.Call) and isinstance(made.func, ast.Attribute)
                and isinstance(made.func.value, ast.Name) and made.func.value.id == torch
                and made.func.attr in SAME_VALUES | RANDOM):
            continue
        if any(k.arg in ("generator", "device", "out", None) for k in made.keywords):
            return None
        device = _device_only(src, call)
        if device is None:
            return None
        inner = src.segment(made)[:-1].rstrip()  # (without its ")")
        sep = "" if inner.endswith("(") else ", "
        text = f"{inner}{sep}device={device})"
        return made.func.attr, src.splice(c.site.line, call.col_offset, call.end_col_offset,
                                          text)
    return None


def _device_only(src: Source, call: ast.Call) -> str | None:
    """The device a `.to(...)` / `.cuda()` call names, as written, where it names nothing
    else (no dtype, no copy=); `"cuda"` for `.cuda()`."""
    if call.func.attr == "cuda":
        return '"cuda"' if not call.args and not call.keywords else None
    kws = [k for k in call.keywords if k.arg != "non_blocking"]
    if len(call.args) == 1 and not kws:
        arg = call.args[0]
    elif not call.args and len(kws) == 1 and kws[0].arg == "device":
        arg = kws[0].value
    else:
        return None
    if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and \
            arg.value.id == src.module_alias("torch"):
        return None  # (torch.float16: a dtype)
    return src.segment(arg)
