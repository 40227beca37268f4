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
check` prints. The tracer is stopped after every body, also when it raised.

Options: `--memcpy-doctor-device auto|cuda|sim` (the device profiled tests run on; `sim` runs
their GPU code on a CPU-only runner, `auto` is cuda when torch sees one, else sim) and
`--memcpy-doctor-report` (a line per profiled test in the terminal summary).

This module imports nothing heavy itself: torch and the tracer are imported when a test is
profiled (importing the `memcpy_doctor` package, though, imports torch today).
"""

from __future__ import annotations

import functools
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
}

_LIMITS = pytest.StashKey[dict]()
_PROFILE = pytest.StashKey[Any]()

#: The user property a profiled test's report carries: its one-line summary (xdist sends it to
#: the controller, junitxml writes it as a property).
PROPERTY = "memcpy_doctor"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memcpy-doctor", "memcpy-doctor: host<->GPU copy budgets")
    group.addoption("--memcpy-doctor-device", dest="memcpy_doctor_device",
                    choices=DEVICE_CHOICES, default=DEFAULT_DEVICE,
                    help="device of the tests memcpy-doctor profiles: cuda (the real GPU), sim "
                         "(the simulated GPU, also on a CPU-only runner) or auto (cuda when "
                         "torch sees one, else sim). Default: %(default)s")
    group.addoption("--memcpy-doctor-report", dest="memcpy_doctor_report", action="store_true",
                    default=False,
                    help="print a one-line copy summary per profiled test in the terminal "
                         "summary")


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    if config.getoption("memcpy_doctor_report", False):
        config.pluginmanager.register(_Report(config), "memcpy_doctor_report")
    if config.getoption("memcpy_doctor_device", DEFAULT_DEVICE) == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise pytest.UsageError("--memcpy-doctor-device cuda: torch sees no CUDA device "
                                    "here (use --memcpy-doctor-device sim)")


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
        body (the rest of the body then runs untraced: without the simulated GPU)."""

        __test__ = False  # not a test class

        def stop(self) -> Any:
            return self.tracer.stop()

    return TestProfile


def _new_profile(config: pytest.Config) -> Any:
    from .core.defaults import DEFAULT_SORT_KEY
    from .tracer import Tracer
    tracer = Tracer(device=config.getoption("memcpy_doctor_device", DEFAULT_DEVICE))
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
    if outcome.excinfo is not None:
        _summarize(item, trace, "not checked (the test failed)")
        return
    limits = item.stash.get(_LIMITS, None)
    if not limits:
        _summarize(item, trace, "none")
        return
    from .analysis.gates import check
    from .render.check import render_check_text
    root = str(item.config.rootpath)
    checked = check(trace, limits=limits, root=root)
    _summarize(item, trace, "passed" if checked.passed else "FAILED")
    if not checked.passed:
        _fail(outcome, render_check_text(checked, root))


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


def _summarize(item: pytest.Item, trace: Any, budget: str) -> None:
    if trace is not None:
        item.user_properties.append((PROPERTY, summary_line(trace, budget)))


class _Report:
    """--memcpy-doctor-report: collects the lines as reports arrive (from xdist workers too)
    and prints them in the terminal summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.lines: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                self.lines.append(f"{report.nodeid}: {value}")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_sep("-", "memcpy-doctor")
        if not self.lines:
            terminalreporter.write_line(
                "no test was profiled (mark one with max_sync_copies or memcpy_budget, or ask "
                "for the memcpy_doctor_profile fixture)")
        for line in self.lines:
            terminalreporter.write_line(line)
