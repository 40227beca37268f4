"""The pytest plugin: copy budgets on tests, a profile fixture, the simulated GPU on CPU runners.

    @pytest.mark.max_sync_copies(0)
    def test_step(): ...

    @pytest.mark.memcpy_budget(sync_calls=1, bytes_htod="1MiB", memcpy_ratio="5%")
    def test_epoch(): ...

    def test_profile(memcpy_doctor_profile):
        step()
        trace = memcpy_doctor_profile.stop()   # or read .trace in a later fixture's teardown

A test is profiled when it carries one of the markers or asks for the fixture; only its body is
(not its fixtures' setup or teardown: budgets count what the test itself does). After the body
the budgets are checked with `analysis.gates.check` and a failure shows what `memcpy-doctor
check` prints. A profiled test whose body raced with a non_blocking copy (the host touched its
memory before waiting for it: tracer/races.py) fails too, unless marked `allow_races`. The
tracer is stopped after every body, also when it raised.

Options (each also an ini option of the same name without the dashes, `memcpy_doctor_device
= sim`; the command line wins): `--memcpy-doctor-device auto|cuda|sim` (`auto`, the default,
is cuda when torch sees one, else the simulated GPU for profiled tests only; `sim` puts the
simulated GPU in place for the whole session, before collection, so that module-level device
choices and `skipif(not torch.cuda.is_available())` see a GPU and every test runs its GPU code
paths on it, unprofiled tests through modes that record nothing: tracer/sim/session.py),
`--memcpy-doctor-report` (a line per profiled test in the terminal summary),
`--memcpy-doctor-strict` (a profiled body that ran no device op fails; without it, a warning
says its budget proves nothing) and `--memcpy-doctor-json PATH` (every profiled test's
metrics, budget and verdict as JSON, written by the process that reports: xdist's controller).

This module imports nothing heavy itself: torch and the tracer are imported when a test is
profiled (importing the `memcpy_doctor` package, though, imports torch today).
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

from .core.defaults import DEFAULT_DEVICE, DEVICE_CHOICES

MARKERS = {
    "max_sync_copies": "max_sync_copies(n): profile the test body with memcpy-doctor and fail "
                       "when it makes more than n copies the host waits for (sync_calls)",
    "memcpy_budget": "memcpy_budget(**limits): profile the test body with memcpy-doctor and "
                     "fail when a gate metric exceeds its limit, e.g. sync_calls=0, "
                     "bytes_htod='1MiB', sync_time='2ms', memcpy_ratio='5%' (the metrics and "
                     "units of `memcpy-doctor check --max`)",
    "allow_races": "allow_races: a profiled test passes although the host touched a "
                   "non_blocking copy's memory before waiting for it (by default such a race "
                   "fails it)",
}

_LIMITS = pytest.StashKey[dict]()
_PROFILE = pytest.StashKey[Any]()
_SESSION_SIM = pytest.StashKey[Any]()

#: The user property a profiled test's report carries: its one-line summary (xdist sends it to
#: the controller, junitxml writes it as a property).
PROPERTY = "memcpy_doctor"
#: With --memcpy-doctor-json: the property that carries the test's result, as JSON text.
RESULT_PROPERTY = "memcpy_doctor_result"
#: Version of the --memcpy-doctor-json file's format.
RESULTS_SCHEMA_VERSION = 1

NO_DEVICE_OP = "ran no device op; its copy budget proves nothing"


class NoDeviceOpWarning(UserWarning):
    """A profiled test body ran every op on the host: its budget held trivially."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memcpy-doctor", "memcpy-doctor: host<->GPU copy budgets")
    group.addoption("--memcpy-doctor-device", dest="memcpy_doctor_device",
                    choices=DEVICE_CHOICES, default=None,
                    help="device of the tests memcpy-doctor profiles: cuda (the real GPU), sim "
                         "(the simulated GPU, also on a CPU-only runner, in place for the whole "
                         "session: collection and every test see a GPU) or auto (cuda when "
                         f"torch sees one, else sim for profiled tests only). Default: "
                         f"{DEFAULT_DEVICE}")
    group.addoption("--memcpy-doctor-report", dest="memcpy_doctor_report", action="store_true",
                    default=None,
                    help="print a one-line copy summary per profiled test in the terminal "
                         "summary")
    group.addoption("--memcpy-doctor-strict", dest="memcpy_doctor_strict", action="store_true",
                    default=None,
                    help="fail a profiled test whose body ran no op on the device (its "
                         "budget proves nothing); without it, a warning says so")
    group.addoption("--memcpy-doctor-json", dest="memcpy_doctor_json", metavar="PATH",
                    default=None,
                    help="write every profiled test's metrics, budget and verdict as JSON")
    parser.addini("memcpy_doctor_device",
                  f"as --memcpy-doctor-device: {', '.join(DEVICE_CHOICES)}", default=None)
    parser.addini("memcpy_doctor_report", "as --memcpy-doctor-report", type="bool",
                  default=False)
    parser.addini("memcpy_doctor_strict", "as --memcpy-doctor-strict", type="bool",
                  default=False)
    parser.addini("memcpy_doctor_json", "as --memcpy-doctor-json", default=None)


