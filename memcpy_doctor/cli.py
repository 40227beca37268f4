"""The `memcpy-doctor` command: a thin layer over the runner, the trace and the renderers.

Exit status: the profiled script's own for `profile` (1 when it succeeded but a --gate failed);
a script ended by SIGTERM or SIGHUP dies of that signal after its report and trace are written
(a shell shows 128+N, e.g. 143); `profile --ranks N` exits with the highest status of the
ranks that ended on their own. For `check`, 0 passed and 1 a gate failed (on any rank); 2 for
a usage error (bad option, missing file, unreadable trace) with one line on stderr; 130 after
Ctrl-C.

`explain`, `check` and `diff` take the traces of several ranks (several files, a glob, or the
name given to `profile -o`, which stands for its `.rankK` traces): see rankenv.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import click

from .core import __version__
from .core.costmodel import ProfileError
from .core.defaults import (DEFAULT_DEVICE, DEFAULT_SORT_KEY, DEFAULT_TRACE_PATH,
                       DEFAULT_TRANSFER_LOG, DEVICE_CHOICES, EXIT_GATE_FAILED,
                       EXIT_INTERRUPTED, EXIT_USAGE, SORT_KEYS, CHROME_EVENTS)
from .render.text import render_text
from .run.runner import RunResult, format_exception, run_script
from .analysis.attribution import explain as explain_trace
from .analysis.gates import GateError, check
from .run.apply import ApplyError, load_edits
from .run.config import GateConfig, load_config, merge
from .render.check import render_check_json, render_check_text
from .render.chrome import render_chrome
from .analysis.compare import compare
from .core.units import parse_bytes
from .analysis.rules import suggest
from .render.diff import render_diff
from .render.explain import (FORMATS as EXPLAIN_FORMATS, render_explain_json,
                             render_explain_markdown, render_explain_text, render_log)
from .core.trace import Trace, TraceError
from .run import calibrate as calib
from .tracer import Tracer
from .analysis.ranks import compare_ranks, merge as merge_ranks
from .run.launch import launch, worst_status
from .run.rankenv import RankError, RankInfo, expand_traces, path_for, rank_info, rank_path
from .render.ranks import (group_title, rank_label, ranks_dict, render_differences_text,
                           render_ranks_markdown, render_ranks_text)


class UsageProblem(click.UsageError):
    """A problem the user can fix by changing the command line."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="memcpy-doctor")
def cli() -> None:
    """Find the copies between host and GPU that stall a PyTorch program."""


CHECK_FORMATS = ("text", "json", "github", "sarif", "junit")


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
    try:
        return merge(load_config(os.getcwd(), config_path), limits, tolerances, allow,
                     baseline)
    except GateError as e:
        raise UsageProblem(str(e)) from None


def _run_gates(trace: Trace, config: GateConfig, fmt: str) -> tuple[bool, str]:
    """(passed, output in `fmt`)."""
    base = _load(config.baseline) if config.baseline else None
    result = check(trace, config.limits, base, config.tolerance, config.allow, config.root)
    if fmt == "json":
        return result.passed, render_check_json(result)
    if fmt == "github":
        from .render.github import render_github
        return result.passed, render_github(result, config.root)
    if fmt == "sarif":
        from .render.sarif import render_sarif
        anchor = (os.path.relpath(config.source, config.root) if config.source
                  else "pyproject.toml")
        return result.passed, render_sarif(result, config.root, anchor=anchor)
    if fmt == "junit":
        from .render.junit import render_junit
        return result.passed, render_junit(result, config.root)
    return result.passed, render_check_text(result, config.root)


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
@click.option("--apply", "apply_path", metavar="SUGGESTIONS.json", default=None,
              help="Apply the device_guard edits of `explain --format json` in memory "
                   "(the file is not changed) and profile that.")
