"""The `memcpy-doctor` command: a thin layer over run/ and the renderers. It parses the options,
calls, and turns what comes back into output and an exit status; it is the only place that
prints or exits. InputError from run/ (a problem the user can fix) becomes a usage error.

Exit status: the profiled script's own for `profile` (1 when it succeeded but a --gate failed);
a script ended by SIGTERM or SIGHUP dies of that signal after its report and trace are written
(a shell shows 128+N, e.g. 143); `profile --ranks N` exits with the highest status of the
ranks that ended on their own. For `check`, 0 passed and 1 a gate failed (on any rank); 2 for
a usage error (bad option, missing file, unreadable trace) with one line on stderr; 130 after
Ctrl-C.

`explain`, `check` and `diff` take the traces of several ranks (several files, a glob, or the
name given to `profile -o`, which stands for its `.rankK` traces): see run/rankenv.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Iterator

import click

from .analysis.gates import GateError
from .core import __version__
from .core.defaults import (DEFAULT_CALIBRATED_PROFILE, DEFAULT_DEVICE, DEFAULT_SORT_KEY,
                            DEFAULT_TRACE_PATH, DEFAULT_TRANSFER_LOG, DEVICE_CHOICES,
                            EXIT_GATE_FAILED, EXIT_USAGE, REGION_CALLS_TRACED, SORT_KEYS,
                            TIMELINE_EVENTS)
from .core.trace import Trace
from .core.units import parse_bytes
from .render.explain import FORMATS as EXPLAIN_FORMATS, render_logs
from .render.text import render_reports
from .run.config import GateConfig, load_config, merge
from .run.gating import CHECK_FORMATS, gate_traces
from .run.modules import module_argv, module_spec_or_error, program
from .run.traces import (InputError, import_traces, load_traces, write_html_report,
                         write_text)

if TYPE_CHECKING:
    from .run.profile import ProfilePlan
    from .run.runner import RunResult

# What runs a script (run/profile.py, runner.py, apply.py, ranks.py, verify.py) and what
# measures a GPU (run/calibrate.py) is imported by the command that needs it, not here: a
# command that reads a saved trace then loads only what it uses, in a tenth of a second.


class UsageProblem(click.UsageError):
    """A problem the user can fix by changing the command line."""


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    """Turn an InputError raised by run/ into a usage error, which main() prints as one line
    (`memcpy-doctor: error: ...`) with exit status 2: run/ does not know it serves a
    command line."""
    try:
        yield
    except InputError as e:
        raise UsageProblem(str(e)) from None


def _say(text: str) -> None:
    """Print one of memcpy-doctor's own messages (a report, where a file went) on stderr,
    which keeps stdout for the profiled script and the gate results."""
    click.echo(text, err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="memcpy-doctor")
def cli() -> None:
    """Find the copies between host and GPU that stall a PyTorch program."""


def _calls_traced(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    """--trace-compiled-calls: a count of at least 1, or "all" (None)."""
    if value == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise click.BadParameter(f"{value!r}: give a number of calls, at least 1, or 'all'")
    return n


def _gate_options(f):
    """The options `check` and `profile` share."""
    for option in reversed([
        click.option("--max", "limits", metavar="NAME=VALUE", multiple=True,
                     help="Fail when a metric exceeds VALUE (sync_calls=0, memcpy_ratio=5%, "
                          "bytes_htod=10MiB, sync_time=2ms); repeatable."),
        click.option("--baseline", metavar="BASE.json", default=None,
                     help="Fail when a count or bytes metric grew against this trace."),
        click.option("--tolerance", "tolerances", metavar="[NAME=]PCT", multiple=True,
                     help="Growth allowed against the baseline (10%, or sync_calls=0%)."),
        click.option("--allow", metavar="PATH[:LINE]|GLOB", multiple=True,
                     help="Copy sites not counted; repeatable."),
        click.option("--config", "config_path", metavar="PYPROJECT", default=None,
                     help="Read [tool.memcpy-doctor] from this file (default: the nearest "
                          "pyproject.toml)."),
    ]):
        f = option(f)
    return f


def _gate_config(limits, tolerances, allow, baseline, config_path) -> GateConfig:
    """The gates asked for: [tool.memcpy-doctor] of the nearest (or the given) pyproject.toml,
    with the command line's options added; a bad threshold is a usage error."""
    try:
        return merge(load_config(os.getcwd(), config_path), limits, tolerances, allow,
                     baseline)
    except GateError as e:
        raise UsageProblem(str(e)) from None


