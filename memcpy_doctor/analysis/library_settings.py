"""Library settings: copies a library makes every step because of one of its settings, and
the edit of the user's call that sets it (the keyword added to the one call of the library's
arguments in the user's file), where that library has the setting."""

from __future__ import annotations

import os

from ..core.costmodel import DeviceProfile, profile_of
from ..core.paths import format_site
from ..core.trace import CopyRecord, Trace
from .attribution import Explanation, user_site
from .edits import LineChange, calls_named, keyword_added, lines_change
from .expert_source import Source
from .steady import per_step
from .suggestion import ASYNC, Suggestion


#: Copies a library makes because of a setting it documents: (a folder or file of the
#: library, with "/" for the separator: the read's own site, or for a copy to the device any
#: frame of its stack; the copy's direction and
#: triggers; whether the source must be pinned (None: either); the library; the advice), and
#: the version of each library whose own source the setting was read in. A library not
#: listed gets no made-up setting. The reads to the host are logging: a setting that reads
#: less often changes what is logged (`changes_results`).
SETTING_VERSIONS = {"Lightning": "lightning 2.6.6", "the HF Trainer": "transformers 5.25.0",
                    "accelerate": "accelerate 1.16.0"}
LIBRARY_SETTINGS = (
    ("lightning/pytorch/", "DtoH", ("item",), None, "Lightning",
     "it reads what `self.log` records back to the host for the progress bar and the loggers: "
     "log with `on_step=False, on_epoch=True` or `prog_bar=False`, or set a larger "
     "`Trainer(log_every_n_steps=...)`"),
    ("transformers/trainer.py", "DtoH", ("bool", "item"), None,
     "the HF Trainer",
     "it checks every step's loss for nan/inf (`TrainingArguments(logging_nan_inf_filter="
     "False)` turns that off) and reads the loss every `logging_steps`"),
    ("transformers/trainer.py", "HtoD", ("to",), True,
     "the HF Trainer",
     "its batches are pinned (`dataloader_pin_memory`) but copied without non_blocking: "
     "`TrainingArguments(accelerator_config={\"non_blocking\": True})`"),
    ("accelerate/", "HtoD", ("to",), True, "accelerate",
     "the batches are pinned but copied without non_blocking: "
     "`Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))`"),
    ("accelerate/", "HtoD", ("to",), False, "accelerate",
     "the batches are copied from pageable memory, each waited for: `DataLoader("
     "pin_memory=True)` and `Accelerator(dataloader_config=DataLoaderConfiguration("
     "non_blocking=True))`"),
)


class LibrarySetting:
    """A copy a library makes every step because of one of its settings.

        self.log("loss", loss, prog_bar=True)     # Lightning reads it back every step

    The library's documented setting, at the user's call; never a patch to the library.
    """

    name = "library-setting"
    description = "Change the library setting that makes the copy"
    # (a rules.Rule by shape; analysis/rules.py registers it, as this module does not import
    # that one, which imports it)

    def match(self, trace: Trace, explanation: Explanation, cwd: str | None) -> list[Suggestion]:
        groups: dict[tuple, list] = {}  # one suggestion per library and user file: one diff
        total = trace.summary.total_ns
        for c in trace.copies:
            if not c.sync or not per_step(c, total):
                continue
            found = self._setting(c)
            user = user_site(c)
            if found is None or user is None or c.site is user:
                continue
            groups.setdefault((found[0], user.file), []).append((c, user, *found))
        profile = profile_of(trace)
        return [self._suggest(group, profile, cwd) for group in groups.values()]

    def _suggest(self, group: list, profile: DeviceProfile, cwd: str | None) -> Suggestion:
        library = group[0][2]
        user = min((g[1] for g in group), key=lambda x: x.line)
        advice = list(dict.fromkeys(g[3] for g in group))
        keywords = list(dict.fromkeys(g[4] for g in group if g[4] is not None))
        change = _setting_change(user.file, keywords, cwd) if keywords else None
        copies = [g[0] for g in group]
        # (a setting that pins pageable batches costs the host their pinning: DataLoader's
        # main thread pins where num_workers=0, as a user's DataLoader usually has it)
        pinning = sum(profile.pin_ns(c.bytes // max(c.calls, 1)) * c.calls for c in copies
                      if c.direction == "HtoD" and not c.pinned)
        logged = any(c.direction == "DtoH" for c in copies)  # (the reads are the logging)
        kinds = sorted({"reads to the host" if c.direction == "DtoH" else
                        "copies to the device" for c in copies})
        said = "; ".join(f"{sum(c.calls for c in copies if c.direction == d)} {d} copies"
                         for d in ("DtoH", "HtoD") if any(c.direction == d for c in copies))
        return Suggestion(
            rule=self.name,  # (the title tells one library from another: see suggest)
            title=f"change {library}'s setting{'s' * (len(kinds) > 1)} for its "
                  f"{' and '.join(kinds)} every step "
                  f"(under {format_site(user, cwd)})"
                  + (", which changes what is logged" if logged else ""),
            detail=(f"{said} inside {library}; " + "; ".join(advice)
                    + f" (the settings as read in {SETTING_VERSIONS[library]})"),
            sites=[user], removes=copies, saving_ns=sum(c.host_ns for c in copies) - pinning,
            exact=change is not None, changes_results=logged, cost_ns=pinning,
            effects={id(c): ASYNC for c in copies if c.direction == "HtoD"},  # (non_blocking)
            diff=change[0] if change else None, apply=change[1] if change else None)

    @staticmethod
    def _setting(c: CopyRecord) -> tuple[str, str, tuple[str, str] | None] | None:
        files = [s.file.replace(os.sep, "/") for s in (c.site, *c.stack) if s is not None]
        for where, direction, triggers, pinned, library, advice in LIBRARY_SETTINGS:
            # a read is the library's own where the library's code makes it (a model's
            # `mask.all()` called under the Trainer is not the Trainer's loss check); a copy to
            # the device, where the library is anywhere in its stack (it calls a helper)
            mine = files[:1] if direction == "DtoH" else files
            if (c.direction == direction and c.trigger in triggers
                    and (pinned is None or bool(c.pinned) == pinned)
                    and any(where in f for f in mine)):
                return library, advice, SETTING_EDITS.get((where, direction))
        return None


#: The settings an edit can make: where the user's file builds the library's arguments (one
#: call of that name), the keyword that sets it (not made where the call sets it already).
SETTING_EDITS = {
    ("transformers/trainer.py", "DtoH"): ("TrainingArguments", "logging_nan_inf_filter=False"),
    ("transformers/trainer.py", "HtoD"): ("TrainingArguments",
                                          'accelerator_config={"non_blocking": True}'),
}


def _setting_change(path: str, edits: list[tuple[str, str]],
                    cwd: str | None) -> LineChange | None:
    """The keywords of `edits` added to the one call of their name (one name: the same
    library's arguments) in the user's file `path`."""
    source = Source.read(path)
    if source is None or len({name for name, _ in edits}) != 1:
        return None
    calls = calls_named(source.tree, edits[0][0])
    keywords = {kw.split("=", 1)[0] for _, kw in edits}
    if len(calls) != 1 or any(k.arg in keywords or k.arg is None for k in calls[0].keywords):
        return None  # (none, several, set already, or **kwargs that may set it)
    line, new = keyword_added(calls[0], source, ", ".join(kw for _, kw in edits))
    return lines_change(path, {line: new}, cwd)