@click.option("--chrome-trace", metavar="PATH", default=None,
              help="Also write the timeline (Chrome trace format, for Perfetto).")
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
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def profile(device: str, device_profile: str | None, output: str, sort: str,
            log_transfers: int, apply_path: str | None, chrome_trace: str | None,
            gate: bool, limits, baseline,
            tolerances, allow, config_path, gate_format: str, ranks: int | None,
            no_report: bool, script: str, args: tuple[str, ...]) -> None:
    """Run SCRIPT [ARGS]... as `python SCRIPT ARGS` would, then print the Profiling Report
    (to stderr) and write the trace. Options after SCRIPT belong to the script.

    Under torchrun (RANK and WORLD_SIZE set) or with --ranks N, each rank writes its own
    trace, the rank before the extension: -o trace.json gives trace.rank0.json, ..."""
    try:
        rank = rank_info()
    except RankError as e:
        raise UsageProblem(str(e)) from None
    if ranks is not None and rank is not None:
        raise UsageProblem(f"--ranks: this process is already rank {rank.rank} of "
                           f"{rank.world_size} (RANK and WORLD_SIZE are set): use --ranks or "
                           "a launcher such as torchrun, not both")
    gating = gate or bool(limits or baseline)
    config = (_gate_config(limits, tolerances, allow, baseline, config_path) if gating
              else None)
    if config is not None and not config.active:
        raise UsageProblem("--gate: nothing to check: give --max NAME=VALUE or --baseline, or "
                           "set [tool.memcpy-doctor] in pyproject.toml")
    if config is not None and config.baseline:
        config = _rank_baseline(config, rank)
        if ranks is None:
            _load(config.baseline)  # an unreadable baseline is a usage error, before the run
        else:
            _load_many((config.baseline,))
    if ranks is not None and ranks > 1 and config is not None:
        _check_formats(gate_format, ranks)
    output = path_for(output, rank)
    out_path = os.path.abspath(output)  # taken now: the script may change directory
    out_dir = os.path.dirname(out_path)
    if not os.path.isdir(out_dir):
        raise UsageProblem(f"-o {output}: directory {out_dir} does not exist")
    if chrome_trace:
        chrome_trace = path_for(chrome_trace, rank)
    try:
        tracer = Tracer(device=device, profile=device_profile,
                        command=["memcpy-doctor", "profile", script, *args],
                        log_transfers=log_transfers,
                        timeline_events=CHROME_EVENTS if chrome_trace else 0)
    except ProfileError as e:
        raise UsageProblem(str(e)) from None
    try:
        edits = load_edits(apply_path) if apply_path else None
    except ApplyError as e:
        raise UsageProblem(str(e)) from None
    if ranks is not None:
        sys.exit(_profile_ranks(ranks, script, args, device, device_profile, output, sort,
                                log_transfers, apply_path, chrome_trace, config, gate_format))

    def finish_hard_exit(hard: RunResult) -> None:  # os._exit, a signal: report, trace, die
        sys.stdout.flush()
        if not no_report:
            click.echo(render_text(hard.trace, sort=sort), err=True)
        try:
            hard.trace.save(out_path)
            if not no_report:
                click.echo(f"memcpy-doctor: trace written to {output}", err=True)
        except OSError as e:
            click.echo(f"memcpy-doctor: cannot write trace {output}: {e.strerror or e}",
                       err=True)
        sys.stderr.flush()

    try:
        result = run_script(script, list(args), tracer, edits, finish_hard_exit, rank)
    except (RuntimeError, ValueError) as e:
        if tracer.trace is None:  # the tracer could not start (e.g. --device cuda, no GPU)
            raise UsageProblem(str(e)) from None
        raise
    if result.exception is not None:
        sys.stderr.write(format_exception(result.exception, script))
    elif result.exit_message is not None:
        sys.stderr.write(result.exit_message + "\n")
    sys.stderr.flush()
    for e in result.missed_edits:
        click.echo(f"memcpy-doctor: --apply: not applied at {e.file}:{e.line} (only statements "
                   "of SCRIPT itself can be guarded)", err=True)
    if not no_report:
        click.echo(render_text(result.trace, sort=sort), err=True)
    try:
        result.trace.save(out_path)
    except OSError as e:
        click.echo(f"memcpy-doctor: cannot write trace {output}: {e.strerror or e}", err=True)
        sys.exit(EXIT_USAGE)
    if not no_report:
        click.echo(f"memcpy-doctor: trace written to {output}", err=True)
    if chrome_trace and tracer.chrome is not None:
        _emit(render_chrome(tracer.chrome, result.trace.meta.device_name,
                            result.trace.meta.simulated), chrome_trace)
        click.echo(f"memcpy-doctor: timeline written to {chrome_trace}", err=True)
    status = result.exit_status
    if config is not None:
        passed, text = _run_gates(result.trace, config, gate_format)
        click.echo(text, nl=False)
        if not passed and status == 0:
            status = EXIT_GATE_FAILED
    sys.exit(status)


@cli.command()
@click.argument("traces", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--sort", type=click.Choice(SORT_KEYS), default=DEFAULT_SORT_KEY,
              show_default=True, help="Event Summary order.")