def setting(config: pytest.Config, name: str, options: Any = None) -> Any:
    """An option's value: the command line's, else the ini file's (`options`: the namespace to
    read the command line from, before it is fully parsed)."""
    value = getattr(options if options is not None else config.option, name, None)
    if value is None:
        value = config.getini(name) or None
    if name == "memcpy_doctor_device":
        value = value.strip() if isinstance(value, str) else value
        if value is None:
            return DEFAULT_DEVICE
        if value not in DEVICE_CHOICES:
            raise pytest.UsageError(f"memcpy_doctor_device = {value}: choose one of "
                                    f"{', '.join(DEVICE_CHOICES)}")
    return value


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """With device sim, the simulated GPU is in place before the first conftest.py is
    imported (pytest imports the initial ones before pytest_configure)."""
    options = early_config.known_args_namespace
    if getattr(options, "help", False) or getattr(options, "version", False):
        return
    if setting(early_config, "memcpy_doctor_device", options) == "sim":
        _enter_session_sim(early_config)


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    device = setting(config, "memcpy_doctor_device")
    json_path = setting(config, "memcpy_doctor_json")
    if json_path is not None:
        json_path = config.invocation_params.dir / json_path
        if not json_path.parent.is_dir():
            raise pytest.UsageError(f"--memcpy-doctor-json {json_path}: no such directory "
                                    f"{json_path.parent}")
    report = bool(setting(config, "memcpy_doctor_report"))
    if report or json_path is not None:
        config.pluginmanager.register(_Results(config, report, json_path),
                                      "memcpy_doctor_report")
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise pytest.UsageError("--memcpy-doctor-device cuda: torch sees no CUDA device "
                                    "here (use --memcpy-doctor-device sim)")
    elif device == "sim":
        _enter_session_sim(config)  # (when the plugin was registered after the conftests)


def _enter_session_sim(config: pytest.Config) -> None:
    """The simulated GPU in place until the config is cleaned up (after pytest_unconfigure,
    also when pytest stops on an error). A process that has one in place already (a pytester
    run inside a session that has it) keeps it."""
    if _SESSION_SIM in config.stash:
        return
    from .tracer.sim.session import SessionSim, session_sim
    if session_sim() is not None:
        config.stash[_SESSION_SIM] = None
        return
    sim = config.stash[_SESSION_SIM] = SessionSim().enter()
    config.add_cleanup(sim.exit)


# ----- which tests, which budgets -----

def budget_limits(item: pytest.Item) -> dict[str, float] | None:
    """The limits the item's markers set ({metric: limit}), None without a marker. The
    closest marker wins per metric (function over class over module). Values are read as
    `memcpy-doctor check --max` reads them; a marker that cannot be read raises GateError."""
    from .analysis.gates import METRICS, GateError, parse_value
    limits: dict[str, float] = {}
    found = False
    for mark in item.iter_markers():
        if mark.name == "max_sync_copies":
            found = True
            n = _single_arg(mark)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise GateError(f"max_sync_copies({n!r}): give a whole number >= 0")
            limits.setdefault("sync_calls", n)
        elif mark.name == "memcpy_budget":
            found = True
            if mark.args:
                raise GateError("memcpy_budget takes keywords only, e.g. "
                                "memcpy_budget(sync_calls=0, bytes_htod='1MiB')")
            if not mark.kwargs:
                raise GateError("memcpy_budget(): name at least one metric, e.g. sync_calls=0")
            for name, value in mark.kwargs.items():
                if name not in METRICS:
                    raise GateError(f"memcpy_budget: unknown metric {name!r}; known: "
                                    f"{', '.join(METRICS)}")
                if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                    raise GateError(f"memcpy_budget({name}={value!r}): give a number or a "
                                    "string such as '1MiB', '2ms', '5%'")
                limits.setdefault(name, parse_value(METRICS[name], _as_text(value)))
    return limits if found else None


def _as_text(value: int | float | str) -> str:
    """A marker's value as `--max` would spell it (floats never in exponent notation)."""
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        from decimal import Decimal
        return format(Decimal(repr(value)), "f")
    return str(value)


