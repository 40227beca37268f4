"""Suggestions: small rule classes, one per kind of finding, each with the edit it proposes
and the time it saves.

A rule's docstring shows the code it catches. Each suggestion says what its edit does to the
run (`Suggestion.effect`, `moved`, `cost_ns`), and `suggest` prices it by replaying the
run's timeline with the edit and without it (analysis/replay.py). A rule's own figure
(`estimate_saving`) is the upper bound, used where the trace has no timeline: a removed sync
copy gives back the host time it blocked (its wait for the device included, which a device
kept busy would not give back), an op moved to the host costs what it took on the CPU
(modeled by the host roofline on the simulated GPU, docs/sim-time.md) instead of its launch,
and a device_guard edit costs what the guard itself does at run time (the cost model's
figures). An edit that costs more than it saves is not proposed.
"""

from __future__ import annotations

import abc
import ast
import re
from typing import ClassVar

from ..core.trace import CopyRecord, OpRecord, Site, Trace
from .attribution import Chain, Explanation, read_line
from ..core.paths import format_site, is_user_file
from .edits import LineChange, drop_transfer_change, guard_cost_ns, guard_diff
from .expert_source import Source
from .placement_graph import placement_suggestions
from .steady import per_step
from .compile_rules import graph_break_suggestions
from .replay import Replay, price
from .suggestion import ONCE, Suggestion
from .why_none import no_suggestions_reason


def estimate_saving(trace: Trace, removed: list[CopyRecord],
                    moved_to_host: list[OpRecord] = (), guarded: bool = True) -> int:
    """Host time given back: the removed copies' host time, plus, for each op moved to the
    host, what it cost the host on the device (its launches) less what it takes on the CPU,
    less, when a device_guard moves them (`guarded`), what the guard costs (may be
    negative: a cost)."""
    saving = sum(c.host_ns for c in removed)
    for op in moved_to_host:
        saving += op.host_ns - op.run_ns
    return saving - guard_cost_ns(moved_to_host) if guarded else saving


class Rule(abc.ABC):
    """One kind of finding. `match` returns its suggestions for a trace."""

    name: ClassVar[str]
    description: ClassVar[str]

    @abc.abstractmethod
    def match(self, trace: Trace, explanation: Explanation,
              cwd: str | None) -> list[Suggestion]:
        """The suggestions this rule makes for `trace` (paths shown relative to `cwd`)."""


RULES: list[type[Rule]] = []


def register(*rules: type[Rule]) -> type[Rule]:
    """Add rules to RULES (`@register` on a class): each last, or, where it names a rule
    already registered in its class attribute `before`, just before that one, so that it
    claims first the copies both would remove (`suggest`)."""
    for cls in rules:
        before = getattr(cls, "before", None)
        names = [r.name for r in RULES]
        if before is not None and before not in names:
            raise ValueError(f"rule {cls.name!r} goes before {before!r}, not registered")
        RULES.insert(names.index(before) if before is not None else len(RULES), cls)
    return rules[-1]


def _ops_at(trace: Trace, sites: set[Site], device_only: bool = True) -> list[OpRecord]:
    return [o for o in trace.ops if o.site in sites and (o.device != "cpu" or not device_only)]


