"""The files the commands read and write: saved traces, named the way a user names them, and
text outputs.

A trace argument is one file, a glob, or the name given to `profile -o`, which stands for its
`.rankK` traces (see rankenv.expand_traces). Everything that goes wrong here is something the
user can fix on the command line, so it is raised as InputError, whose message is the one
line the CLI prints after `memcpy-doctor: error:`. Nothing here prints.

`--execution-trace ET` (repeatable) gives one ExecutionTraceObserver file per torch.profiler
trace among the arguments, for exact producers (kineto/et.py). Each torch.profiler trace
takes the ET recorded by the same process: the one whose `pid` is that of the trace's ops,
when exactly one is; otherwise the ETs go with the torch.profiler traces in the order both
are given (`diff`: BEFORE's, then AFTER's). A pair that is not of one run is refused when the
two are joined.

Several traces read together are the ranks of one run (`one_run`): each with its own rank,
alike in what every rank of a run shares (simulated or measured, the device, the world size,
torch.profiler's run-wide `distributedInfo`, the command), begun within RUN_START_SPREAD_S of
each other. Files of different runs are refused with one line naming the difference, unless
the user says `--allow-mixed`.
"""

from __future__ import annotations

import os
import re
import time

from ..core.defaults import RUN_START_SPREAD_S, UNRECORDED_DEVICE
from ..kineto.sniff import is_kineto_file
from ..core.trace import Meta, Trace, TraceError
from .rankenv import RankError, expand_traces, rank_path


class InputError(Exception):
    """What the user gave (an option, a path, a trace, the environment) cannot be used.

    Raised by the code under run/ that the commands call; the message is one line naming
    the problem, which the CLI shows as a usage error (exit status 2)."""


def load_trace(path: str) -> Trace:
    """The trace saved at `path` (memcpy-doctor's, or torch.profiler's `.json`/`.json.gz`,
    recognised by content); InputError when it is missing or unreadable, because a trace the
    user named is a usage error, not a crash."""
    try:
        if is_kineto_file(path):  # a torch.profiler trace, read as one of ours
            from ..kineto.reader import load_any  # only then: a CI gate's trace needs none
            return load_any(path)
        return Trace.load(path)
    except TraceError as e:
        raise InputError(str(e)) from None


def load_traces(args: tuple[str, ...] | list[str],
                execution_traces: tuple[str, ...] | list[str] = (),
                allow_mixed: bool = False) -> tuple[list[Trace], list[str]]:
    """The traces `args` name (folders, globs and rank traces expanded) and their file names,
    in rank order when every one has a rank, so that rank K of one run meets rank K of
    another; the torch.profiler ones joined to `execution_traces` (see the module
    docstring). InputError when a glob or folder holds no trace, a trace cannot be read, or
    several are not the ranks of one run (one_run) and `allow_mixed` is not given."""
    return load_trace_groups([args], execution_traces, allow_mixed)[0]


def load_trace_groups(groups: list[tuple[str, ...] | list[str]],
                      execution_traces: tuple[str, ...] | list[str] = (),
                      allow_mixed: bool = False) -> list[tuple[list[Trace], list[str]]]:
    """load_traces for several groups of arguments (diff's two sides), which share the
    execution traces: the ETs go with the torch.profiler traces of all groups in turn. Each
    group must be one run's ranks unless `allow_mixed`."""
    try:
        named = [expand_traces(list(args)) for args in groups]
    except RankError as e:
        raise InputError(str(e)) from None
    flat = load_all([n for names in named for n in names], execution_traces)
    out = []
    for names in named:
        traces, flat = flat[:len(names)], flat[len(names):]
        if not allow_mixed:
            one_run(traces, names)
        if len(traces) > 1 and all(t.meta.rank is not None for t in traces):
            order = sorted(range(len(traces)), key=lambda i: traces[i].meta.rank)
            traces, names = [traces[i] for i in order], [names[i] for i in order]
        out.append((traces, names))
    return out


def load_all(names: list[str], execution_traces: tuple[str, ...] | list[str] = ()
             ) -> list[Trace]:
    """The traces at `names`, in that order, each torch.profiler one joined to its execution
    trace when `execution_traces` are given (one each). InputError otherwise."""
    if not execution_traces:
        return [load_trace(n) for n in names]
    kineto = [n for n in names if is_kineto_file(n)]
    if len(kineto) != len(execution_traces):
        what = (f"{len(kineto)} torch.profiler traces" if kineto else
                "no torch.profiler trace (memcpy-doctor traces need none)")
        raise InputError(f"--execution-trace: {len(execution_traces)} given for {what}; "
                         "give one per torch.profiler trace")
    from ..kineto.reader import (is_kineto, kineto_pid, kineto_trace, read_execution_trace,
                                 read_json)
    try:
        ets = [read_execution_trace(p) for p in execution_traces]
        free = list(range(len(ets)))
        out = []
        for n in names:
            if n not in kineto:
                out.append(load_trace(n))
                continue
            data = read_json(n)
            if not is_kineto(data):
                raise InputError(f"{n}: not a torch.profiler trace (--execution-trace goes "
                                 "with one)")
            pid = kineto_pid(data)
            mine = [i for i in free if pid is not None and ets[i].pid == pid]
            at = kineto.index(n)
            i = mine[0] if len(mine) == 1 else at if at in free else free[0]
            free.remove(i)
            out.append(kineto_trace(data, n, ets[i]))
            del data
        return out
    except TraceError as e:
        raise InputError(str(e)) from None