def _single_arg(mark: pytest.Mark) -> Any:
    values = list(mark.args) + list(mark.kwargs.values())
    if len(values) != 1:
        from .analysis.gates import GateError
        raise GateError(f"{mark.name} takes one argument, e.g. {mark.name}(0)")
    return values[0]


def _profiled(item: pytest.Item) -> bool:
    return (_LIMITS in item.stash
            or "memcpy_doctor_profile" in getattr(item, "fixturenames", ()))


# ----- the profile -----

@functools.lru_cache(maxsize=None)
def profile_class() -> type:
    """The class of what the fixture yields (made on first use: it imports the tracer)."""
    from .api import Profile

    class TestProfile(Profile):
        """`memcpy_doctor.profiler()`'s Profile, started and stopped by the plugin around the
        test body. `stop()` ends profiling early and returns the trace, for assertions in the
        body (the rest of the body then runs untraced: on the session's simulated GPU with
        device sim, else without one)."""

        __test__ = False  # not a test class

        def stop(self) -> Any:
            return self.tracer.stop()

    return TestProfile


def _new_profile(config: pytest.Config) -> Any:
    from .core.defaults import DEFAULT_SORT_KEY
    from .tracer import Tracer
    tracer = Tracer(device=setting(config, "memcpy_doctor_device"))
    return profile_class()(tracer, DEFAULT_SORT_KEY, "All")


def _profile_of(item: pytest.Item) -> Any:
    prof = item.stash.get(_PROFILE, None)
    if prof is None:
        prof = item.stash[_PROFILE] = _new_profile(item.config)
    return prof


