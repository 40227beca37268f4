"""The pytest plugin, as a user's suite meets it: small test files run by pytester, in this
process (fast; the conftest fixture then also sees any tracer, mode or patch they leave) and
once in a subprocess. The plugin is loaded with `-p memcpy_doctor.pytest_plugin` and entry
point plugins are off, so these tests mean the same before and after the `pytest11` entry
point is installed."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch
import torch._dynamo  # noqa: F401  (see below)
from click.testing import CliRunner

from memcpy_doctor import api, pytest_plugin  # noqa: F401  imported once here, not anew by
# each pytester run: the plugin makes its Profile class once, from memcpy_doctor.api, and
# `import memcpy_doctor` no longer imports the api (issue 33), so a run that imported it first
# would drop it and the next would compare against another Profile class.
# torch._dynamo, which the tracer's first start imports, registers an operator library once
# per process; pytester's in-process runs drop modules imported inside them, and a second
# import then fails ("Only a single TORCH_LIBRARY ..."). Imported here, it outlives the runs
# (the file passed only after another test module had imported it).
from memcpy_doctor.analysis.gates import METRICS
from memcpy_doctor.tracer import active_tracer

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "memcpy_doctor.pytest_plugin")
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def no_autoload(monkeypatch):
    """Entry point plugins off: with the pytest11 entry point installed, `-p` would load the
    plugin a second time under another name."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # (the plugin module is imported already, so pytest cannot rewrite its asserts: it has none)
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)
    assert active_tracer() is None
    return result


def write_test(pytester: pytest.Pytester, source: str, name: str = "test_budget") -> str:
    path = pytester.makepyfile(**{name: textwrap.dedent(source)})
    return path.name


def line_of(pytester: pytest.Pytester, filename: str, snippet: str) -> int:
    lines = (pytester.path / filename).read_text().splitlines()
    hits = [i for i, line in enumerate(lines, 1) if snippet in line]
    assert len(hits) == 1, hits
    return hits[0]


def failure_text(result: pytest.RunResult, test: str) -> str:
    """The long failure text pytest printed for `test` (between its header and the next)."""
    out = result.outlines
    start = next(i for i, line in enumerate(out) if re.fullmatch(rf"_+ {test} _+", line))
    end = next(i for i in range(start + 1, len(out))
               if re.fullmatch(r"(_+ \S+ _+|=+ .* =+|-+ .* -+)", out[i]))
    return "\n".join(out[start + 1:end]).strip("\n")


ITEM_ONCE = """
import pytest
import torch

@pytest.mark.max_sync_copies({n})
def test_item():
    x = torch.arange(4.0, device="cuda")
    total = x.sum().item()
    assert total == 6.0
"""


# ----- budgets -----

def test_one_item_fails_max_sync_copies_0_at_its_line(pytester):
    name = write_test(pytester, ITEM_ONCE.format(n=0))
    line = line_of(pytester, name, ".item()")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    text = failure_text(result, "test_item")
    assert text.splitlines()[0] == "FAIL sync_calls = 1, max 0  <- 1 > max 0"
    assert (f"  {name}:{line}: over DtoH sync copy `item`, 1 calls, 4 B; aten::sum [cuda:0] "
            f"at {name}:{line} -> -") in text.splitlines()
    assert text.splitlines()[-1] == ("memcpy-doctor check: FAILED (0 passed, 1 failed"
                                     + ("" if HAS_CUDA else "; simulated GPU") + ")")
    assert "Traceback" not in result.stdout.str()  # the message alone, as check prints it


def test_one_item_passes_max_sync_copies_1(pytester):
    write_test(pytester, ITEM_ONCE.format(n=1))
    run(pytester).assert_outcomes(passed=1)


def test_the_failure_is_what_memcpy_doctor_check_prints(pytester, monkeypatch):
    write_test(pytester, """
        import pytest
        import torch

        @pytest.fixture
        def saved(memcpy_doctor_profile):
            yield
            memcpy_doctor_profile.trace.save("trace.json")

        @pytest.mark.max_sync_copies(0)
        def test_item(saved):
            x = torch.ones(3).cuda()
            if x.sum() > 2:
                print(x)
    """)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    from memcpy_doctor.cli import cli
    monkeypatch.chdir(pytester.path)
    printed = CliRunner().invoke(cli, ["check", "--max", "sync_calls=0", "trace.json"])
    assert printed.exit_code == 1, printed.output
    assert failure_text(result, "test_item") == printed.output.rstrip("\n")


