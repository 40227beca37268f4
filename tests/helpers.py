"""Hand-built traces with round numbers, shared by the tests.

Import it from a test module as ``from helpers import make_trace`` (pytest puts ``tests/`` on
``sys.path`` because the folder has no ``__init__.py``).

``make_trace()`` returns a fresh, small ``Trace`` every call (tests may mutate it). All times are
integer nanoseconds chosen so every figure in the report is a round number:

Events (chosen so each Event Summary sort key gives a different order)::

    name                      calls  cpu_ns     gpu_ns     total_ns   min_ns   max_ns   ave_ns
    aten::mm                     10  1_000_000  3_000_000  4_000_000  300_000  800_000  400_000
    aten::add                    20  2_000_000  1_000_000  3_000_000  100_000  300_000  150_000
    GpuMemcpySync:CPU->GPU        4  1_500_000    500_000  2_000_000  400_000  700_000  500_000
    GpuMemcpyAsync:GPU->CPU       5    500_000    500_000  1_000_000   50_000  350_000  200_000

Copies (host_ns + device_ns = time_ns, Paddle's event total)::

    direction sync   pinned trigger calls bytes      host_ns    device_ns  time_ns
    HtoD      True   False  to          4     4_096  1_500_000  500_000    2_000_000
    DtoH      True   False  item       10        40    900_000  100_000    1_000_000
    DtoH      False  True   to          5 2_000_000    500_000  500_000    1_000_000

With the default ``total_ns=10_000_000`` the summary is: computation 5_000_000 (sum of event
CPU times), overhead 5_000_000; memcpy all 19 calls 4_000_000 ns, async 5 calls 1_000_000 ns,
sync 14 calls 3_000_000 ns.

Note the event rows are not derived from the copy records (there is no
``GpuMemcpySync:GPU->CPU`` row for the ``item`` copy): the trace is hand-built, and the summary
is computed from ``events`` and ``copies`` exactly as ``summarize`` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import signal
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from memcpy_doctor.core.summary import summarize
from memcpy_doctor.core.trace import (CopyRecord, EventRow, Meta, OpRecord, OpRef, Site, Trace,
                                      WaitRecord)

#: The project directory every site in the default trace lies under.
PROJECT_DIR = "/work/proj"

#: Total time of the default trace.
TOTAL_NS = 10_000_000

TRAIN_STEP_TO = Site("/work/proj/train.py", 42, "train_step")
TRAIN_STEP_ITEM = Site("/work/proj/train.py", 50, "train_step")
LOG_METRICS = Site("/work/proj/train.py", 60, "log_metrics")
LOG_METRICS_READ = Site("/work/proj/train.py", 61, "log_metrics")
SYNC_SITE = Site("/work/proj/train.py", 70, "train_step")
MAIN = Site("/work/proj/train.py", 100, "main")
MAKE_BATCH = Site("/work/proj/data.py", 10, "make_batch")
FORWARD_MM = Site("/work/proj/model.py", 20, "forward")
FORWARD_ADD = Site("/work/proj/model.py", 25, "forward")


def make_meta(**overrides: Any) -> Meta:
    """The default meta (simulated A100), with any Meta field replaced by `overrides`."""
    meta = Meta(device="sim", simulated=True, device_name="NVIDIA A100-SXM4-80GB",
                device_profile=None, torch_version="2.13.0",
                command=["memcpy-doctor", "profile", "train.py"], exit_status=0)
    return dataclasses.replace(meta, **overrides)


def make_events() -> list[EventRow]:
    return [
        EventRow("aten::mm", 10, 1_000_000, 3_000_000, 300_000, 800_000),
        EventRow("aten::add", 20, 2_000_000, 1_000_000, 100_000, 300_000),
        EventRow("GpuMemcpySync:CPU->GPU", 4, 1_500_000, 500_000, 400_000, 700_000),
        EventRow("GpuMemcpyAsync:GPU->CPU", 5, 500_000, 500_000, 50_000, 350_000),
    ]


def make_ops() -> list[OpRecord]:
    return [
        OpRecord("aten::mm", "cuda:0", FORWARD_MM, 10, 1_000_000, 3_000_000),
        OpRecord("aten::add", "cuda:0", FORWARD_ADD, 20, 2_000_000, 1_000_000),
    ]


def make_copies() -> list[CopyRecord]:
    return [
        # h.to("cuda"): a host tensor made by arange, first read by mm on the device.
        CopyRecord(direction="HtoD", sync=True, pinned=False, trigger="to", calls=4,
                   bytes=4_096, host_ns=1_500_000, device_ns=500_000, site=TRAIN_STEP_TO,
                   stack=[TRAIN_STEP_TO, MAIN],
                   producer=OpRef("aten::arange", "cpu", MAKE_BATCH),
                   consumer=OpRef("aten::mm", "cuda:0", FORWARD_MM),
                   shape=[32, 32], dtype="float32"),
        # loss.item(): a Python number, so no op ever reads the result.
        CopyRecord(direction="DtoH", sync=True, pinned=False, trigger="item", calls=10,
                   bytes=40, host_ns=900_000, device_ns=100_000, site=TRAIN_STEP_ITEM,
                   stack=[TRAIN_STEP_ITEM, MAIN],
                   producer=OpRef("aten::add", "cuda:0", FORWARD_ADD), consumer=None,
                   shape=[], dtype="float32"),
        # t.to("cpu", non_blocking=True) into pinned memory.
        CopyRecord(direction="DtoH", sync=False, pinned=True, trigger="to", calls=5,
                   bytes=2_000_000, host_ns=500_000, device_ns=500_000, site=LOG_METRICS,
                   stack=[LOG_METRICS, MAIN],
                   producer=OpRef("aten::mm", "cuda:0", FORWARD_MM),
                   consumer=OpRef("aten::add", "cpu", LOG_METRICS_READ),
                   shape=[500, 1000], dtype="float32"),
    ]


def make_waits() -> list[WaitRecord]:
    return [WaitRecord("synchronize", 2, 300_000, SYNC_SITE)]


_TRACE_FIELDS = {f.name for f in dataclasses.fields(Trace)}
_META_FIELDS = {f.name for f in dataclasses.fields(Meta)}


def make_trace(**overrides: Any) -> Trace:
    """A fresh small Trace with round numbers (see the module docstring for every figure).

    Keyword overrides:
    - a Trace field (``meta``, ``summary``, ``events``, ``ops``, ``copies``, ``waits``)
      replaces it outright;
    - ``total_ns`` sets the run's total time (default ``TOTAL_NS``);
    - any Meta field (``simulated=False``, ``ended_by="interrupt"``, ``exit_status=130``, ...)
      replaces that field of the default meta (not allowed together with ``meta=``).

    Unless ``summary`` is given, it is computed with ``summarize(total_ns, events, copies)``
    from the (possibly overridden) events and copies. Unknown keywords raise TypeError.
    """
    total_ns = overrides.pop("total_ns", TOTAL_NS)
    meta_overrides = {k: overrides.pop(k) for k in list(overrides) if k in _META_FIELDS}
    unknown = set(overrides) - _TRACE_FIELDS
    if unknown:
        raise TypeError(f"make_trace: unknown overrides {sorted(unknown)}")
    if meta_overrides and "meta" in overrides:
        raise TypeError("make_trace: pass either meta= or Meta field overrides, not both")
    events = overrides.get("events", None)
    events = make_events() if events is None else events
    copies = overrides.get("copies", None)
    copies = make_copies() if copies is None else copies
    summary = overrides.get("summary") or summarize(total_ns=total_ns, events=events,
                                                     copies=copies)
    ops = overrides.get("ops", None)
    waits = overrides.get("waits", None)
    return Trace(
        meta=overrides.get("meta") or make_meta(**meta_overrides),
        summary=summary,
        events=events,
        ops=make_ops() if ops is None else ops,
        copies=copies,
        waits=make_waits() if waits is None else waits,
    )


def signals_as_default() -> None:
    """`preexec_fn` for a child process a test sends signals to: SIGINT, SIGTERM and SIGHUP get
    their default actions back. A test run from a shell's background job inherits SIGINT
    ignored (and Python then never raises KeyboardInterrupt), one under nohup SIGHUP."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@dataclasses.dataclass
