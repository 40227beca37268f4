"""`explain --verify SCRIPT [ARGS]`: prove explain's suggestions by re-running the program with
each one applied.

The program is profiled twice as written, then once per suggestion with an edit that
`profile --apply` can make (a device_guard edit, or a one-line edit), one at a time, each in a
fresh process, as a user would run `profile --apply`. Each such suggestion gets the measured
change next to its estimate: its sync copy calls and total time before and after (the total
modeled on the simulated GPU, so it does not vary between runs), and whether the program's
output (its stdout) and exit status stayed the same. The two runs as written tell which
printed lines vary from run to run (a wall-clock time, an address, a random seed): those
lines are not compared (`first_difference`).

A suggestion is "verified" when the sync calls and the total both fell: it stays in the
list. A race's fix (analysis/races.py) is verified when the copies raced fell, whatever the
wait it adds costs; any other edit that makes a race is worse. It "did not help" when neither got worse but one of them did not fall: it moves to
`tried`, with its figures. It is dropped when either got worse, when the edited program
ended otherwise (an error: the edit broke it, or another exit status), or when it printed
something else, unless the suggestion says it changes the results by design
(`Suggestion.changes_results`: its verdict then says the output changed). Suggestions
without such an edit (advice at a call, a library's setting) are kept, unverified. Nothing
here prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from ..analysis.attribution import Explanation, explain
from ..analysis.races import RaceFix
from ..analysis.replay import joint_saving
from ..analysis.rules import suggest
from ..analysis.suggestion import Suggestion
from ..core.trace import Trace, TraceError
from .traces import InputError

#: The most characters of a printed line a verdict quotes.
QUOTED_CHARS = 40


@dataclass(frozen=True)
class OutputChange:
    """The first line of stdout where the edited program printed something else. `line`
    counts from 1; `before` or `after` is None where that run printed no such line."""

    line: int
    before: str | None
    after: str | None

    def __str__(self) -> str:
        return f"line {self.line}: {_quote(self.before)} -> {_quote(self.after)}"


def _quote(text: str | None) -> str:
    if text is None:
        return "(no line)"
    if len(text) > QUOTED_CHARS:
        text = text[:QUOTED_CHARS - 3] + "..."
    return repr(text)


def first_difference(before: list[str], again: list[str],
                     after: list[str]) -> OutputChange | None:
    """The first line where `after` (the edited run's stdout, as lines) differs from `before`
    (the run as written), not counting the lines where `again` (the run as written, once
    more) differs from `before`: they vary from run to run. Where `before` and `again` have
    as many lines, a different count of lines in `after` is a difference; where they do not,
    the lines past the shorter one vary too."""
    stable = min(len(before), len(again))
    varying = {i for i in range(stable) if before[i] != again[i]}
    for i in range(min(stable, len(after))):
        if i not in varying and after[i] != before[i]:
            return OutputChange(i + 1, before[i], after[i])
    if len(after) < stable or (len(before) == len(again) and len(after) != len(before)):
        i = min(len(before), len(after))
        return OutputChange(i + 1, before[i] if i < len(before) else None,
                            after[i] if i < len(after) else None)
    return None


@dataclass(frozen=True)
class Verified:
    """What re-running with one suggestion applied measured. `output`: the first line the
    edited run printed otherwise (None: the same output); `changes_results`: the suggestion
    says its edit changes the output, so a changed output does not reject it."""

    sync_calls: tuple[int, int]  # before, after
    total_ns: tuple[int, int]
    ended: tuple[str, str] = ("completed, exit status 0", "completed, exit status 0")
    output: OutputChange | None = None
    changes_results: bool = False
    #: copies raced, before and after; `fixes_race`: the suggestion is a race's fix, judged
    #: by the races it removes (it adds a wait: its time is its cost, not a regression)
    races: tuple[int, int] = (0, 0)
    fixes_race: bool = False

    @property
    def saving_ns(self) -> int:
        """The total time the edit gave back (negative: it cost)."""
        return self.total_ns[0] - self.total_ns[1]

    @property
    def broke(self) -> bool:
        """The edited program ended otherwise (an error, another exit status)."""
        return self.ended[1] != self.ended[0]

    @property
    def changed_output(self) -> bool:
        """It printed something else, and the suggestion did not say it would."""
        return self.output is not None and not self.changes_results

    @property
    def rejected(self) -> bool:
        """The edit changed what the program does: its figures mean nothing."""
        return self.broke or self.changed_output

    @property
    def worse(self) -> bool:
        if self.fixes_race:
            return self.rejected or self.races[1] >= self.races[0]
        return (self.rejected or self.sync_calls[1] > self.sync_calls[0]
                or self.total_ns[1] > self.total_ns[0] or self.races[1] > self.races[0])

    @property
    def helped(self) -> bool:
        if self.fixes_race:
            return not self.worse
        return (not self.worse and self.sync_calls[1] < self.sync_calls[0]
                and self.total_ns[1] < self.total_ns[0])

    @property
    def outcome(self) -> str:
        """What the re-run found, in a few words."""
        if self.broke:
            return f"broke the program (it ended: {self.ended[1]}; as written: {self.ended[0]})"
        if self.changed_output:
            return f"changed the program's output ({self.output})"
        return "verified" if self.helped else "made it worse" if self.worse else "did not help"

    @property
    def note(self) -> str:
        """What else to know: the output changed, as the suggestion said it would."""
        if self.output is None or not self.changes_results:
            return ""
        return f"its output changed, as its title says ({self.output})"

    @property
    def verdict(self) -> str:
        return f"{self.outcome}; {self.note}" if self.note else self.outcome


@dataclass
class Verification:
    trace: Trace  # the run as written
    explanation: Explanation
    kept: list[Suggestion]  # verified, or without an edit to re-run (`.verified` None)
    tried: list[Suggestion]  # re-run: did not help
    dropped: list[Suggestion]  # re-run: worse, or it changed what the program does
    not_worth_it: list[Suggestion]  # estimated to save nothing: not re-run


def verify(target: list[str], args: list[str], device: str, cwd: str) -> Verification:
    """Profile the program (`target`: [SCRIPT], or ["-m", MODULE]) with ARGS, then re-run it
    with each suggestion applied (module docstring). InputError when a run leaves no trace
    (the program could not start, say)."""
    with tempfile.TemporaryDirectory(prefix="memcpy-doctor-verify-") as tmp:
        before, printed = _profile(target, args, device, os.path.join(tmp, "before.json"), None)
        _, again = _profile(target, args, device, os.path.join(tmp, "again.json"), None)
        explanation = explain(before)
        kept, tried, dropped, aside = [], [], [], []
        for i, s in enumerate(suggest(before, explanation, cwd, not_worth_it=aside)):
            if s.apply is None:
                kept.append(s)
                continue
            edit = os.path.join(tmp, f"edit{i}.json")
            with open(edit, "w", encoding="utf-8") as f:
                json.dump({"suggestions": [{"apply": s.apply}]}, f)
            after, edited = _profile(target, args, device,
                                     os.path.join(tmp, f"after{i}.json"), edit)
            s.verified = Verified((before.summary.memcpy_sync.calls,
                                   after.summary.memcpy_sync.calls),
                                  (before.summary.total_ns, after.summary.total_ns),
                                  (_ending(before), _ending(after)),
                                  first_difference(printed, again, edited),
                                  s.changes_results, (_raced(before), _raced(after)),
                                  s.rule == RaceFix.name)
            (kept if s.verified.helped else dropped if s.verified.worse else tried).append(s)
    explanation.together = joint_saving(before, kept)  # (what is left, replayed together)
    return Verification(before, explanation, kept, tried, dropped, aside)


def _raced(trace: Trace) -> int:
    return sum(r.calls for r in trace.races)


def _ending(trace: Trace) -> str:
    return f"{trace.meta.ended_by}, exit status {trace.meta.exit_status}"


def _profile(target: list[str], args: list[str], device: str, out: str,
             apply: str | None) -> tuple[Trace, list[str]]:
    """One `memcpy-doctor profile` run in its own process: its trace, and the lines the
    script printed on stdout (`--no-report` keeps memcpy-doctor's own messages on stderr)."""
    command = [sys.executable, "-m", "memcpy_doctor", "profile", "--no-report",
               "--device", device, "-o", out]
    if apply is not None:
        command += ["--apply", apply]
    done = subprocess.run(command + [*target, *args], capture_output=True, text=True)
    try:
        return Trace.load(out), done.stdout.splitlines()
    except TraceError:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise InputError(f"--verify: {' '.join(target)} left no trace ({tail[0]})") from None