def report(traces: tuple[str, ...], sort: str) -> None:
    """Print the Profiling Report of saved TRACES (default: the one `profile` last wrote
    here, or its rank traces); runs nothing. Several traces: one report each, in rank
    order."""
    loaded, names = _load_many(traces or (DEFAULT_TRACE_PATH,))
    reports = [render_text(t, sort=sort) for t in loaded]
    if len(reports) > 1:
        reports = [f"{text}\n(from {name})" for text, name in zip(reports, names)]
    click.echo("\n".join(reports))


def _load(path: str) -> Trace:
    try:
        return Trace.load(path)
    except TraceError as e:
        raise UsageProblem(str(e)) from None


def _load_many(args: tuple[str, ...] | list[str]) -> tuple[list[Trace], list[str]]:
    """The traces `args` name (globs and rank traces expanded, see rankenv.expand_traces) and
    their file names; in rank order when every one has a rank."""
    try:
        names = expand_traces(list(args))
    except RankError as e:
        raise UsageProblem(str(e)) from None
    traces = [_load(n) for n in names]
    if len(traces) > 1 and all(t.meta.rank is not None for t in traces):
        order = sorted(range(len(traces)), key=lambda i: traces[i].meta.rank)
        traces, names = [traces[i] for i in order], [names[i] for i in order]
    return traces, names


def _rank_baseline(config: GateConfig, rank: RankInfo | None) -> GateConfig:
    """A rank compares with the same rank's baseline where there is one (base.rank1.json for
    --baseline base.json), else with the baseline as named."""
    own = path_for(config.baseline, rank)
    if own != config.baseline and os.path.exists(own):
        return dataclasses.replace(config, baseline=own)
    return config


def _check_formats(fmt: str, count: int) -> None:
    if count > 1 and fmt in ("sarif", "junit"):
        raise UsageProblem(f"--format {fmt} gates one trace at a time, not {count}: give one "
                           "rank's trace, or use text, json or github")


def _run_gates_many(traces: list[Trace], names: list[str], config: GateConfig,
                    fmt: str) -> tuple[bool, str]:
    """Gate each trace (each rank against its own baseline, see _rank_baseline); the output
    of several: each rank's result under its label, then the ranks whose copies differ."""
    if len(traces) == 1:
        return _run_gates(traces[0], config, fmt)
    _check_formats(fmt, len(traces))
    results = []
    for i, trace in enumerate(traces):
        rank = (RankInfo(trace.meta.rank, trace.meta.world_size or len(traces), 0)
                if trace.meta.rank is not None else None)
        own = _rank_baseline(config, rank) if config.baseline else config
        results.append((i, *_run_gates(trace, own, fmt)))
    passed = all(ok for _, ok, _ in results)
    comp = compare_ranks(traces)
    if fmt == "json":
        return passed, json.dumps({
            "passed": passed,
            "ranks": [{"rank": traces[i].meta.rank, "trace": names[i], **json.loads(text)}
                      for i, _, text in results],
            "comparison": ranks_dict(comp, names)}, indent=1) + "\n"
    if fmt == "github":
        return passed, "".join(text for _, _, text in results)
    parts = [f"== {rank_label(traces[i].meta.rank, i)} ({names[i]}) ==\n{text}"
             for i, _, text in results]
    failed = sum(not ok for _, ok, _ in results)
    parts.append("\n".join(render_differences_text(comp, config.root)).rstrip("\n") + "\n")
    parts.append(f"memcpy-doctor check: {'passed' if passed else 'FAILED'} "
                 f"({len(results) - failed} of {len(results)} traces passed)\n")
    return passed, "\n".join(parts)