class CliResult:
    status: int
    out: str
    err: str


#: Warnings a plain `python` does not print (its default filters): any other one would be a
#: line more on a real run's stderr.
_QUIET_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def cli_in_process(*args: object, cwd: str | os.PathLike | None = None) -> CliResult:
    """`memcpy-doctor ARGS` in `cwd`, run in this process through ``memcpy_doctor.cli.main``,
    the function the console script and ``python -m memcpy_doctor`` call: its exit status
    (SystemExit's code as the interpreter turns it into one), stdout and stderr. It saves the
    ~2 s a subprocess pays for ``import torch``; keep one real subprocess per command for the
    path a user runs (tests/test_cli.py and the others), and check the rest of a command's
    cases here. An exception that escapes main() (a traceback in a real run) fails the test;
    so does a warning a real run would print on stderr."""
    from memcpy_doctor.cli import main

    out, err = io.StringIO(), io.StringIO()
    where = contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext()
    with where, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            main([str(a) for a in args])
            status = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                status = e.code or 0
            else:  # sys.exit("message"): Python prints it and exits 1
                print(e.code, file=err)
                status = 1
    shown = [w for w in caught if not issubclass(w.category, _QUIET_WARNINGS)]
    assert not shown, [f"{w.category.__name__}: {w.message}" for w in shown]
    return CliResult(status, out.getvalue(), err.getvalue())


def concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """Call each function (no arguments) in a thread of its own, as many at a time as there
    are CPUs, and return their results in order; the first exception is raised. For runs of
    independent subprocesses (a profiled and a plain run of one script): most of each is
    ``import torch``, CPU bound, which the processes then do side by side."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with ThreadPoolExecutor(max_workers=max(1, min(len(calls), cpus or 1))) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]

