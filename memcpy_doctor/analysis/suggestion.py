"""What the rules and the placement hand to renderers: one suggested edit, what it does to the
run's events (for the replay that prices it, analysis/replay.py) and what it saves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.trace import CopyRecord, OpRecord, Site

#: What an edit does to the copies in `Suggestion.removes`, as the replay plays it:
DROP = "drop"  # they no longer happen (a transfer dropped, a value kept on the device)
ONCE = "once"  # one call of each path is left (a read moved after the loop)
ASYNC = "async"  # they still happen, and the host no longer waits for them (pinned, non_blocking)
EFFECTS = (DROP, ONCE, ASYNC)

#: How a suggestion's saving was found (`Suggestion.estimate`).
REPLAYED = "replayed"  # the run's timeline replayed with the edit and without it
UPPER_BOUND = "upper bound (no timeline in this trace)"  # the host time of what it removes
RULE_OF_THUMB = "rule of thumb"  # a heuristic of the rule's own (a fraction of the run)


@dataclass
class Suggestion:
    """One edit that removes `removes` (as `effect` says), with the host time it gives back
    (`saving_ns`, found as `estimate` says).

    `saving_ns` is first the rule's own upper bound (the host time of what it removes);
    `suggest` then replaces it by the replay's figure where the trace has a timeline.
    `changes_results`: the edit changes what the program computes or prints by design (it
    logs every k steps, say), and says so in its title."""

    rule: str
    title: str
    detail: str
    sites: list[Site]
    removes: list[CopyRecord]
    saving_ns: int
    diff: str | None = None
    apply: dict[str, Any] | None = None  # what `profile --apply` reads
    exact: bool = True  # False where the estimate rests on a heuristic
    #: what re-running the program with this edit measured (`explain --verify`; a
    #: run/verify.Verified), None when it was not re-run
    verified: Any = None
    effect: str = DROP
    #: ops the edit runs on the host instead of the device (a device_guard("cpu") edit)
    moved: list[OpRecord] = field(default_factory=list)
    changes_results: bool = False
    estimate: str = UPPER_BOUND
    #: what the edit costs the host at run time where it adds work (a guard's own cost)
    cost_ns: int = 0
    #: needed whatever it costs: the run does not fit a device memory budget without it
    required: bool = False
    #: the effect on single copies of `removes` where it is not `effect` (by id of the copy)
    effects: dict[int, str] = field(default_factory=dict)
    #: why the edit comes without a diff where no line can be named (a profile without
    #: Python stacks): the advice then says what to change and what to look for
    no_diff: str | None = None

    def effect_on(self, copy: CopyRecord) -> str:
        """What the edit does to `copy`, one of EFFECTS."""
        return self.effects.get(id(copy), self.effect)
