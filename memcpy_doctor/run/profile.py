"""`memcpy-doctor profile` below its options: check what was asked before anything runs, run the
script under the tracer, then write the report, the trace and the timeline.

The CLI parses the options into ProfileOptions, finds this process's rank (this_rank) and
the gate config, and calls prepare_profile, which finds every problem it can before the
script starts. run_profile runs the script. write_report_and_trace is the one place where
the report and trace of a run are written, for an ordinary end as for the ends that skip
every cleanup (os._exit, SIGTERM, SIGHUP: see runner). Problems the user can fix raise
InputError. Nothing here prints: messages go to the `say` function the caller gives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from typing import TYPE_CHECKING, Callable

from ..core.costmodel import ProfileError
from ..core.defaults import CHROME_EVENTS, REGION_CALLS_TRACED, TIMELINE_EVENTS
from ..core.trace import Trace
from ..render.chrome import render_chrome
from ..render.text import render_text
from .apply import ApplyError, Edit, load_edits
from .config import GateConfig
from .gating import check_formats, rank_baseline
from .modules import ModuleTargetError, main_spec
from .rankenv import RankError, RankInfo, path_for, rank_info
from .runner import RunResult, run_script
from .traces import InputError, load_trace, load_traces, write_html_report, write_text

if TYPE_CHECKING:
    from ..tracer import Tracer
    from ..tracer.light import LightTracer


@dataclass(frozen=True)
class ProfileOptions:
    """What `memcpy-doctor profile` was asked to do, as its command line says it."""

    script: str
    args: tuple[str, ...]
    device: str
    device_profile: str | None
    output: str  # the trace's path as given, before it is named by rank
    sort: str
    log_transfers: int
    apply_path: str | None
    chrome_trace: str | None
    report: bool = True  # False for the ranks of --ranks: the launcher reports
    ranks: int | None = None  # --ranks N: start N ranks here
    gate_format: str = "text"
    #: a compiled graph's calls traced op by op (tracer/regions.py); None: every call
    compiled_calls_traced: int | None = REGION_CALLS_TRACED
    light: bool = False  # --light: syncs only, from sync-debug mode (tracer/light.py)
    #: the run's first events kept in order in the trace's timeline (tracer/events.py)
    timeline_events: int = TIMELINE_EVENTS
    module: bool = False  # -m: `script` is a module's name, run as `python -m` runs it
    html: str | None = None  # --html: where the HTML report goes (render/html.py)

    @property
    def target(self) -> list[str]:
        """What names the program on a command line: `SCRIPT`, or `-m MODULE`."""
        return ["-m", self.script] if self.module else [self.script]


@dataclass(frozen=True)
class ProfilePlan:
    """A profile checked and ready to run: the options, this process's rank, the gates, the
    paths named by rank, the tracer and the --apply edits."""

    options: ProfileOptions
    rank: RankInfo | None
    config: GateConfig | None  # None: no gates; the baseline is this rank's own
    output: str  # the trace's path as messages name it
    out_path: str  # the same, absolute: taken before the script may change directory
    chrome_trace: str | None
    tracer: Tracer | LightTracer
    edits: list[Edit] | None
    #: the file that runs as __main__ (the script, or the module's), and the module's spec
    main_path: str = ""
    spec: ModuleSpec | None = None
    html: str | None = None  # the HTML report's path, named by rank, absolute


def this_rank(ranks: int | None) -> RankInfo | None:
    """This process's rank in a distributed run (from RANK and WORLD_SIZE), None outside
    one. InputError when they are not sensible, or when --ranks is given as well: a rank
    must not start ranks of its own."""
    try:
        rank = rank_info()
    except RankError as e:
        raise InputError(str(e)) from None
    if ranks is not None and rank is not None:
        raise InputError(f"--ranks: this process is already rank {rank.rank} of "
                         f"{rank.world_size} (RANK and WORLD_SIZE are set): use --ranks or "
                         "a launcher such as torchrun, not both")
    return rank


def prepare_profile(options: ProfileOptions, rank: RankInfo | None,
                    config: GateConfig | None) -> ProfilePlan:
    """Check everything that can be checked before the script runs, in the order a user
    meets the problems (the baseline, the gate format, the output directory, the device,
    the edits), so that a run of minutes does not end in a usage error. InputError for the
    first problem found."""
    if config is not None and config.baseline:
        config = rank_baseline(config, rank)
        if options.ranks is None:
            load_trace(config.baseline)
        else:
            load_traces((config.baseline,))
    if options.ranks is not None and options.ranks > 1 and config is not None:
        check_formats(options.gate_format, options.ranks)
    output = path_for(options.output, rank)
    out_path = os.path.abspath(output)
    out_dir = os.path.dirname(out_path)
    if not os.path.isdir(out_dir):
        raise InputError(f"-o {output}: directory {out_dir} does not exist")
    chrome_trace = options.chrome_trace
    if chrome_trace:
        chrome_trace = path_for(chrome_trace, rank)
    html = path_for(options.html, rank) if options.html else None
    if html and not os.path.isdir(os.path.dirname(os.path.abspath(html))):
        raise InputError(f"--html {html}: directory {os.path.dirname(os.path.abspath(html))} "
                         "does not exist")
    try:
        tracer = _light_tracer(options) if options.light else _tracer(options, chrome_trace)
    except ProfileError as e:
        raise InputError(str(e)) from None
    try:
        edits = load_edits(options.apply_path) if options.apply_path else None
    except ApplyError as e:
        raise InputError(str(e)) from None
    spec = None
    if options.module:
        try:
            spec = main_spec(options.script)
        except ModuleTargetError as e:
            raise InputError(f"-m {options.script}: {e}") from None
    main_path = spec.origin if spec is not None else os.path.abspath(options.script)
    return ProfilePlan(options, rank, config, output, out_path, chrome_trace, tracer, edits,
                       main_path, spec, html and os.path.abspath(html))


def _tracer(options: ProfileOptions, chrome_trace: str | None) -> Tracer:
    from ..tracer import Tracer  # torch is imported here, when a run is about to start
    return Tracer(device=options.device, profile=options.device_profile,
                  command=["memcpy-doctor", "profile", *options.target, *options.args],
                  log_transfers=options.log_transfers,
                  timeline_events=options.timeline_events,
                  chrome_events=CHROME_EVENTS if chrome_trace else 0,
                  compiled_calls_traced=options.compiled_calls_traced)


def _light_tracer(options: ProfileOptions) -> LightTracer:
    """The tracer of `profile --light`; InputError for what light mode cannot do here."""
    if options.chrome_trace:
        raise InputError("--chrome-trace: --light records no timeline (profile without "
                         "--light for one)")
    if options.log_transfers:
        raise InputError("--log-transfers: --light keeps no transfer log (profile without "
                         "--light for one)")
    from ..tracer.light import LightTracer  # imports torch
    try:
        return LightTracer(device=options.device, profile=options.device_profile,
                           command=["memcpy-doctor", "profile", "--light", *options.target,
                                    *options.args])
    except ValueError as e:
        raise InputError(str(e)) from None


def run_profile(plan: ProfilePlan,
                on_hard_exit: Callable[[RunResult], None] | None = None) -> RunResult:
    """Run the script under the plan's tracer, however it ends (see runner.run_script).
    `on_hard_exit` gets the result when the process is about to end without cleanup.
    InputError when the tracer could not start (--device cuda without a GPU, say): that
    is the user's choice of device, not the script's error."""
    options = plan.options
    try:
        return run_script(plan.main_path if plan.spec else options.script, list(options.args),
                          plan.tracer, plan.edits, on_hard_exit, plan.rank, plan.spec)
    except (RuntimeError, ValueError) as e:
        if plan.tracer.trace is None:
            raise InputError(str(e)) from None
        raise


def write_report_and_trace(plan: ProfilePlan, trace: Trace,
                           say: Callable[[str], None]) -> bool:
    """Give `say` the Profiling Report (unless the plan prints none), save the trace, and
    give `say` the line that says where it went, or why it could not be written. Returns
    whether it was saved. The report comes first, so that it is shown even when the trace
    cannot be written; this is the one place a run's report and trace are written."""
    if plan.options.report:
        say(render_text(trace, sort=plan.options.sort))
    try:
        trace.save(plan.out_path)
    except OSError as e:
        say(f"memcpy-doctor: cannot write trace {plan.output}: {e.strerror or e}")
        return False
    if plan.options.report:
        say(f"memcpy-doctor: trace written to {plan.output}")
    return True


def write_timeline(plan: ProfilePlan, trace: Trace) -> str | None:
    """Write the timeline (Chrome trace format) when --chrome-trace asked for one and the
    tracer recorded it; returns the line that says where it went, None when none was
    written. InputError when the file cannot be written."""
    chrome = plan.tracer.chrome
    if not plan.chrome_trace or chrome is None:
        return None
    write_text(render_chrome(chrome, trace.meta.device_name, trace.meta.simulated),
               plan.chrome_trace)
    return f"memcpy-doctor: timeline written to {plan.chrome_trace}"


def write_html(plan: ProfilePlan, traces: list[Trace],
               names: list[str]) -> tuple[str | None, bool]:
    """Write the HTML report of `traces` (one run's ranks) when --html asked for one: the
    line to say (where it went, or why it could not be written; None when none was asked)
    and whether all went well."""
    if not plan.html:
        return None, True
    shown = path_for(plan.options.html, plan.rank)
    try:
        return write_html_report(traces, names, plan.html, shown), True
    except InputError as e:
        return f"memcpy-doctor: error: {e}", False