@pytest.fixture
def memcpy_doctor_profile(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The memcpy-doctor profile of this test's body (a `memcpy_doctor.api.Profile`): the
    tracer runs while the body does; `.trace` and `.report()` work once it has ended (in a
    later fixture's teardown), or call `.stop()` in the body to end it there."""
    yield _profile_of(request.node)


# ----- the hooks -----

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    from .analysis.gates import GateError
    _drop(item, _PROFILE)  # a rerun gets a fresh profile
    _drop(item, _LIMITS)
    try:
        limits = budget_limits(item)
    except GateError as e:
        problem = str(e)
    else:
        problem = None
    if problem is not None:
        pytest.fail(f"memcpy-doctor: {problem}", pytrace=False)
    if limits is not None:
        item.stash[_LIMITS] = limits


# Old-style wrappers: they work with every pluggy pytest 7 may come with (this module is
# loaded by every pytest run where memcpy-doctor is installed, so it must import everywhere).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not _profiled(item):
        yield
        return
    prof = _profile_of(item)
    prof.tracer.start()  # raising here fails the test before its body runs
    outcome = yield
    trace = prof.tracer.stop()  # whatever the body did; a no-op if it stopped the tracer
    limits = item.stash.get(_LIMITS, None) or {}
    if outcome.excinfo is not None:
        _summarize(item, trace, limits, "not checked (the test failed)")
        return
    idle = trace is not None and not device_used(trace)
    strict = idle and bool(setting(item.config, "memcpy_doctor_strict"))
    raced = (trace is not None and bool(trace.races)
             and item.get_closest_marker("allow_races") is None)
    if not limits:
        _summarize(item, trace, limits, "FAILED" if strict or raced else "none", idle)
        checked = None
    else:
        from .analysis.gates import check
        root = str(item.config.rootpath)
        checked = check(trace, limits=limits, root=root)
        passed = checked.passed and not strict and not raced
        _summarize(item, trace, limits, "passed" if passed else "FAILED", idle)
    if checked is not None and not checked.passed:
        from .render.check import render_check_text
        _fail(outcome, render_check_text(checked, str(item.config.rootpath)))
    elif raced:
        from .render.check import race_message
        _fail(outcome, "memcpy-doctor: the host touched a copy still in flight (mark the "
                       "test allow_races to allow it):\n" + "\n".join(
                           f"  {race_message(r, str(item.config.rootpath))}"
                           for r in trace.races))
    elif strict:
        _fail(outcome, f"memcpy-doctor: {item.nodeid} {NO_DEVICE_OP} (--memcpy-doctor-strict)"
                       f"\n{_idle_hint(item.config)}")
    elif idle:
        warnings.warn_explicit(f"memcpy-doctor: {NO_DEVICE_OP}. {_idle_hint(item.config)}",
                               NoDeviceOpWarning, str(item.path), (item.location[1] or 0) + 1)


def device_used(trace: Any) -> bool:
    """Whether a profiled run did anything on the device: an op there, or a copy."""
    return bool(trace.copies) or any(op.device != "cpu" for op in trace.ops)


def _idle_hint(config: pytest.Config) -> str:
    if setting(config, "memcpy_doctor_device") == "sim":
        return ("Every op ran on the host: does the test choose a host device, or one from "
                "a check that is False here?")
    return ("Every op ran on the host: a device chosen at import time (`dev = \"cuda\" if "
            "torch.cuda.is_available() else \"cpu\"`) sees this machine; "
            "--memcpy-doctor-device sim puts the simulated GPU in place from collection on.")


def _fail(outcome: Any, message: str) -> None:
    """Fail the test with `message` alone (no traceback), as `memcpy-doctor check` prints it."""
    failure = pytest.fail.Exception(message, pytrace=False)
    if hasattr(outcome, "force_exception"):  # pluggy >= 1.1
        outcome.force_exception(failure)
    else:
        raise failure


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    _drop(item, _PROFILE)  # the fixtures' teardown has read it; do not keep it for the session


def _drop(item: pytest.Item, key: pytest.StashKey) -> None:
    if key in item.stash:
        del item.stash[key]


def summary_line(trace: Any, budget: str) -> str:
    """A profiled test in one line: copies, sync copies, bytes, copy time of the total, the
    budget's verdict and the device."""
    from .analysis.gates import METRICS
    from .core.units import format_value

    def value(name: str) -> float:
        return METRICS[name].value(trace, trace.copies)

    device = "simulated GPU" if trace.meta.simulated else f"{trace.meta.device_name}"
    return (f"{int(value('copy_calls'))} copies ({int(value('sync_calls'))} sync), "
            f"{format_value('bytes', value('bytes'))}, memcpy "
            f"{format_value('time', value('memcpy_time'))} of "
            f"{format_value('time', value('total_time'))}; budget {budget}; {device}")


def _summarize(item: pytest.Item, trace: Any, limits: dict[str, float], budget: str,
               idle: bool = False) -> None:
    if trace is None:
        return
    item.user_properties.append((PROPERTY, summary_line(trace, budget)))
    if setting(item.config, "memcpy_doctor_json") is not None:
        item.user_properties.append((RESULT_PROPERTY, json.dumps(
            result_of(item.nodeid, trace, limits, budget, idle))))


def result_of(nodeid: str, trace: Any, limits: dict[str, float], budget: str,
              idle: bool) -> dict[str, Any]:
    """A profiled test's entry in the --memcpy-doctor-json file: every gate metric (in the
    file's `units`), the budget's limits, the verdict (passed, failed, none: no budget, not
    checked: the test failed) and whether the body ran anything on the device."""
    from .analysis.gates import METRICS
    metrics = {}
    for name, metric in METRICS.items():
        value = metric.value(trace, trace.copies)
        metrics[name] = int(value) if metric.kind in ("count", "bytes", "time") else value
    verdict = "not checked" if budget.startswith("not checked") else budget.lower()
    return {"test": nodeid, "verdict": verdict, "metrics": metrics, "budget": dict(limits),
            "device": trace.meta.device, "simulated": trace.meta.simulated,
            "device_name": trace.meta.device_name, "device_used": not idle,
            "warning": NO_DEVICE_OP if idle else None}


class _Results:
    """--memcpy-doctor-report and --memcpy-doctor-json: collects the profiled tests' lines and
    results as reports arrive (from xdist workers too); prints the lines in the terminal
    summary and writes the JSON file at the session's end."""

    def __init__(self, config: pytest.Config, report: bool, json_path: Path | None) -> None:
        self.config = config
        self.report = report
        self.json_path = json_path
        self.lines: list[str] = []
        self.results: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                self.lines.append(f"{report.nodeid}: {value}")
            elif name == RESULT_PROPERTY:
                self.results.append(json.loads(value))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.json_path is None or hasattr(self.config, "workerinput"):
            return  # (an xdist worker: its controller writes the file)
        from .analysis.gates import METRICS
        units = {"count": "calls", "bytes": "bytes", "time": "ns", "ratio": "fraction"}
        document = {"schema_version": RESULTS_SCHEMA_VERSION,
                    "units": {name: units.get(m.kind, m.kind) for name, m in METRICS.items()},
                    "tests": self.results}
        self.json_path.write_text(json.dumps(document, indent=2) + "\n")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.report:
            return
        terminalreporter.write_sep("-", "memcpy-doctor")
        if not self.lines:
            terminalreporter.write_line(
                "no test was profiled (mark one with max_sync_copies or memcpy_budget, or ask "
                "for the memcpy_doctor_profile fixture)")
        for line in self.lines:
            terminalreporter.write_line(line)