@register
class HostRoundTrip(Rule):
    """Data made on the host goes to the device for an op, then straight back.

        shape = torch.tensor(x.shape)      # made on the host
        shape = shape.to("cuda")[0:4]      # HtoD, waited for; the slice runs on the device
        sizes = shape.tolist()             # DtoH, waited for

    Run the op(s) in between on the host (`device_guard("cpu")`): both copies go.
    """

    name = "host-round-trip"
    description = "Run the ops between a host->device->host bounce on the host"

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        out = []
        for chain in explanation.chains:
            if not chain.bounces or chain.steps[0].copy.direction != "HtoD":
                continue
            sites = {m.site for m in chain.middle if m.site is not None}
            if not sites or not all(is_user_file(s.file) for s in sites):
                continue  # (no edit goes into a library's code)
            removed = [s.copy for s in chain.steps]
            moved = _ops_at(trace, sites)
            upload = chain.steps[0].copy
            plain = (drop_transfer_change(upload.site, cwd, upload.end_col)
                     if upload.trigger in ("to", "cuda")
                     and upload.site is not None and is_user_file(upload.site.file)
                     and not _reads_device_data(trace, chain) else None)
            if plain is not None:  # the program's own `.to(device)`, which a guard runs as
                suggestion = self._plain(trace, chain, upload, removed, moved, plain, cwd)
            else:  # written: the plain edit is the only one that removes the copies
                suggestion = self._suggest(trace, chain, sites, removed, moved, cwd)
            out.append(suggestion)  # (suggest sets aside one whose guard costs too much)
        return out

    def _plain(self, trace: Trace, chain: Chain, upload: CopyRecord,
               removed: list[CopyRecord], moved: list[OpRecord], change: LineChange,
               cwd: str | None) -> Suggestion:
        ops = ", ".join(sorted({m.op for m in chain.middle}))
        return Suggestion(
            rule=self.name,
            title=f"keep the data for {ops} on the host: drop the `{upload.trigger}` at "
                  f"{format_site(upload.site, cwd)}",
            detail=("its input comes from the host and its output goes back to the host; "
                    f"on the host it needs neither of the {len(removed)} copies "
                    f"({sum(c.calls for c in removed)} calls), if nothing else needs that "
                    "data on the device (plain PyTorch: nothing from memcpy-doctor at run time)"),
            sites=[upload.site], removes=removed,
            saving_ns=estimate_saving(trace, removed, moved, guarded=False),
            diff=change[0], apply=change[1], moved=moved)

    def _suggest(self, trace: Trace, chain: Chain, sites: set[Site],
                 removed: list[CopyRecord], moved: list[OpRecord],
                 cwd: str | None) -> Suggestion:
        ordered = sorted(sites, key=lambda s: (s.file, s.line))
        diffs = [guard_diff(f, [s.line for s in ordered if s.file == f], "cpu", cwd)
                 for f in sorted({s.file for s in ordered})]
        ops = ", ".join(sorted({m.op for m in chain.middle}))
        where = ", ".join(format_site(s, cwd) for s in ordered)
        guard_ns = guard_cost_ns(moved)
        return Suggestion(
            rule=self.name,
            title=f"run {ops} on the host with device_guard(\"cpu\") at {where}",
            detail=("its input comes from the host and its output goes back to the host; "
                    f"on the host it needs neither of the {len(removed)} copies "
                    f"({sum(c.calls for c in removed)} calls); the guard's own cost on a real "
                    f"GPU, about {guard_ns / 1e6:.2g} ms here, is counted"),
            sites=ordered, removes=removed,
            saving_ns=estimate_saving(trace, removed, moved),
            diff="".join(d for d in diffs if d) or None,
            apply={"kind": "device_guard", "device": "cpu",
                   "sites": [{"file": s.file, "line": s.line} for s in ordered]},
            moved=moved, cost_ns=guard_ns)


def _reads_device_data(trace: Trace, chain: Chain) -> bool:
    """Whether an op between the chain's copies also reads data made on the device: then
    only a guard, which moves every input, keeps it on the host; dropping the one transfer
    would mix devices."""
    middle = {(m.op, m.site) for m in chain.middle}
    return any((f.consumer.op, f.consumer.site) in middle and f.producer.device != "cpu"
               for f in trace.flows)


def _periodic(c: CopyRecord) -> bool:
    """Whether the read's statement runs under an `if` inside its loop (`if step % 10 == 0:
    print(loss.item())`): it is read every k steps already, by the program's choice."""
    source = Source.read(c.site.file)
    if source is None:
        return False
    calls = source.calls_at(c.site.line, c.end_col)
    if not calls:
        return False
    for a in source.ancestors(calls[0]):
        if isinstance(a, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef)):
            return False
        if isinstance(a, ast.If):
            return True
    return False


#: A statement that branches on a value: `if`, `elif`, `while`, and a conditional expression.
_BRANCH = re.compile(r"^(if|elif|while)\b|\bif\b.*\belse\b")


@register
class DeviceValueBranch(Rule):
    """A branch on a device value, taken every step.

        while x.abs().max() > tol:         # the host waits for the device each time round
        if torch.isnan(loss).any():        # ... and here every step

    Test it every k steps, or keep the decision on the device (`torch.where`,
    `torch.nan_to_num`, `torch.cond`) so the host need not wait.
    """

    name = "device-value-branch"
    description = "Branch on a device value less often, or keep the decision on the device"
    TRIGGERS = ("bool", "item", "float", "int")

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        out = []
        for c in trace.copies:
            if c.direction != "DtoH" or not c.sync or c.trigger not in self.TRIGGERS:
                continue
            if c.site is None or not is_user_file(c.site.file) or c.calls < 2:
                continue  # (a branch whose line ran twice or more is in a loop)
            line = read_line(c.site)
            if not _BRANCH.search(line):
                continue
            kind = "loop condition" if line.startswith("while") else "branch"
            out.append(Suggestion(
                rule=self.name,
                title=f"test the device value less often at {format_site(c.site, cwd)} "
                      "(changes when the branch is taken)",
                detail=(f"the {kind} `{line}` waits for the device {c.calls} times; test it "
                        "every k steps (the loop may run up to k - 1 steps more, so results "
                        "can change), or keep the decision on the device (torch.where, "
                        "torch.nan_to_num, torch.cond: the same results)"),
                sites=[c.site], removes=[c], saving_ns=c.host_ns * (c.calls - 1) // c.calls,
                exact=False, effect=ONCE, changes_results=True))
        return out