def _profile_ranks(n: int, script: str, args: tuple[str, ...], device: str,
                   device_profile: str | None, output: str, sort: str, log_transfers: int,
                   apply_path: str | None, chrome_trace: str | None,
                   config: GateConfig | None, gate_format: str) -> int:
    """`profile --ranks N`: run the ranks (each a `profile --no-report` that finds its rank in
    the environment), then print each rank's report, the ranks side by side, and the gates
    of each. Returns the exit status."""
    out_path = os.path.abspath(output)
    cmd = [sys.executable, "-m", "memcpy_doctor", "profile", "--no-report", "--device", device,
           "-o", out_path, "--sort", sort, "--log-transfers", str(log_transfers)]
    if device_profile:
        cmd += ["--device-profile", (os.path.abspath(device_profile)
                                     if os.path.exists(device_profile) else device_profile)]
    if apply_path:
        cmd += ["--apply", os.path.abspath(apply_path)]
    if chrome_trace:
        cmd += ["--chrome-trace", os.path.abspath(chrome_trace)]
    cmd += [script, *args]
    if n == 1:
        paths = [(out_path, output)]
    else:
        paths = [(rank_path(out_path, r), rank_path(output, r)) for r in range(n)]
    for path, _ in paths:  # a trace left from an earlier run must not pass for this one's
        try:
            os.unlink(path)
        except OSError:
            pass
    exits, interrupted = launch(cmd, n)
    sys.stdout.flush()
    traces, names = [], []
    for e, (path, name) in zip(exits, paths):
        try:
            trace = Trace.load(path)
        except TraceError:
            how = f"killed by signal {e.signal}" if e.signal else f"exit status {e.status}"
            click.echo(f"memcpy-doctor: rank {e.rank} wrote no trace ({how})", err=True)
            continue
        click.echo(render_text(trace, sort=sort), err=True)
        traces.append(trace)
        names.append(name)
    if len(traces) > 1:
        click.echo(render_ranks_text(compare_ranks(traces), names), err=True)
    if traces:
        click.echo(f"memcpy-doctor: trace{'s' if len(names) > 1 else ''} written to "
                   f"{', '.join(names)}", err=True)
    status = EXIT_INTERRUPTED if interrupted else worst_status(exits)
    if config is not None and traces:
        passed, text = _run_gates_many(traces, names, config, gate_format)
        click.echo(text, nl=False)
        if not passed and status == 0:
            status = EXIT_GATE_FAILED
    return status


@cli.command()
@click.argument("traces", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(EXPLAIN_FORMATS), default="text",
              show_default=True, help="Output format.")
@click.option("--log", is_flag=True,
              help="Print every logged transfer in order (profile with --log-transfers N).")
@click.option("--device-memory", metavar="SIZE", default=None,
              help="Device memory budget for the placement, e.g. 4GiB.")
def explain(traces: tuple[str, ...], fmt: str, log: bool, device_memory: str | None) -> None:
    """Explain each copy the host waited for in a saved TRACE (default: the one `profile`
    last wrote here): producer -> copy -> consumer at their lines, and the edits that remove
    them, largest saving first. Runs nothing and needs no GPU.

    Several TRACES (the ranks of one run: files, a glob, or the name given to `profile -o`)
    give a table per rank and merged, flag the ranks whose sync copies differ, and explain
    each group of ranks with the same copies once."""
    loaded, names = _load_many(traces or (DEFAULT_TRACE_PATH,))
    cwd = os.getcwd()
    if log:
        for trace, name in zip(loaded, names):
            if len(loaded) > 1:
                click.echo(f"== {name} ==")
            click.echo(render_log(trace, cwd), nl=False)
        return
    try:
        budget = parse_bytes(device_memory) if device_memory is not None else None
    except ValueError as e:
        raise UsageProblem(f"--device-memory: {e}") from None
    if len(loaded) == 1:
        click.echo(_explain_one(loaded[0], fmt, cwd, budget), nl=False)
        return
    comp = compare_ranks(loaded)
    parts = [_explain_one(loaded[g[0]], fmt, cwd, budget) for g in comp.groups]
    if fmt == "json":
        click.echo(json.dumps({
            "ranks": ranks_dict(comp, names),
            "explanations": [{"traces": [names[i] for i in g], **json.loads(part)}
                             for g, part in zip(comp.groups, parts)]}, indent=1))
    elif fmt == "markdown":
        click.echo("\n".join([render_ranks_markdown(comp, names, cwd)] + [
            f"# {group_title(comp, g)}\n\n{part}" for g, part in zip(comp.groups, parts)]),
            nl=False)
    else:
        click.echo("\n".join([render_ranks_text(comp, names, cwd)] + [
            f"== {group_title(comp, g)} ==\n\n{part}" for g, part in zip(comp.groups, parts)]),
            nl=False)


def _explain_one(loaded: Trace, fmt: str, cwd: str, budget: int | None) -> str:
    """One trace's explanation in `fmt`."""
    explanation = explain_trace(loaded)
    try:
        suggestions = suggest(loaded, explanation, cwd, budget)
    except ValueError as e:  # the budget cannot be met at all
        raise UsageProblem(str(e)) from None
    if fmt == "json":
        return render_explain_json(explanation, suggestions)
    if fmt == "markdown":
        return render_explain_markdown(explanation, suggestions, cwd)
    return render_explain_text(explanation, suggestions, cwd)