def test_memcpy_budget_takes_any_metric_with_check_units(pytester):
    write_test(pytester, """
        import pytest
        import torch

        def copies():
            d = torch.ones(1024).cuda()           # 4 KiB HtoD, sync
            d.sum().item()                        # 4 B DtoH, sync

        @pytest.mark.memcpy_budget(sync_calls=2, bytes_htod="4KiB", bytes=4100,
                                   memcpy_ratio="100%", sync_time="10s", copy_calls=2)
        def test_within():
            copies()

        @pytest.mark.memcpy_budget(bytes_htod="4095")
        def test_bytes_over():
            copies()

        @pytest.mark.memcpy_budget(sync_calls_dtoh=0, sync_calls_htod=1)
        def test_direction_over():
            copies()

        @pytest.mark.memcpy_budget(sync_time=0.0000001)
        def test_time_over():
            copies()
    """)
    result = run(pytester, "-rf")
    result.assert_outcomes(passed=1, failed=3)
    out = result.stdout.str()
    assert "FAIL bytes_htod = 4 KiB, max 3.999 KiB  <- 4 KiB > max 3.999 KiB" in out
    assert "FAIL sync_calls_dtoh = 1, max 0" in out
    assert "ok   sync_calls_htod = 1, max 1" in out
    assert "FAIL sync_time = " in out and "max 1e-07 ms" in out


def test_closest_marker_wins_per_metric(pytester):
    write_test(pytester, """
        import pytest
        import torch

        pytestmark = pytest.mark.memcpy_budget(sync_calls=0, bytes_dtoh=0)

        @pytest.mark.max_sync_copies(1)
        def test_function_allows_one_sync():
            torch.ones(2, device="cuda").sum().item()   # but bytes_dtoh=0 still holds

        class TestClass:
            pytestmark = pytest.mark.memcpy_budget(bytes_dtoh="1KiB")

            @pytest.mark.max_sync_copies(1)
            def test_class_level_bytes(self):
                torch.ones(2, device="cuda").sum().item()
    """)
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    assert "FAIL bytes_dtoh = 4 B, max 0 B" in result.stdout.str()
    result.stdout.fnmatch_lines(["*test_function_allows_one_sync*"])


def test_limits_read_from_markers(pytester):
    items = pytester.getitems("""
        import pytest

        @pytest.mark.max_sync_copies(3)
        def test_a(): pass

        @pytest.mark.memcpy_budget(bytes_htod="1MiB", memcpy_ratio="5%", wait_time=2)
        def test_b(): pass

        def test_c(): pass
    """)
    assert [pytest_plugin.budget_limits(i) for i in items] == [
        {"sync_calls": 3},
        {"bytes_htod": 2**20, "memcpy_ratio": 0.05, "wait_time": 2_000_000},
        None,
    ]


@pytest.mark.parametrize("marker, message", [
    ("memcpy_budget(nope=1)", "memcpy_budget: unknown metric 'nope'; known: copy_calls"),
    ("memcpy_budget(0)", "memcpy_budget takes keywords only"),
    ("memcpy_budget()", "memcpy_budget(): name at least one metric"),
    ("memcpy_budget(sync_calls=0.5)", "sync_calls: '0.5' is not a whole number"),
    ("memcpy_budget(bytes_htod='1 parsec')", "bytes_htod: cannot read '1 parsec' as a size"),
    ("memcpy_budget(sync_calls=True)", "memcpy_budget(sync_calls=True): give a number"),
    ("max_sync_copies('x')", "max_sync_copies('x'): give a whole number >= 0"),
    ("max_sync_copies(-1)", "max_sync_copies(-1): give a whole number >= 0"),
    ("max_sync_copies()", "max_sync_copies takes one argument"),
])
def test_a_bad_marker_errors_before_the_body(pytester, marker, message):
    write_test(pytester, f"""
        import pytest

        @pytest.mark.{marker}
        def test_x():
            raise AssertionError("the body must not run")
    """)
    result = run(pytester)
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert f"memcpy-doctor: {message}" in out
    assert "the body must not run" not in out


def test_markers_are_registered(pytester):
    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines([
        "@pytest.mark.max_sync_copies: max_sync_copies(n): profile the test body*",
        "@pytest.mark.memcpy_budget: memcpy_budget(**limits): profile the test body*",
    ])
    write_test(pytester, ITEM_ONCE.format(n=1))
    run(pytester, "--strict-markers").assert_outcomes(passed=1)


# ----- what is profiled, on which device -----

def test_only_marked_tests_and_fixture_users_are_profiled(pytester):
    write_test(pytester, f"""
        import pytest
        import torch
        from memcpy_doctor.tracer import active_tracer

        def test_unmarked():
            assert active_tracer() is None
            assert torch.cuda.is_available() is {HAS_CUDA}

        @pytest.mark.max_sync_copies(5)
        def test_marked():
            assert active_tracer() is not None

        def test_fixture(memcpy_doctor_profile):
            assert active_tracer() is memcpy_doctor_profile.tracer
    """)
    result = run(pytester, "--memcpy-doctor-report")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "test_unmarked:" not in out
    assert "test_budget.py::test_marked: 0 copies (0 sync)" in out