@register
class HostReadInLoop(Rule):
    """A value read back to the host on every iteration.

        for batch in loader:
            total += loss.item()           # the host waits for the device every step

    Keep it on the device (`total += loss.detach()`) and read it once after the loop.
    """

    name = "host-read-in-loop"
    description = "Accumulate on the device and read once after the loop"
    TRIGGERS = ("item", "float", "int", "format", "print", "tolist")

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        out = []
        for c in trace.copies:
            if c.direction != "DtoH" or not c.sync or c.trigger not in self.TRIGGERS:
                continue
            if c.site is None or not per_step(c, trace.summary.total_ns):
                continue  # (two reads on one line, or in one burst, are not a loop)
            if not self._read_here(c) or _periodic(c):
                continue
            where = format_site(c.site, cwd)
            line = read_line(c.site)
            printed = "print(" in line or "log" in line  # (the value is the output: each)
            title, how = ((f"print the device value every k steps, not {c.calls} times, at "
                           f"{where} (changes what is printed)", "to print or log it, and "
                           "the host waits each time") if printed else
                          (f"read once after the loop instead of {c.calls} times at {where}",
                           "and the host waits each time; accumulate on the device "
                           "(x.detach()) and read once"))
            out.append(Suggestion(
                rule=self.name, title=title,
                detail=f"`{c.trigger}` reads a device value {c.calls} times {how}",
                sites=[c.site], removes=[c], saving_ns=c.host_ns * (c.calls - 1) // c.calls,
                effect=ONCE, exact=not printed, changes_results=printed))
        return out

    #: How each trigger is written where the user's code reads the value itself.
    SPELLED = {"item": (".item(",), "float": ("float(",), "int": ("int(",),
               "print": ("print(",), "tolist": (".tolist(",), "format": ("format(", "{", "%")}

    def _read_here(self, c: CopyRecord) -> bool:
        """The user's own line reads the value (not a call into a library or torch that
        reads it inside, such as GradScaler.step deciding whether to skip the step)."""
        if not is_user_file(c.site.file):
            return False
        line = read_line(c.site)
        return not line or any(word in line for word in self.SPELLED[c.trigger])


@register
class DataDependentShape(Rule):
    """An op whose output size depends on the data reads a count back to the host.

        idx = torch.nonzero(mask)          # the host waits to learn the size
        s = x[mask].sum()                  # ... and here

    Each replacement keeps results only under a condition, which the advice states:
    `torch.where(mask, x, 0)` has the same sum as `x[mask]` (not the same elements, so it is
    proposed only where the line reduces the masked tensor by `.sum()` at once; fed to a
    loss, an index or a shape it would change results); `torch.nonzero_static(mask, size=N)`
    and `repeat_interleave(..., output_size=N)` only where N is a known bound. A copy whose
    line does not make the data-dependent op (a backward pass that replays it) gets nothing.
    """

    name = "data-dependent-shape"
    description = "Avoid data-dependent output sizes (where, nonzero_static, output_size)"
    TRIGGERS = ("nonzero", "mask", "unique", "repeat_interleave", "bincount")
    #: What the line must show for the copy to be its own (not a backward pass's).
    SPELLED = {"nonzero": ("nonzero", "where(", "argwhere"), "mask": ("[",),
               "unique": ("unique",), "repeat_interleave": ("repeat_interleave",),
               "bincount": ("bincount",)}
    HINTS = {"nonzero": "torch.nonzero_static(x, size=N), which keeps results only where N "
                        "is a known bound on the count (it pads past it)",
             "unique": "a known bound, or keep the result on the device",
             "repeat_interleave": "repeat_interleave(..., output_size=N), with N known "
                                  "without reading the device (the same result)",
             "bincount": "bincount(..., minlength=N) still reads the maximum: keep the "
                         "counts on the device where a bound N is known (scatter_add_ into "
                         "zeros(N))"}

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        out = []
        for c in trace.copies:
            if c.direction != "DtoH" or not c.sync or c.trigger not in self.TRIGGERS:
                continue
            if c.site is None or not is_user_file(c.site.file):
                continue
            line = read_line(c.site)
            if line and not any(w in line for w in self.SPELLED[c.trigger]):
                continue  # (another line's op, replayed here: a backward pass)
            if c.trigger == "mask":
                if not _MASKED_SUM.search(line):
                    continue  # (its elements are used: no same-shape form keeps results)
                hint = ("torch.where(mask, x, 0).sum() for x[mask].sum(): the same sum, "
                        "with no count to read, where mask has x's shape")
            else:
                hint = self.HINTS[c.trigger]
            out.append(Suggestion(
                rule=self.name,
                title=f"avoid the data-dependent size at {format_site(c.site, cwd)}",
                detail=f"{c.calls} host waits to learn an output size; use {hint}",
                sites=[c.site], removes=[c], saving_ns=c.host_ns, exact=False))
        return out


