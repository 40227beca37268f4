"""`explain --verify SCRIPT [ARGS]`: prove explain's suggestions by re-running the program with
each one applied.

The program is profiled once as written, then once per suggestion with an edit that
`profile --apply` can make (a device_guard edit, or a one-line edit), one at a time, each in a
fresh process, as a user would run `profile --apply`. Each such suggestion gets the measured
change next to its estimate: its sync copy calls and total time before and after (the total
modeled on the simulated GPU, so it does not vary between runs). It is "verified" when the
sync calls fell and the total did not grow, "did not help" when neither got better, and it is
dropped when either got worse or the edited program ended otherwise than the original (an
error: the edit broke it). Suggestions without such an edit (advice at a call, a
library's setting) are kept, unverified. Nothing here prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from ..analysis.attribution import Explanation, explain
from ..analysis.rules import suggest
from ..analysis.suggestion import Suggestion
from ..core.trace import Trace, TraceError
from .traces import InputError


@dataclass(frozen=True)
class Verified:
    """What re-running with one suggestion applied measured."""

    sync_calls: tuple[int, int]  # before, after
    total_ns: tuple[int, int]
    ended: tuple[str, str] = ("completed", "completed")  # how each run ended

    @property
    def broke(self) -> bool:
        """The edited program ended otherwise (an error, say): its figures mean nothing."""
        return self.ended[1] != self.ended[0]

    @property
    def worse(self) -> bool:
        return (self.broke or self.sync_calls[1] > self.sync_calls[0]
                or self.total_ns[1] > self.total_ns[0])

    @property
    def verdict(self) -> str:
        if self.broke:
            return f"broke the program (it ended: {self.ended[1]})"
        helped = self.sync_calls[1] < self.sync_calls[0] and not self.worse
        return "verified" if helped else "made it worse" if self.worse else "did not help"


@dataclass
class Verification:
    trace: Trace  # the run as written
    explanation: Explanation
    kept: list[Suggestion]  # each with `.verified` set where it was re-run
    dropped: list[Suggestion]  # re-run, and worse
    not_worth_it: list[Suggestion]  # estimated to save nothing: not re-run


def verify(script: str, args: list[str], device: str, cwd: str) -> Verification:
    """Profile SCRIPT ARGS, then re-run it with each suggestion applied (module docstring).
    InputError when a run leaves no trace (the program could not start, say)."""
    with tempfile.TemporaryDirectory(prefix="memcpy-doctor-verify-") as tmp:
        before = _profile(script, args, device, os.path.join(tmp, "before.json"), None)
        explanation = explain(before)
        kept, dropped, aside = [], [], []
        for i, s in enumerate(suggest(before, explanation, cwd, not_worth_it=aside)):
            if s.apply is None:
                kept.append(s)
                continue
            edit = os.path.join(tmp, f"edit{i}.json")
            with open(edit, "w", encoding="utf-8") as f:
                json.dump({"suggestions": [{"apply": s.apply}]}, f)
            after = _profile(script, args, device, os.path.join(tmp, f"after{i}.json"), edit)
            s.verified = Verified((before.summary.memcpy_sync.calls,
                                   after.summary.memcpy_sync.calls),
                                  (before.summary.total_ns, after.summary.total_ns),
                                  (_ending(before), _ending(after)))
            (dropped if s.verified.worse else kept).append(s)
    return Verification(before, explanation, kept, dropped, aside)


def _ending(trace: Trace) -> str:
    return f"{trace.meta.ended_by}, exit status {trace.meta.exit_status}"


def _profile(script: str, args: list[str], device: str, out: str, apply: str | None) -> Trace:
    """One `memcpy-doctor profile` run in its own process; the script's output is dropped."""
    command = [sys.executable, "-m", "memcpy_doctor", "profile", "--no-report",
               "--device", device, "-o", out]
    if apply is not None:
        command += ["--apply", apply]
    done = subprocess.run(command + [script, *args], capture_output=True, text=True)
    try:
        return Trace.load(out)
    except TraceError:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise InputError(f"--verify: {script} left no trace ({tail[0]})") from None