def _et_option(f):
    """--execution-trace, for the commands that read torch.profiler traces."""
    return click.option(
        "--execution-trace", "execution_traces", metavar="ET.json", multiple=True,
        type=click.Path(dir_okay=False),
        help="An ExecutionTraceObserver file of the same run as a torch.profiler TRACE: "
             "producers by tensor ids, not inferred. One per such TRACE (paired by process "
             "id, else in order); repeatable.")(f)


def _mixed_option(f):
    """--allow-mixed, for the commands that read several traces as one run's ranks."""
    return click.option(
        "--allow-mixed", is_flag=True,
        help="Read several traces together even when they are not the ranks of one run "
             "(another device, world size, command or start, or the same rank twice).")(f)


def _gated_status(plan: ProfilePlan, traces: list[Trace], names: list[str],
                  status: int) -> int:
    """Print the gate result of a profile's traces on stdout (when it has gates and traces)
    and return the exit status: a failed gate turns a run's 0 into EXIT_GATE_FAILED; a run
    that failed on its own keeps its status, which says more."""
    if plan.config is None or not traces:
        return status
    passed, text = gate_traces(traces, names, plan.config, plan.options.gate_format)
    click.echo(text, nl=False)
    if not passed and status == 0:
        return EXIT_GATE_FAILED
    return status


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--device", type=click.Choice(DEVICE_CHOICES), default=DEFAULT_DEVICE,
              show_default=True,
              help="cuda: the real GPU; sim: the simulated GPU; auto: cuda if available.")
@click.option("--device-profile", metavar="NAME|FILE", default=None,
              help="Device profile of the simulated GPU (default: a100-sxm4-80gb).")
@click.option("-o", "--output", metavar="PATH", default=DEFAULT_TRACE_PATH, show_default=True,
              help="Where to write the trace (JSON).")
@click.option("--sort", type=click.Choice(SORT_KEYS), default=DEFAULT_SORT_KEY,
              show_default=True, help="Event Summary order.")
@click.option("--log-transfers", metavar="N", type=click.IntRange(min=0),
              default=DEFAULT_TRANSFER_LOG,
              help="Keep the first N copies in order in the trace, for `explain --log`.")
@click.option("--timeline-events", metavar="N", type=click.IntRange(min=0),
              default=TIMELINE_EVENTS, show_default=True,
              help="Keep the run's first N events (ops, copies, host waits) in order in the "
                   "trace's timeline; 0: none.")
@click.option("--apply", "apply_path", metavar="SUGGESTIONS.json", default=None,
              help="Apply the edits of `explain --format json` in memory "
                   "(the file is not changed) and profile that.")
@click.option("--chrome-trace", metavar="PATH", default=None,
              help="Also write the timeline (Chrome trace format, for Perfetto).")
@click.option("--trace-compiled-calls", "compiled_calls", metavar="N|all",
              default=str(REGION_CALLS_TRACED), show_default=True, callback=_calls_traced,
              help="Trace the ops inside a torch.compile'd graph on its first N calls (per "
                   "input shapes); a graph that made no copy or host wait in them runs its "
                   "later calls untraced inside, timed as one region. all: every call.")
@click.option("--light", is_flag=True,
              help="Syncs only, each at its line, from PyTorch's sync-debug mode: no mode "
                   "and nothing per op, for real GPUs (docs: README, Light mode). Needs a "
                   "CUDA GPU, or --device sim.")