#: `x[mask].sum()` with nothing between the index and the sum.
_MASKED_SUM = re.compile(r"\w\[[^\[\]]+\]\.sum\(\)")


def suggest(trace: Trace, explanation: Explanation, cwd: str | None = None,
            device_memory_bytes: int | None = None,
            not_worth_it: list[Suggestion] | None = None,
            replay: Replay | None = None) -> list[Suggestion]:
    """Every rule's suggestions: those for copies made every step first, edits of the user's
    own code before a library's settings, each group largest estimated saving first; one per
    distinct edit (the copy paths one edit removes merged into it) and none that saves
    nothing. A copy is claimed by the first (most specific) rule that removes it. Each is
    priced by replaying the run's timeline with its edit (analysis/replay.py; the rule's
    upper bound where the trace has none). The placement (a minimum cut over the op graph)
    comes first under a device memory budget, last otherwise. Edits considered but estimated
    to save nothing go to `not_worth_it`. Where no edit is left, `explanation` gets the
    reason (`no_suggestions_reason`, analysis/why_none.py)."""
    placed = placement_suggestions(trace, device_memory_bytes, cwd)[1]
    batches = [placed] if device_memory_bytes is not None else []
    batches.append(graph_break_suggestions(trace, cwd))  # a compiled program's breaks first
    batches += [rule().match(trace, explanation, cwd) for rule in RULES]
    if device_memory_bytes is None:
        batches.append(placed)
    found: list[Suggestion] = []
    aside: list[Suggestion] = []
    claimed: set[int] = set()
    same_edit: dict[tuple, Suggestion] = {}  # one suggestion per distinct edit
    merged: set[int] = set()
    for batch in batches:
        for s in batch:
            if any(id(c) in claimed for c in s.removes):
                continue
            if s.saving_ns <= 0 and not s.required:  # (the rule's bound: nothing to gain)
                aside.append(s)
                continue
            claimed.update(id(c) for c in s.removes)
            key = (s.rule, s.diff if s.diff is not None else s.title)
            first = same_edit.get(key)
            if first is None:
                same_edit[key] = s
                found.append(s)
            else:  # another copy path the same edit removes: its calls and saving join in
                first.removes = first.removes + s.removes
                first.moved = first.moved + [o for o in s.moved if o not in first.moved]
                first.saving_ns += s.saving_ns
                merged.add(id(first))
    for s in found:
        if id(s) in merged:
            s.detail += (f" (this edit removes {len(s.removes)} copy paths, "
                         f"{sum(c.calls for c in s.removes)} calls)")
    replay = replay or Replay(trace)
    price(trace, found + aside, replay)  # (what is set aside shows its figure too)
    aside += [s for s in found if s.saving_ns <= 0 and not s.required]
    found = [s for s in found if s.saving_ns > 0 or s.required]
    explanation.no_suggestions_reason = (None if found else no_suggestions_reason(
        trace, explanation, aside, DataDependentShape.TRIGGERS))
    if not_worth_it is not None:
        for s in aside:
            if s.title not in {x.title for x in not_worth_it}:
                not_worth_it.append(s)
    total = trace.summary.total_ns  # what repeats every step first, then setup; in each,
    found.sort(key=lambda s: (  # what the user's own code does before what a library does
        not s.required,  # (what the run needs to fit the device before anything)
        not any(per_step(c, total) for c in s.removes),
        not all(is_user_file(x.file) for x in s.sites) or s.rule == "library-setting",
        -s.saving_ns))
    return found


# The library settings, pinning and expert rules (analysis/library_settings.py, pinning.py,
# expert_rules.py) import nothing from this module (no import cycle): registered here, last,
# each expert rule before the rule its `before` names.
from .library_settings import LibrarySetting  # noqa: E402
from .pinning import PinnedNonBlocking  # noqa: E402
from .expert_rules import EXPERT_RULES  # noqa: E402
from .races import RaceFix  # noqa: E402
register(LibrarySetting, PinnedNonBlocking, RaceFix)
register(*EXPERT_RULES)