@cli.command()
@click.argument("before", type=click.Path(dir_okay=False))
@click.argument("after", type=click.Path(dir_okay=False))
def diff(before: str, after: str) -> None:
    """Compare two saved traces: total time, each memcpy line, the event rows and the sync
    copy paths that changed.

    BEFORE and AFTER may each stand for the traces of several ranks (a quoted glob, or the
    name given to `profile -o`): each rank is compared with the same rank, then all ranks
    merged, and a side whose ranks make different sync copies is flagged."""
    b, b_names = _load_many((before,))
    a, a_names = _load_many((after,))
    cwd = os.getcwd()
    if len(b) == 1 and len(a) == 1:
        click.echo(render_diff(compare(b[0], a[0]), b_names[0], a_names[0], cwd))
        return
    parts = []
    if len(b) == len(a):  # in rank order (see _load_many): rank K with rank K
        for i in range(len(b)):
            parts.append(f"== {rank_label(b[i].meta.rank, i)} ==\n"
                         + render_diff(compare(b[i], a[i]), b_names[i], a_names[i], cwd))
    else:
        parts.append(f"{len(b)} traces before, {len(a)} after: compared merged only\n")
    parts.append("== all ranks (merged) ==\n"
                 + render_diff(compare(merge_ranks(b), merge_ranks(a)),
                               f"{before} ({len(b)} traces)", f"{after} ({len(a)} traces)",
                               cwd))
    for side, name, traces in (("Before", before, b), ("After", after, a)):
        comp = compare_ranks(traces)
        if not comp.uniform:
            parts.append(f"{side} ({name}): " + "\n".join(render_differences_text(comp, cwd)))
    click.echo("\n".join(parts))


@cli.command(name="check")
@click.argument("traces", nargs=-1, type=click.Path(dir_okay=False))
@_gate_options
@click.option("--format", "fmt", type=click.Choice(CHECK_FORMATS), default="text",
              show_default=True, help="Output format (github: workflow annotations).")
@click.option("-o", "--output", metavar="PATH", default=None,
              help="Write the result here instead of stdout.")
def check_cmd(traces: tuple[str, ...], limits, baseline, tolerances, allow, config_path,
              fmt: str, output: str | None) -> None:
    """Gate a saved TRACE: thresholds (--max, [tool.memcpy-doctor]) and a baseline.
    Exit status 0: passed; 1: a gate failed; 2: usage error or unreadable input.

    Several TRACES (the ranks of one run) are gated each on its own, each rank against the
    same rank's baseline where there is one; it fails when any rank fails."""
    config = _gate_config(limits, tolerances, allow, baseline, config_path)
    if not config.active:
        raise UsageProblem("nothing to check: give --max NAME=VALUE or --baseline, or set "
                           "[tool.memcpy-doctor] in pyproject.toml")
    loaded, names = _load_many(traces or (DEFAULT_TRACE_PATH,))
    passed, text = _run_gates_many(loaded, names, config, fmt)
    _emit(text, output)
    sys.exit(0 if passed else EXIT_GATE_FAILED)


@cli.command()
@click.option("-o", "--output", metavar="FILE", default=calib.DEFAULT_CALIBRATED_PROFILE,
              show_default=True, help="Where to write the measured device profile (JSON).")
@click.option("--quick", is_flag=True, help="Fewer sizes and repeats (seconds, not a minute).")
@click.option("--measurements", metavar="FILE", default=None,
              help="Also write the raw measurements (JSON), to fit again or compare later.")
def calibrate(output: str, quick: bool, measurements: str | None) -> None:
    """Measure this machine's GPU (copies each way pinned and pageable, launch and sync
    latency, matmul FLOP/s, memory bandwidth) and write a device profile that
    `profile --device sim --device-profile FILE` uses. Needs a CUDA GPU."""
    import json
    from .core.costmodel import load_profile
    for path in (output, measurements):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageProblem(f"{path}: directory {os.path.dirname(path)} does not exist")
    try:
        measured = calib.measure(quick, lambda msg: click.echo(f"memcpy-doctor: calibrate: "
                                                              f"{msg}", err=True))
        base = load_profile(calib.base_profile_name(measured["device"]["name"]))
        profile = calib.build_profile(measured, base)
    except calib.CalibrationError as e:
        raise UsageProblem(str(e)) from None
    if measurements:
        _emit(json.dumps(measured, indent=1) + "\n", measurements)
    _emit(json.dumps(profile, indent=2) + "\n", output)
    click.echo(f"memcpy-doctor: device profile of {profile['name']} written to {output}",
               err=True)


def _emit(text: str, output: str | None) -> None:
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise UsageProblem(f"-o {output}: {e.strerror or e}") from None


def main(argv: list[str] | None = None) -> None:
    """Entry point: click's usage errors become one line on stderr and exit status 2."""
    try:
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