@click.option("--gate", is_flag=True,
              help="Check the trace after the run (with --max/--baseline/--allow or "
                   "[tool.memcpy-doctor]); exit 1 if a gate fails.")
@_gate_options
@click.option("--gate-format", type=click.Choice(CHECK_FORMATS), default="text",
              show_default=True, help="Format of the gate result (printed to stdout).")
@click.option("--ranks", metavar="N", type=click.IntRange(min=1), default=None,
              help="Start N ranks of a distributed run here, as `torchrun --nproc-per-node N` "
                   "would (RANK, WORLD_SIZE, MASTER_ADDR/PORT set); one trace per rank.")
@click.option("--no-report", is_flag=True, hidden=True,
              help="Write the trace only (the ranks of --ranks: the launcher reports).")
@click.option("--html", metavar="OUT.html", help="Also write the report as an HTML page.")
@click.option("-m", "--module", metavar="MODULE", default=None,
              help="Run MODULE as `python -m MODULE ARGS` would, instead of a SCRIPT; "
                   "everything after it is the module's.")
@click.argument("script", required=False, type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def profile(device: str, device_profile: str | None, output: str, sort: str,
            log_transfers: int, timeline_events: int, apply_path: str | None,
            chrome_trace: str | None, compiled_calls: int | None, light: bool, gate: bool,
            limits, baseline,
            tolerances, allow, config_path, gate_format: str, ranks: int | None,
            no_report: bool, html: str | None, module: str | None, script: str | None,
            args: tuple[str, ...]) -> None:
    """Run SCRIPT [ARGS]... as `python SCRIPT ARGS` would (or -m MODULE [ARGS]... as
    `python -m MODULE ARGS`), then print the Profiling Report (to stderr) and write the
    trace. Options after SCRIPT (or MODULE) belong to the program.

    Under torchrun (RANK and WORLD_SIZE set) or with --ranks N, each rank writes its own
    trace, the rank before the extension: -o trace.json gives trace.rank0.json, ..."""
    from .run.profile import ProfileOptions, prepare_profile, this_rank
    try:
        script, args = program(module, script, args)
    except ValueError as e:
        raise UsageProblem(str(e)) from None
    options = ProfileOptions(script, args, device, device_profile, output, sort, log_transfers,
                             apply_path, chrome_trace, report=not no_report, ranks=ranks,
                             gate_format=gate_format, compiled_calls_traced=compiled_calls,
                             light=light, timeline_events=timeline_events,
                             module=module is not None, html=html)
    with _usage_errors():
        rank = this_rank(ranks)
        config = None
        if gate or limits or baseline:
            config = _gate_config(limits, tolerances, allow, baseline, config_path)
            if not config.active:
                raise UsageProblem("--gate: nothing to check: give --max NAME=VALUE or "
                                   "--baseline, or set [tool.memcpy-doctor] in pyproject.toml")
        plan = prepare_profile(options, rank, config)
        if ranks is not None:
            sys.exit(_profile_ranks(plan, ranks))
        sys.exit(_profile_here(plan))


def _profile_here(plan: ProfilePlan) -> int:
    """Run the script in this process, then print what Python would have printed at its end,
    the --apply edits that found no statement, the report, where the trace and timeline went
    and the gate result. Returns the exit status: the script's, or 2 when the trace could
    not be written."""
    from .run.apply import LineEdit
    from .run.profile import run_profile, write_html, write_report_and_trace, write_timeline
    from .run.runner import format_exception

    def on_hard_exit(hard: RunResult) -> None:
        """The script called os._exit or got SIGTERM or SIGHUP: the process ends as soon as
        this returns, so write the report and trace now, with what the script already
        printed flushed first."""
        sys.stdout.flush()
        write_report_and_trace(plan, hard.trace, _say)
        sys.stderr.flush()

    result = run_profile(plan, on_hard_exit)
    if result.exception is not None:
        sys.stderr.write(format_exception(result.exception, plan.main_path))
    elif result.exit_message is not None:
        sys.stderr.write(result.exit_message + "\n")
    sys.stderr.flush()
    for e in result.missed_edits:
        why = ("the line no longer reads as explain saw it" if isinstance(e, LineEdit)
               else "only statements of SCRIPT itself can be guarded")
        _say(f"memcpy-doctor: --apply: not applied at {e.file}:{e.line} ({why})")
    if not write_report_and_trace(plan, result.trace, _say):
        return EXIT_USAGE
    timeline = write_timeline(plan, result.trace)
    page, written = write_html(plan, [result.trace], [plan.output])
    for line in (timeline, page):
        if line is not None:
            _say(line)
    if not written:
        return EXIT_USAGE
    return _gated_status(plan, [result.trace], [plan.output], result.exit_status)


def _profile_ranks(plan: ProfilePlan, n: int) -> int:
    """`profile --ranks N`: run the ranks, then print each rank's report, the ranks side by
    side, and the gates of each. Returns the exit status."""
    from .run.profile import write_html
    from .run.ranks import profile_ranks
    run = profile_ranks(plan, n)
    sys.stdout.flush()
    page, written = write_html(plan, run.traces, run.names)
    for message in [*run.messages, *([page] if page else [])]:
        _say(message)
    return _gated_status(plan, run.traces, run.names, run.status) if written else EXIT_USAGE


@cli.command()
@click.argument("traces", nargs=-1, type=click.Path())
@click.option("--sort", type=click.Choice(SORT_KEYS), default=DEFAULT_SORT_KEY,
              show_default=True, help="Event Summary order.")
@click.option("--html", metavar="OUT.html", help="Write the report as an HTML page instead.")
@_et_option
@_mixed_option
def report(traces: tuple[str, ...], sort: str, html: str | None,
           execution_traces: tuple[str, ...], allow_mixed: bool) -> None:
    """Print the Profiling Report of saved TRACES (default: the one `profile` last wrote
    here, or its rank traces); runs nothing. Several traces: one report each, in rank
    order."""
    with _usage_errors():
        loaded, names = load_traces(traces or (DEFAULT_TRACE_PATH,), execution_traces,
                                    allow_mixed)
        if html:
            return _say(write_html_report(loaded, names, html))
    click.echo(render_reports(loaded, names, sort))


@cli.command()
@click.argument("traces", nargs=-1, type=click.Path())
@click.option("--format", "fmt", type=click.Choice(EXPLAIN_FORMATS), default="text",
              show_default=True, help="Output format.")
@click.option("--log", is_flag=True,
              help="Print every logged transfer in order (profile with --log-transfers N).")
@click.option("--device-memory", metavar="SIZE", default=None,
              help="Device memory budget for the placement, e.g. 4GiB.")
@click.option("--verify", "verify_script", metavar="SCRIPT", default=None,
              type=click.Path(exists=True, dir_okay=False),
              help="Profile SCRIPT (the arguments after it are its own; put -- before those "
                   "that start with -), then re-run it with each suggestion applied, one at "
                   "a time, and mark each verified or not; drop those that made it worse.")
@click.option("--verify-module", "verify_module", metavar="MODULE", default=None, hidden=True,
              help="--verify -m MODULE: as --verify SCRIPT, for `python -m MODULE`.")
@click.option("--device", type=click.Choice(DEVICE_CHOICES), default=DEFAULT_DEVICE,
              show_default=True, help="With --verify: the device its runs use.")
@_et_option
@_mixed_option
def explain(traces: tuple[str, ...], fmt: str, log: bool, device_memory: str | None,
            verify_script: str | None, verify_module: str | None, device: str,
            execution_traces: tuple[str, ...], allow_mixed: bool) -> None:
    """Explain each copy the host waited for in a saved TRACE (default: the one `profile`
    last wrote here): producer -> copy -> consumer at their lines, and the edits that remove
    them, largest saving first. Runs nothing and needs no GPU.

    Several TRACES (the ranks of one run: files, a glob, or the name given to `profile -o`)
    give a table per rank and merged, flag the ranks whose sync copies differ, and explain
    each group of ranks with the same copies once."""
    with _usage_errors():
        cwd = os.getcwd()
        if verify_script is not None or verify_module is not None:
            from .run.verify import verify
            if execution_traces:
                raise UsageProblem("--execution-trace goes with torch.profiler TRACES, not "
                                   "--verify (which profiles SCRIPT itself)")
            if verify_script is not None and verify_script.endswith((".json", ".json.gz")):
                raise UsageProblem(f"--verify {verify_script}: give the program to run "
                                   "(explain --verify train.py), not a trace")
            from .render.explain import render_verification
            if verify_module is not None:
                try:
                    module_spec_or_error(verify_module)
                except ValueError as e:
                    raise UsageProblem(str(e)) from None
            target = ["-m", verify_module] if verify_module is not None else [verify_script]
            checked = verify(target, list(traces), device, cwd)
            click.echo(render_verification(checked.explanation, checked.kept, checked.tried,
                                           checked.dropped, checked.not_worth_it, fmt, cwd),
                       nl=False)
            return
        loaded, names = load_traces(traces or (DEFAULT_TRACE_PATH,), execution_traces,
                                    allow_mixed)
        if log:
            click.echo(render_logs(loaded, names, cwd), nl=False)
            return
        try:
            budget = parse_bytes(device_memory) if device_memory is not None else None
        except ValueError as e:
            raise UsageProblem(f"--device-memory: {e}") from None
        from .run.ranks import explain_traces
        click.echo(explain_traces(loaded, names, fmt, cwd, budget), nl=False)


@cli.command()
@click.argument("before", type=click.Path())
@click.argument("after", type=click.Path())
@_et_option
@_mixed_option
def diff(before: str, after: str, execution_traces: tuple[str, ...], allow_mixed: bool) -> None:
    """Compare two saved traces: total time, each memcpy line, the event rows and the sync
    copy paths that changed.

    BEFORE and AFTER may each stand for the traces of several ranks (a quoted glob, or the
    name given to `profile -o`): each rank is compared with the same rank, then all ranks
    merged, and a side whose ranks make different sync copies is flagged. With
    --execution-trace, the ETs go with BEFORE's torch.profiler traces, then AFTER's."""
    from .run.ranks import diff_traces
    with _usage_errors():
        click.echo(diff_traces(before, after, os.getcwd(), execution_traces, allow_mixed))


@cli.command(name="import")
@click.argument("traces", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", metavar="PATH", default=DEFAULT_TRACE_PATH, show_default=True,
              help="Where to write the trace; with the ranks of one run, one file per rank "
                   "(trace.rank0.json, ...).")
@_et_option
def import_cmd(traces: tuple[str, ...], output: str, execution_traces: tuple[str, ...]) -> None:
    """Convert torch.profiler (Kineto) TRACES (.json or .json.gz) into memcpy-doctor traces,
    measured on the GPU that recorded them (docs/kineto.md). Several TRACES must be the
    ranks of one run (their distributedInfo says which)."""
    with _usage_errors():
        for line in import_traces(traces, execution_traces, output):
            _say(line)


@cli.command(name="check")
@click.argument("traces", nargs=-1, type=click.Path())
@_gate_options
@click.option("--format", "fmt", type=click.Choice(CHECK_FORMATS), default="text",
              show_default=True, help="Output format (github: workflow annotations).")
@click.option("-o", "--output", metavar="PATH", default=None,
              help="Write the result here instead of stdout.")
@_et_option
@_mixed_option
def check_cmd(traces: tuple[str, ...], limits, baseline, tolerances, allow, config_path,
              fmt: str, output: str | None, execution_traces: tuple[str, ...],
              allow_mixed: bool) -> None:
    """Gate a saved TRACE: thresholds (--max, [tool.memcpy-doctor]) and a baseline.
    Exit status 0: passed; 1: a gate failed; 2: usage error or unreadable input.

    Several TRACES (the ranks of one run) are gated each on its own, each rank against the
    same rank's baseline where there is one; it fails when any rank fails."""
    config = _gate_config(limits, tolerances, allow, baseline, config_path)
    if not config.active:
        raise UsageProblem("nothing to check: give --max NAME=VALUE or --baseline, or set "
                           "[tool.memcpy-doctor] in pyproject.toml")
    with _usage_errors():
        loaded, names = load_traces(traces or (DEFAULT_TRACE_PATH,), execution_traces,
                                    allow_mixed)
        passed, text = gate_traces(loaded, names, config, fmt)
    _emit(text, output)
    sys.exit(0 if passed else EXIT_GATE_FAILED)


@cli.command()
@click.argument("traces", nargs=-1, type=click.Path(dir_okay=False))
@click.option("-o", "--output", metavar="FILE", default=DEFAULT_CALIBRATED_PROFILE,
              show_default=True, help="Where to write the measured device profile (JSON).")
@click.option("--quick", is_flag=True, help="Fewer sizes and repeats (seconds, not a minute).")
@click.option("--measurements", metavar="FILE", default=None,
              help="Also write the raw measurements (JSON), to fit again or compare later.")
@click.option("--from-trace", "from_trace", is_flag=True,
              help="Fit the profile to the copies in torch.profiler TRACES instead of "
                   "measuring this machine's GPU (no GPU needed).")
def calibrate(traces: tuple[str, ...], output: str, quick: bool, measurements: str | None,
              from_trace: bool) -> None:
    """Measure this machine's GPU (copies each way pinned and pageable, launch and sync
    latency, matmul FLOP/s, memory bandwidth) and write a device profile that
    `profile --device sim --device-profile FILE` uses. Needs a CUDA GPU.

    With --from-trace, fit it to the copies, launches and syncs of torch.profiler TRACES
    (.json or .json.gz, one GPU's) instead (docs/calibrate.md)."""
    import json
    from .run.calibrate import CalibrationError
    from .run.calibrate_cmd import calibrated_profile
    if traces and not from_trace:
        raise UsageProblem(f"calibrate: got {traces[0]}: give --from-trace to fit traces")
    if from_trace and not traces:
        raise UsageProblem("calibrate --from-trace: give one or more torch.profiler traces")
    for path in (output, measurements):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageProblem(f"{path}: directory {os.path.dirname(path)} does not exist")
    try:
        profile, measured = calibrated_profile(list(traces), from_trace, quick, _say)
    except CalibrationError as e:
        raise UsageProblem(str(e)) from None
    if measurements:
        _emit(json.dumps(measured, indent=1) + "\n", measurements)
    _emit(json.dumps(profile, indent=2) + "\n", output)
    click.echo(f"memcpy-doctor: device profile of {profile['name']} written to {output}",
               err=True)


def _emit(text: str, output: str | None) -> None:
    """Print `text` on stdout, or write it to the file `output` (an -o) when one is given;
    a file that cannot be written is a usage error."""
    if output is None:
        click.echo(text, nl=False)
        return
    with _usage_errors():
        write_text(text, output)


def main(argv: list[str] | None = None) -> None:
    """Entry point: click's usage errors become one line on stderr and exit status 2."""
    try:
        argv = module_argv(list(sys.argv[1:] if argv is None else argv), cli.commands)
        cli.main(args=argv, prog_name="memcpy-doctor", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e), err=True)
        sys.exit(EXIT_USAGE)
    except click.UsageError as e:
        click.echo(f"memcpy-doctor: error: {e.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo("memcpy-doctor: aborted", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