def test_device_sim_makes_cuda_available_inside_the_test(pytester):
    write_test(pytester, """
        import pytest
        import torch
        from memcpy_doctor.tracer import active_tracer

        @pytest.mark.max_sync_copies(1)
        def test_sim():
            assert torch.cuda.is_available()
            assert active_tracer().device == "sim"
            d = torch.ones(2).cuda()
            assert d.is_cuda and d.device == torch.device("cuda", 0)
    """)
    run(pytester, "--memcpy-doctor-device", "sim").assert_outcomes(passed=1)
    run(pytester, "--memcpy-doctor-device=sim", "--memcpy-doctor-report").stdout.fnmatch_lines(
        ["test_budget.py::test_sim: 1 copies (1 sync), 8 B, *; budget passed; simulated GPU"])


@pytest.mark.skipif(HAS_CUDA, reason="auto means the real GPU here")
def test_device_auto_is_sim_without_a_gpu(pytester):
    write_test(pytester, """
        import torch
        from memcpy_doctor.tracer import active_tracer

        def test_auto(memcpy_doctor_profile):
            assert torch.cuda.is_available() and active_tracer().device == "sim"
    """)
    run(pytester).assert_outcomes(passed=1)


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without a GPU")
def test_device_cuda_without_a_gpu_is_a_usage_error(pytester):
    write_test(pytester, ITEM_ONCE.format(n=1))
    result = run(pytester, "--memcpy-doctor-device", "cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--memcpy-doctor-device cuda: torch sees no CUDA device" in result.stderr.str()


def test_a_bad_device_choice_is_refused(pytester):
    result = run(pytester, "--memcpy-doctor-device", "tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "invalid choice: 'tpu'" in result.stderr.str()


@pytest.mark.cuda
def test_device_cuda_on_a_gpu(pytester):
    write_test(pytester, """
        import pytest
        import torch
        from memcpy_doctor.tracer import active_tracer

        @pytest.mark.max_sync_copies(0)
        def test_real():
            assert active_tracer().device == "cuda"
            torch.ones(4, device="cuda").sum().item()
    """)
    result = run(pytester, "--memcpy-doctor-device", "cuda")
    result.assert_outcomes(failed=1)
    assert "memcpy-doctor check: FAILED (0 passed, 1 failed)" in result.stdout.str()


# ----- the tracer always stops -----

def test_a_body_that_raises_still_stops_the_tracer(pytester):
    write_test(pytester, f"""
        import pytest
        import torch
        from memcpy_doctor.tracer import active_tracer

        @pytest.mark.max_sync_copies(0)
        def test_raises():
            torch.ones(2, device="cuda").sum().item()
            raise ValueError("the body's own error")

        def test_profiled_fixture_raises(memcpy_doctor_profile):
            raise KeyError("again")

        @pytest.mark.max_sync_copies(0)
        def test_skips_inside():
            pytest.skip("not today")

        def test_after():
            assert active_tracer() is None
            assert torch.cuda.is_available() is {HAS_CUDA}
    """)
    result = run(pytester, "--memcpy-doctor-report")
    result.assert_outcomes(failed=2, passed=1, skipped=1)
    out = result.stdout.str()
    assert "ValueError: the body's own error" in out
    assert "memcpy-doctor check" not in out  # a failed body is not checked against budgets
    assert "test_budget.py::test_raises: 1 copies (1 sync), 4 B" in out
    assert "budget not checked (the test failed)" in out


def test_a_tracer_already_running_makes_a_profiled_test_error(pytester):
    write_test(pytester, """
        import pytest
        import memcpy_doctor
        from memcpy_doctor.tracer import active_tracer

        @pytest.fixture
        def outer():
            with memcpy_doctor.profiler(device="sim") as prof:
                yield prof

        @pytest.mark.max_sync_copies(0)
        def test_x(outer):
            raise AssertionError("the body must not run")

        def test_after():
            assert active_tracer() is None
    """)
    result = run(pytester)
    result.assert_outcomes(failed=1, passed=1)
    assert "a memcpy-doctor tracer is already running" in result.stdout.str()
    assert "the body must not run" not in result.stdout.str()


def test_transfer_guard_in_a_profiled_test_uses_its_tracer(pytester):
    write_test(pytester, """
        import pytest
        import torch
        from memcpy_doctor.tracer import active_tracer
        from memcpy_doctor.guards.transfer import TransferGuardError, transfer_guard

        @pytest.mark.max_sync_copies(1)
        def test_guarded():
            tracer = active_tracer()
            d = torch.ones(2).cuda()
            with transfer_guard("disallow"), pytest.raises(TransferGuardError):
                d.sum().item()
            assert active_tracer() is tracer  # the guard did not stop the plugin's tracer
    """)
    run(pytester).assert_outcomes(passed=1)  # a refused copy is not counted


# ----- the fixture -----

def test_the_fixture_yields_the_profile(pytester):
    write_test(pytester, """
        import pytest
        import torch
        from memcpy_doctor.api import Profile

        seen = {}

        @pytest.fixture
        def after(memcpy_doctor_profile):
            yield
            seen["trace"] = memcpy_doctor_profile.trace
            seen["report"] = memcpy_doctor_profile.report()

        def test_body(memcpy_doctor_profile, after):
            assert isinstance(memcpy_doctor_profile, Profile)
            with pytest.raises(RuntimeError, match="has not ended"):
                memcpy_doctor_profile.trace
            torch.ones(8).cuda().cpu()

        def test_read(memcpy_doctor_profile):
            trace = seen["trace"]
            assert sorted((c.direction, c.trigger, c.bytes) for c in trace.copies) == [
                ("DtoH", "cpu", 32), ("HtoD", "cuda", 32)]
            assert "Profiling Report" in seen["report"]

        def test_stop_in_the_body(memcpy_doctor_profile):
            torch.ones(2).cuda()
            trace = memcpy_doctor_profile.stop()
            assert [c.trigger for c in trace.copies] == ["cuda"]
            assert memcpy_doctor_profile.trace is trace
    """)
    run(pytester).assert_outcomes(passed=3)


def test_the_fixture_with_a_budget(pytester):
    write_test(pytester, """
        import pytest
        import torch

        @pytest.mark.memcpy_budget(bytes_htod=7)
        def test_x(memcpy_doctor_profile):
            torch.ones(2).cuda()
    """)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    assert "FAIL bytes_htod = 8 B, max 7 B  <- 8 B > max 7 B" in result.stdout.str()


# ----- the report -----

def test_report_lines(pytester):
    write_test(pytester, ITEM_ONCE.format(n=0))
    result = run(pytester, "--memcpy-doctor-report")
    result.stdout.fnmatch_lines([
        "*- memcpy-doctor -*",
        "test_budget.py::test_item: 1 copies (1 sync), 4 B, memcpy * ms of * ms; "
        "budget FAILED; *",
    ])


def test_report_with_nothing_profiled(pytester):
    write_test(pytester, "def test_plain():\n    pass\n")
    result = run(pytester, "--memcpy-doctor-report")
    result.stdout.fnmatch_lines(["*- memcpy-doctor -*", "no test was profiled*"])
    assert "memcpy-doctor" not in run(pytester).stdout.str()  # off without the option


def test_summary_line_reads_the_gate_metrics():
    import memcpy_doctor
    with memcpy_doctor.profiler(device="sim") as prof:
        torch.ones(256).cuda().sum().item()
    line = pytest_plugin.summary_line(prof.trace, "passed")
    assert line.startswith("2 copies (2 sync), 1.004 KiB, memcpy ")
    assert line.endswith("; budget passed; simulated GPU")
    assert METRICS["bytes"].value(prof.trace, prof.trace.copies) == 1028


# ----- a fresh interpreter -----

def test_in_a_subprocess(pytester):
    name = write_test(pytester, ITEM_ONCE.format(n=0))
    line = line_of(pytester, name, ".item()")
    result = pytester.runpytest_subprocess(*PLUGIN, "--memcpy-doctor-device", "sim",
                                           "--memcpy-doctor-report")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"  {name}:{line}: over DtoH sync copy `item`, 1 calls, 4 B*",
                                 "memcpy-doctor check: FAILED (0 passed, 1 failed; "
                                 "simulated GPU)"])


# ----- races (issue 42) -----

RACE = """
import pytest
import torch

{mark}
def test_race(memcpy_doctor_profile):
    y = torch.arange(8.0, device="cuda") * 2
    host = y.to("cpu", non_blocking=True)
    assert host.sum() == 56.0
"""


def test_a_profiled_test_that_races_fails_at_the_access_line(pytester):
    name = write_test(pytester, RACE.format(mark=""))
    copy_line, access_line = (line_of(pytester, name, "non_blocking=True"),
                              line_of(pytester, name, "host.sum()"))
    result = run(pytester)
    result.assert_outcomes(failed=1)
    text = failure_text(result, "test_race")
    assert text.splitlines()[0].startswith("memcpy-doctor: the host touched a copy still in "
                                           "flight")
    assert (f"  race (read_before_copy_done): `aten::sum` at {name}:{access_line} reads the "
            f"destination of the non_blocking DtoH copy `to` at {name}:{copy_line} before "
            "anything waited for it (1 copy, 32 B); wait for the copy first (explain gives "
            "the edit)") in text.splitlines()


def test_allow_races_lets_it_pass(pytester):
    write_test(pytester, RACE.format(mark="@pytest.mark.allow_races"))
    run(pytester).assert_outcomes(passed=1)
