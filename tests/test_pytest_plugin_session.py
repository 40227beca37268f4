"""The pytest plugin's session-wide simulated GPU (`--memcpy-doctor-device sim`), its warning
for a budget over a body that never touched the device, and its JSON results: small suites
run by pytester, in this process (the conftest fixture then also sees any mode or patch a
run leaves behind) and in subprocesses."""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo  # noqa: F401  (outside pytester's runs: see test_pytest_plugin)

from memcpy_doctor.tracer.sim.session import session_sim

from test_pytest_plugin import PLUGIN, failure_text, line_of, run, write_test

pytest_plugins = ["pytester"]

HAS_CUDA = torch.cuda.is_available()
SIM = ("--memcpy-doctor-device", "sim")
NO_DEVICE_OP = "ran no device op; its copy budget proves nothing"


@pytest.fixture(autouse=True)
def no_autoload(monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def run_clean(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """`run`, and the session's simulated GPU is gone afterwards, modes and patches too."""
    result = run(pytester, *args)
    assert session_sim() is None
    assert torch.cuda.is_available() is HAS_CUDA
    assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_dispatch_stack() == 0
    return result


# The suite a user writes: the device chosen at import, GPU tests skipped without one.
MODULE_LEVEL = """
import pytest
import torch

dev = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@needs_gpu
@pytest.mark.max_sync_copies(0)
def test_step_syncs():
    w = torch.ones(4, device=dev)
    for _ in range(3):
        loss = (w * 2).sum().item()


@needs_gpu
@pytest.mark.max_sync_copies(0)
def test_step_clean():
    w = torch.ones(4, device=dev)
    for _ in range(3):
        w = w * 2
    assert w.device.type == "cuda"
"""


# ----- the simulated GPU from collection on -----

@pytest.mark.parametrize("how", ["option", "ini"])
def test_module_level_device_and_skipif_see_the_simulated_gpu(pytester, how):
    name = write_test(pytester, MODULE_LEVEL, "test_step")
    line = line_of(pytester, name, ".item()")
    if how == "ini":
        pytester.makeini("[pytest]\nmemcpy_doctor_device = sim\n")
    result = run_clean(pytester, *(SIM if how == "option" else ()), "-rs")
    result.assert_outcomes(failed=1, passed=1)
    text = failure_text(result, "test_step_syncs").splitlines()
    assert text[0] == "FAIL sync_calls = 3, max 0  <- 3 > max 0"
    assert (f"  {name}:{line}: over DtoH sync copy `item`, 3 calls, 12 B; aten::sum [cuda:0] "
            f"at {name}:{line} -> -") in text
    assert text[-1] == "memcpy-doctor check: FAILED (0 passed, 1 failed; simulated GPU)"
    assert NO_DEVICE_OP not in result.stdout.str()


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without a GPU")
def test_without_the_option_the_module_level_suite_skips(pytester):
    write_test(pytester, MODULE_LEVEL, "test_step")
    run_clean(pytester).assert_outcomes(skipped=2)


def test_the_command_line_wins_over_the_ini_file(pytester):
    pytester.makeini("[pytest]\nmemcpy_doctor_device = sim\n")
    write_test(pytester, f"""
        import torch

        def test_machine():
            assert torch.cuda.is_available() is {HAS_CUDA}
    """)
    run_clean(pytester, "--memcpy-doctor-device", "auto").assert_outcomes(passed=1)


def test_a_bad_ini_device_is_a_usage_error(pytester):
    pytester.makeini("[pytest]\nmemcpy_doctor_device = tpu\n")
    write_test(pytester, "def test_x():\n    pass\n")
    result = run_clean(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "memcpy_doctor_device = tpu: choose one of auto, cuda, sim" in result.stderr.str()


def test_conftest_fixtures_and_profiled_bodies_share_the_device(pytester):
    pytester.makeconftest("""
        import pytest
        import torch

        DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

        @pytest.fixture
        def model():
            return torch.nn.Linear(4, 2).to(DEVICE)
    """)
    name = write_test(pytester, """
        import pytest
        import torch
        from conftest import DEVICE

        @pytest.mark.max_sync_copies(0)
        def test_forward(model):
            assert model.weight.is_cuda
            model(torch.ones(3, 4, device=DEVICE)).relu()

        @pytest.mark.memcpy_budget(sync_calls=0)
        def test_forward_and_read(model):
            model(torch.ones(3, 4, device=DEVICE)).sum().item()

        def test_host_input_is_refused(model):
            with pytest.raises(RuntimeError, match="found at least two devices, cuda:0 and cpu"):
                model(torch.ones(3, 4))
    """, "test_model")
    line = line_of(pytester, name, ".item()")
    result = run_clean(pytester, *SIM)
    result.assert_outcomes(passed=2, failed=1)
    assert f"  {name}:{line}: over DtoH sync copy `item`, 1 calls, 4 B" in result.stdout.str()


def test_unmarked_tests_run_on_the_simulated_gpu_unprofiled(pytester):
    write_test(pytester, """
        import threading
        import torch
        from memcpy_doctor.tracer import active_tracer

        def test_plain():
            assert active_tracer() is None
            x = torch.arange(4.0, device="cuda")
            assert x.device == torch.device("cuda", 0) and x.sum().item() == 6.0
            assert torch.cuda.device_count() == 1
            torch.cuda.synchronize()
            assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]

        def test_in_a_thread():
            out = []
            worker = threading.Thread(target=lambda: out.append(torch.ones(2).cuda() * 2))
            worker.start()
            worker.join()
            assert out[0].is_cuda and out[0].tolist() == [2.0, 2.0]
    """)
    run_clean(pytester, *SIM, "--memcpy-doctor-report").stdout.fnmatch_lines(
        ["*- memcpy-doctor -*", "no test was profiled*", "*2 passed*"])


def test_a_profiler_opened_in_an_unmarked_test(pytester):
    write_test(pytester, """
        import pytest
        import torch
        import memcpy_doctor

        before = torch.ones(4, device="cuda")

        def test_nested():
            modes = torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()
            with memcpy_doctor.profiler(device="sim") as prof:
                assert modes == (torch._C._len_torch_function_stack(),
                                 torch._C._len_torch_dispatch_stack())
                (before * 2).sum().item()
            trace = prof.trace
            assert [(c.direction, c.trigger) for c in trace.copies] == [("DtoH", "item")]
            assert {op.device for op in trace.ops} == {"cuda:0"}
            assert modes == (torch._C._len_torch_function_stack(),
                             torch._C._len_torch_dispatch_stack())
            assert before.is_cuda and torch.cuda.is_available()
            with memcpy_doctor.profiler() as prof:  # auto: the simulated GPU here
                before.cpu()
            assert prof.trace.meta.simulated and len(prof.trace.copies) == 1
            with pytest.raises(RuntimeError, match="device cuda: the simulated GPU is in place"):
                with memcpy_doctor.profiler(device="cuda"):
                    pass
            assert (before + 1).is_cuda
    """)
    run_clean(pytester, *SIM).assert_outcomes(passed=1)


# ----- a budget over a body that never touched the device -----

HOST_ONLY = """
import pytest
import torch

@pytest.mark.max_sync_copies(0)
def test_host_only():
    torch.ones(3).sum().item()

def test_fixture_host_only(memcpy_doctor_profile):
    torch.ones(3) * 2

@pytest.mark.max_sync_copies(1)
def test_on_the_device():
    torch.ones(3, device="cuda").sum().item()
"""


def test_a_body_without_device_ops_warns(pytester):
    name = write_test(pytester, HOST_ONLY)
    result = run_clean(pytester, *SIM)
    result.assert_outcomes(passed=3, warnings=2)
    out = result.stdout.str()
    for test in ("test_host_only", "test_fixture_host_only"):
        def_line = line_of(pytester, name, f"def {test}(")
        first = def_line - 1 if test == "test_host_only" else def_line  # (its decorator)
        assert (f"{name}:{first}: NoDeviceOpWarning: memcpy-doctor: {NO_DEVICE_OP}. Every "
                "op ran on the host") in out
    assert f"{name}::test_on_the_device\n" not in out.split("warnings summary")[1]


@pytest.mark.parametrize("how", ["option", "ini"])
def test_strict_fails_a_body_without_device_ops(pytester, how):
    name = write_test(pytester, HOST_ONLY)
    if how == "ini":
        pytester.makeini("[pytest]\nmemcpy_doctor_strict = true\n")
    result = run_clean(pytester, *SIM, *(["--memcpy-doctor-strict"] if how == "option" else []))
    result.assert_outcomes(passed=1, failed=2)
    for test in ("test_host_only", "test_fixture_host_only"):
        assert failure_text(result, test).splitlines()[0] == (
            f"memcpy-doctor: {name}::{test} {NO_DEVICE_OP} (--memcpy-doctor-strict)")
    assert "NoDeviceOpWarning" not in result.stdout.str()


@pytest.mark.skipif(HAS_CUDA, reason="auto means the real GPU here")
def test_the_warning_points_a_module_level_device_to_the_option(pytester):
    write_test(pytester, """
        import pytest
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"

        @pytest.mark.max_sync_copies(0)
        def test_step():
            torch.ones(2, device=dev).sum().item()
    """)
    result = run_clean(pytester)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines([f"*{NO_DEVICE_OP}. Every op ran on the host: a device chosen "
                                 "at import time*--memcpy-doctor-device sim puts the simulated "
                                 "GPU in place from collection on."])


# ----- JSON results -----

def test_json_results(pytester):
    write_test(pytester, HOST_ONLY + """

@pytest.mark.max_sync_copies(0)
def test_over():
    torch.ones(3, device="cuda").sum().item()

@pytest.mark.max_sync_copies(0)
def test_raises():
    raise ValueError("no")

def test_unprofiled():
    pass
""")
    pytester.mkdir("out")
    result = run_clean(pytester, *SIM, "--memcpy-doctor-json", "out/results.json")
    result.assert_outcomes(passed=4, failed=2, warnings=2)
    document = json.loads((pytester.path / "out" / "results.json").read_text())
    assert document["schema_version"] == 1
    assert document["units"]["bytes"] == "bytes" and document["units"]["sync_time"] == "ns"
    tests = {t["test"].split("::")[1]: t for t in document["tests"]}
    assert list(tests) == ["test_host_only", "test_fixture_host_only", "test_on_the_device",
                           "test_over", "test_raises"]
    brief = {name: (t["verdict"], t["budget"], t["metrics"]["sync_calls"],
                    t["metrics"]["bytes"], t["device_used"], t["warning"])
             for name, t in tests.items()}
    assert brief == {
        "test_host_only": ("passed", {"sync_calls": 0}, 0, 0, False, NO_DEVICE_OP),
        "test_fixture_host_only": ("none", {}, 0, 0, False, NO_DEVICE_OP),
        "test_on_the_device": ("passed", {"sync_calls": 1}, 1, 4, True, None),
        "test_over": ("failed", {"sync_calls": 0}, 1, 4, True, None),
        "test_raises": ("not checked", {"sync_calls": 0}, 0, 0, True, None),
    }
    over = tests["test_over"]
    assert (over["device"], over["simulated"]) == ("sim", True)
    assert set(over["metrics"]) == set(document["units"])


def test_json_results_of_strict_and_of_nothing_profiled(pytester):
    write_test(pytester, HOST_ONLY)
    run_clean(pytester, *SIM, "--memcpy-doctor-strict", "--memcpy-doctor-json", "r.json")
    tests = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert [t["verdict"] for t in tests] == ["failed", "failed", "passed"]
    write_test(pytester, "def test_plain():\n    pass\n")
    run_clean(pytester, "--memcpy-doctor-json", "r.json", "test_budget.py")
    assert json.loads((pytester.path / "r.json").read_text())["tests"] == []


def test_json_into_a_missing_directory_is_a_usage_error(pytester):
    write_test(pytester, "def test_x():\n    pass\n")
    result = run_clean(pytester, *SIM, "--memcpy-doctor-json", "nowhere/r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--memcpy-doctor-json " in result.stderr.str()
    assert "no such directory" in result.stderr.str()


# ----- always undone -----

def test_a_conftest_that_fails_to_import_still_undoes_the_simulated_gpu(pytester):
    pytester.makeconftest("""
        import torch
        assert torch.cuda.is_available()  # the simulated GPU is in place already
        raise ImportError("broken conftest")
    """)
    write_test(pytester, "def test_x():\n    pass\n")
    result = run_clean(pytester, *SIM)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ImportError: broken conftest" in result.stderr.str()


# ----- fresh interpreters -----

def test_in_a_subprocess(pytester):
    name = write_test(pytester, MODULE_LEVEL, "test_step")
    line = line_of(pytester, name, ".item()")
    result = pytester.runpytest_subprocess(*PLUGIN, *SIM)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([f"  {name}:{line}: over DtoH sync copy `item`, 3 calls, 12 B*"])


def test_xdist_workers_and_the_json_file(pytester):
    pytest.importorskip("xdist")
    write_test(pytester, MODULE_LEVEL, "test_step")
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "xdist.plugin", "-n", "2", *SIM,
                                           "--memcpy-doctor-json", "r.json")
    result.assert_outcomes(failed=1, passed=1)
    tests = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert sorted((t["test"], t["verdict"]) for t in tests) == [
        ("test_step.py::test_step_clean", "passed"), ("test_step.py::test_step_syncs", "failed")]