def one_run(traces: list[Trace], names: list[str]) -> None:
    """InputError, one line naming the first difference found, unless `traces` (at `names`)
    can be the ranks of one run: see the module docstring."""
    for i in range(1, len(traces)):
        for j in range(i):
            why = _not_one_run(traces[j].meta, traces[i].meta)
            if why:
                raise InputError(f"{names[j]} and {names[i]} are not the ranks of one run: "
                                 f"{why} (give one run's traces, or --allow-mixed to read "
                                 "them together all the same)")


#: An argument that torch.distributed.launch gives each rank its own value of.
_LOCAL_RANK_ARG = re.compile(r"--local[-_]rank(=.*)?\Z")


def _not_one_run(a: Meta, b: Meta) -> str:
    """How the runs of two traces' metas differ ("" when they may be one run's ranks)."""
    if a.simulated != b.simulated:
        return "one was simulated, the other measured on a GPU"
    if a.device_name != b.device_name and UNRECORDED_DEVICE not in (a.device_name,
                                                                      b.device_name):
        return f"device {a.device_name} vs {b.device_name}"
    if None not in (a.world_size, b.world_size) and a.world_size != b.world_size:
        return f"world size {a.world_size} vs {b.world_size}"
    for key in sorted(set(a.distributed or {}) & set(b.distributed or {})):
        if a.distributed[key] != b.distributed[key]:
            return f"distributedInfo {key} {a.distributed[key]} vs {b.distributed[key]}"
    own = [[c for c in m.command if not _LOCAL_RANK_ARG.match(c)] for m in (a, b)]
    if all(own) and own[0] != own[1]:
        return f"command `{' '.join(own[0])}` vs `{' '.join(own[1])}`"
    if a.rank is None or b.rank is None:
        return "a trace without a rank (a run of one process)"
    if a.rank == b.rank:
        return f"both are rank {a.rank}"
    if None not in (a.started_ns, b.started_ns):
        apart = abs(a.started_ns - b.started_ns) / 1e9
        if apart > RUN_START_SPREAD_S:
            return (f"begun {_span(apart)} apart ({_when(a.started_ns)} vs "
                    f"{_when(b.started_ns)})")
    return ""


def _span(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


def import_traces(args: tuple[str, ...] | list[str], execution_traces: tuple[str, ...],
                  output: str) -> list[str]:
    """`memcpy-doctor import`: save the torch.profiler traces `args` name (one run's ranks:
    `output` named by rank, rankenv.rank_path) as memcpy-doctor traces; the line to say for
    each. InputError for a trace that is memcpy-doctor's already, or one not written."""
    loaded, names = load_traces(args, execution_traces)
    ours = [n for n in names if not is_kineto_file(n)]
    if ours:
        raise InputError(f"import: {ours[0]}: give torch.profiler traces (a memcpy-doctor "
                         "trace needs no import)")
    said = []
    for t in loaded:
        path = output if len(loaded) == 1 else rank_path(output, t.meta.rank)
        try:
            t.save(path)
        except OSError as e:
            raise InputError(f"-o {path}: cannot write ({e.strerror or e})") from None
        said.append(f"memcpy-doctor: {t.summary.memcpy_all.calls} copies "
                    f"({t.summary.memcpy_sync.calls} waited for) from {t.meta.device_name}, "
                    f"written to {path}")
    return said


def write_text(text: str, path: str, option: str = "-o", shown: str | None = None) -> None:
    """Write `text` to the file `path` (an `-o`, `--chrome-trace` or `--html` the user
    gave, `shown` as they named it); InputError naming the option when it cannot be."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise InputError(f"{option} {shown or path}: {e.strerror or e}") from None


def write_html_report(traces: list[Trace], names: list[str], path: str,
                      shown: str | None = None) -> str:
    """`--html PATH`: the HTML report of `traces` (render/html.py) written there; the line
    that says so. InputError when it cannot be written."""
    from ..render.html import render_html  # (only then: the other outputs need none of it)
    write_text(render_html(traces, names, os.getcwd()), path, "--html", shown)
    return f"memcpy-doctor: HTML report written to {shown or path}"
