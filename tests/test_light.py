"""`profile --light` (tracer/light.py): every sync at its line from PyTorch's sync-debug warning
and a few wrapped calls, nothing per op; the program's warnings and filters untouched.

On this machine the warning is a fake one (raised as c10's TORCH_WARN reaches Python) or the
simulated GPU's; the tests marked cuda run the real path where torch sees a GPU.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from helpers import cli_in_process
from memcpy_doctor import load_trace
from memcpy_doctor.analysis.compare import sync_sites
from memcpy_doctor.core.defaults import SYNC_DEBUG_WARNING
from memcpy_doctor.run.runner import run_script
from memcpy_doctor.tracer import Tracer, active_tracer
from memcpy_doctor.tracer.light import LightHooks, LightTracer

HERE = Path(__file__).resolve()
SAMPLES = HERE.parent.parent / "sample_models"
#: The warning as PyTorch hands it to Python (PyWarningHandler adds where TORCH_WARN was).
REAL_TEXT = (SYNC_DEBUG_WARNING + " (Triggered internally at "
             "/pytorch/c10/cuda/CUDAFunctions.cpp:187.)")


def line(tag: str) -> int:
    """The line of this file that ends with `# <tag>`."""
    hits = [i for i, text in enumerate(HERE.read_text().splitlines(), 1)
            if text.endswith(f"# {tag}")]
    assert len(hits) == 1, (tag, hits)
    return hits[0]


#: A synced C++ call as its Python caller sees it: the sync-debug warning raised from C with
#: no Python frame of its own (PyErr_WarnEx; here _warnings.warn through a partial).
fake_sync = functools.partial(warnings.warn, REAL_TEXT, UserWarning)
assert not hasattr(warnings.warn, "__code__")  # the C warn, not warnings.py's


def rows(trace_or_col) -> list[tuple]:
    copies = trace_or_col.copy_records() if hasattr(trace_or_col, "copy_records") \
        else trace_or_col.copies
    return sorted((c.direction, c.trigger, c.site.line, c.calls, c.bytes, c.host_ns,
                   c.thread) for c in copies)


# ----- the hooks, with a fake warning -----

def test_each_fake_sync_is_counted_at_its_line_and_never_shown():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with LightHooks() as hooks:
            for _ in range(3):
                fake_sync()  # fake-loop
            fake_sync()  # fake-once
            warnings.warn("the program's own", UserWarning)  # own-warning
    # (the call at the warning's frame names the sync; a call that cannot tell its
    # direction, as this fake's, says unknown: tests/test_synccall.py)
    assert rows(hooks.collector) == [
        ("unknown", "fake_sync", line("fake-loop"), 3, 0, 0, None),
        ("unknown", "fake_sync", line("fake-once"), 1, 0, 0, None)]
    record = hooks.collector.copy_records()[0]
    assert record.site.file == str(HERE) and record.sync and record.pinned is None
    assert record.stack[0] == record.site and record.producer is record.consumer is None
    assert [(w.category, str(w.message), w.lineno) for w in caught] == [
        (UserWarning, "the program's own", line("own-warning"))]


def test_filters_and_patches_are_undone_also_on_error_and_the_programs_stay():
    before = list(warnings.filters)
    originals = (torch.cuda.synchronize, vars(torch.cuda.Stream)["synchronize"],
                 vars(torch.cuda.Event)["synchronize"])
    with pytest.raises(KeyError):
        with LightHooks():
            assert LightHooks.owns(warnings.filters[0])
            assert "copy_" in vars(torch.Tensor)
            raise KeyError("the program's error")
    assert warnings.filters == before
    assert "copy_" not in vars(torch.Tensor)
    assert (torch.cuda.synchronize, vars(torch.cuda.Stream)["synchronize"],
            vars(torch.cuda.Event)["synchronize"]) == originals
    with warnings.catch_warnings():
        with LightHooks():
            warnings.filterwarnings("error", message="added while it ran")
        assert warnings.filters[0][1].pattern == "added while it ran"
        assert not any(LightHooks.owns(f) for f in warnings.filters)


def test_wrapped_wait_is_timed_and_its_own_warning_not_counted_again(monkeypatch):
    def stream_like_sync():  # Stream.synchronize: c10's stream_synchronize warns too
        time.sleep(0.002)
        fake_sync()

    monkeypatch.setattr(torch.cuda, "synchronize", stream_like_sync)
    with LightHooks() as hooks:
        torch.cuda.synchronize()  # wrapped-wait
    assert hooks.collector.copy_records() == []
    [wait] = hooks.collector.wait_records()
    assert (wait.kind, wait.calls, wait.site.line) == ("synchronize", 1,
                                                       line("wrapped-wait"))
    assert wait.wait_ns >= 2_000_000


def test_a_sync_in_another_thread_names_its_thread():
    def load():
        fake_sync()  # thread-sync

    with LightHooks() as hooks:
        worker = threading.Thread(target=load, name="loader")
        worker.start()
        worker.join()
    [record] = hooks.collector.copy_records()
    assert record.thread == "loader" and record.site.line == line("thread-sync")


def test_light_mode_adds_nothing_to_an_op():
    """No mode and no per-op hook: an op on host tensors calls nothing of ours."""
    with LightHooks():
        assert not torch._C._len_torch_function_stack()
        assert not torch._C._len_torch_dispatch_stack()
        x = torch.ones(3)
        calls = []
        sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_filename))
        try:
            (x + 1).mul_(2)
        finally:
            sys.setprofile(None)
    assert not [f for f in calls if "memcpy_doctor" in f]


# ----- the light tracer on the simulated GPU -----

def program():
    x = torch.arange(4.0, device="cuda")
    for _ in range(3):
        x.sum().item()  # sim-item
    x.cpu()  # sim-cpu
    x.to("cpu", non_blocking=True)  # async: pinned destination, no sync
    host = torch.empty(4)
    host.copy_(x, non_blocking=True)  # sim-pageable
    torch.cuda.synchronize()  # sim-device
    torch.cuda.Stream().synchronize()  # sim-stream
    torch.cuda.Event().synchronize()  # sim-event
    torch.ones(2).to("cuda")  # sim-htod
    torch.ones(2).to("cuda", non_blocking=True)  # pageable: staged, waited # sim-staged


def test_light_on_the_sim_records_each_sync_once_at_its_line():
    tracer = LightTracer(device="sim")
    with tracer:
        assert active_tracer() is tracer
        assert torch._C._len_torch_dispatch_stack() == 1  # the simulated GPU's own
        program()
    trace = tracer.trace
    assert active_tracer() is None
    assert trace.meta.light and trace.meta.device == "sim" and trace.meta.simulated
    assert trace.ops == [] and trace.flows == []
    copy_ = [c for c in trace.copies if c.trigger == "copy_"]
    assert len(copy_) == 1 and copy_[0].host_ns > 0  # timed around the wrapped call
    copy_[0].host_ns = 0
    # each sync copy with its direction, trigger and size, as the full tracer records it
    # (issue 41: light mode said DtoH `sync_debug`, 0 bytes, for every one)
    assert rows(trace) == sorted([
        ("DtoH", "item", line("sim-item"), 3, 12, 0, None),
        ("DtoH", "cpu", line("sim-cpu"), 1, 16, 0, None),
        ("HtoD", "to", line("sim-htod"), 1, 8, 0, None),
        ("DtoH", "copy_", line("sim-pageable"), 1, 16, 0, None),
        ("HtoD", "to", line("sim-staged"), 1, 8, 0, None)])
    assert (copy_[0].pinned, copy_[0].shape, copy_[0].dtype) == (False, [4], "float32")
    assert sorted((w.kind, w.site.line, w.calls) for w in trace.waits) == sorted([
        ("synchronize", line("sim-device"), 1), ("stream_synchronize", line("sim-stream"), 1),
        ("event_synchronize", line("sim-event"), 1)])
    assert trace.summary.memcpy_sync.calls == 7 and trace.summary.memcpy_async.calls == 0
    assert {e.name: e.calls for e in trace.events} == {
        "GpuMemcpySync:GPU->CPU": 5, "GpuMemcpySync:CPU->GPU": 2, "HostWait:synchronize": 1,
        "HostWait:stream_synchronize": 1, "HostWait:event_synchronize": 1}


def test_light_and_full_find_the_same_syncs_on_the_sim():
    with Tracer(device="sim") as full:
        program()
    with LightTracer(device="sim") as light:
        program()
    assert sync_sites(light.trace) == sync_sites(full.trace)


def test_light_trace_round_trips_and_says_it_is_light(tmp_path):
    with LightTracer(device="sim") as tracer:
        program()
    tracer.trace.save(tmp_path / "t.json")
    loaded = load_trace(tmp_path / "t.json")
    assert loaded.meta.light is True and rows(loaded) == rows(tracer.trace)
    assert any("not modeled" in note for note in loaded.meta.untraced)


@pytest.mark.parametrize("name", ["item_every_step", "clean_pinned", "embedding_l2",
                                  "shape_slice_crop"])
def test_samples_light_and_full_give_the_same_sync_sites(name, tmp_path):
    traces = {}
    for kind, tracer in (("full", Tracer(device="sim")), ("light", LightTracer(device="sim"))):
        result = run_script(str(SAMPLES / f"{name}.py"), ["--steps", "4"] if name !=
                            "shape_slice_crop" else [], tracer)
        assert result.exit_status == 0, result.exception
        traces[kind] = result.trace
    assert sync_sites(traces["light"]) == sync_sites(traces["full"])
    assert sum(sync_sites(traces["light"]).values()) > 0


def test_light_tracer_undoes_everything_when_the_program_fails():
    before = list(warnings.filters)
    tracer = LightTracer(device="sim")
    tracer.start()
    try:
        torch.ones(1, device="cuda").item()
        with pytest.raises(ZeroDivisionError):
            1 / 0
    finally:
        tracer.stop()
    assert warnings.filters == before and active_tracer() is None
    assert not torch.cuda.is_available()  # the simulated GPU is gone too
    assert tracer.trace.summary.memcpy_sync.calls == 1


def test_a_light_tracer_abandoning_its_modes_still_undoes_every_patch_in_order():
    """stop(abandon_modes=True) (a signal, or the program's own exit) stops the simulated
    GPU's tracer after light mode's patches over its own are undone, not before: else light
    mode would put back the simulated GPU's torch.cuda.synchronize."""
    synchronize = torch.cuda.synchronize
    tracer = LightTracer(device="sim").start()
    tracer.stop(abandon_modes=True)
    assert torch.cuda.synchronize is synchronize and active_tracer() is None
    assert not torch.cuda.is_available()


def test_one_tracer_at_a_time_and_transfer_guard_says_why():
    import memcpy_doctor
    with LightTracer(device="sim"):
        with pytest.raises(RuntimeError, match="already running"):
            Tracer(device="sim").start()
        with pytest.raises(RuntimeError, match="profile without --light"):
            with memcpy_doctor.transfer_guard("disallow"):
                pass


# ----- the command, as a user runs it -----

SCRIPT = """\
import warnings
import torch

x = torch.ones(8, device="cuda")
total = 0.0
for step in range(4):
    total += x.sum().item()
warnings.warn("keep me")
print("total", total)
"""


def _profile(tmp_path: Path, *args: str, script: str = SCRIPT) -> subprocess.CompletedProcess:
    (tmp_path / "prog.py").write_text(script)
    return subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile", *args,
                           "-o", "t.json", "prog.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def test_cli_light_on_the_sim_reports_syncs_and_keeps_other_warnings(tmp_path):
    p = _profile(tmp_path, "--light", "--device", "sim")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "total 32.0\n"
    assert "called a synchronizing" not in p.stderr
    assert "prog.py:8: UserWarning: keep me" in p.stderr
    assert "light mode: syncs counted at their lines, no ops" in p.stderr
    trace = load_trace(tmp_path / "t.json")
    assert trace.meta.light and trace.meta.command[:3] == ["memcpy-doctor", "profile",
                                                           "--light"]
    assert rows(trace) == [("DtoH", "item", 7, 4, 16, 0, None)]
    check = cli_in_process("check", "t.json", "--max", "sync_calls=3", cwd=tmp_path)
    assert check.status == 1 and "sync_calls" in check.out
    assert cli_in_process("check", "t.json", "--max", "sync_calls=4", cwd=tmp_path).status == 0
    explain = cli_in_process("explain", "t.json", cwd=tmp_path)
    assert explain.status == 0, explain.err
    assert "sync_debug" not in explain.out  # (the simulated GPU's copies, each with its kind)
    # (whether the 4 reads are "per step" or "one-off" depends on this machine's wall clock,
    # which light mode's times are: explain lists them either way, at their line)
    assert "sync copies: 4 calls, 0 ms" in explain.out and "prog.py:7" in explain.out
    assert explain.out.startswith("Copies the host waited for (simulated NVIDIA A100-SXM4-80GB; "
                                  "light mode: times are this machine's wall clock)\n")


def test_cli_light_usage_errors_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "prog.py").write_text(SCRIPT)
    if not torch.cuda.is_available():
        p = _profile(tmp_path, "--light")
        assert p.returncode == 2 and p.stdout == ""
        assert p.stderr == ("memcpy-doctor: error: --light: torch sees no CUDA GPU here; "
                            "--light --device sim runs light mode on the simulated GPU\n")
        r = cli_in_process("profile", "--light", "--device", "cuda", "prog.py", cwd=tmp_path)
        assert r.status == 2 and "torch sees no CUDA GPU" in r.err
    r = cli_in_process("profile", "--light", "--device", "sim", "--chrome-trace", "c.json",
                       "prog.py", cwd=tmp_path)
    assert (r.status, r.err.count("\n")) == (2, 1) and "--light records no timeline" in r.err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delattr(torch.cuda, "set_sync_debug_mode")
    r = cli_in_process("profile", "--light", "--device", "cuda", "prog.py", cwd=tmp_path)
    assert r.status == 2 and r.err == (
        f"memcpy-doctor: error: --light: torch {torch.__version__} has no sync-debug mode "
        "(torch.cuda.set_sync_debug_mode, PyTorch 1.10 and later)\n")
    assert not (tmp_path / "t.json").exists()


# ----- a real GPU -----

GPU_PROGRAM = """\
import torch

x = torch.arange(1024.0, device="cuda")
for _ in range(3):
    x.sum().item()
h = torch.randn(256).to("cuda")
torch.nonzero(x > 10)
pageable = torch.empty(1024)
pageable.copy_(x, non_blocking=True)
x.to("cpu", non_blocking=True)
torch.cuda.synchronize()
torch.cuda.current_stream().synchronize()
print("done")
"""


@pytest.mark.cuda
def test_real_gpu_light_finds_each_sync_at_its_line(tmp_path):
    p = _profile(tmp_path, "--light", "--device", "cuda", script=GPU_PROGRAM)
    assert p.returncode == 0, p.stderr
    assert "called a synchronizing" not in p.stderr
    trace = load_trace(tmp_path / "t.json")
    found = {(c.trigger, c.direction, c.site.line): c.calls for c in trace.copies}
    assert found == {("item", "DtoH", 5): 3, ("to", "HtoD", 6): 1, ("nonzero", "DtoH", 7): 1,
                     ("copy_", "DtoH", 9): 1}
    assert all(c.host_ns > 0 for c in trace.copies)  # (each one a wrapped, timed call)
    assert sorted((w.kind, w.site.line, w.calls) for w in trace.waits) == [
        ("stream_synchronize", 12, 1), ("synchronize", 11, 1)]
    assert all(w.wait_ns > 0 for w in trace.waits)


@pytest.mark.cuda
def test_real_gpu_light_and_full_agree_and_mode_is_restored(tmp_path, monkeypatch):
    (tmp_path / "prog.py").write_text(GPU_PROGRAM)
    monkeypatch.chdir(tmp_path)
    traces = {}
    for kind, tracer in (("full", Tracer(device="cuda")),
                         ("light", LightTracer(device="cuda"))):
        result = run_script("prog.py", [], tracer)
        assert result.exit_status == 0, result.exception
        traces[kind] = result.trace
    assert sync_sites(traces["light"]) == sync_sites(traces["full"])
    assert torch.cuda.get_sync_debug_mode() == 0


def test_light_module_has_no_per_op_code():
    """What light mode installs is the filter and four wrapped calls; this test reads the
    module so that a mode or an op hook added later is noticed."""
    source = (HERE.parent.parent / "memcpy_doctor" / "tracer" / "light.py").read_text()
    for banned in ("TorchDispatchMode", "TorchFunctionMode", "DispatchMode(", "FunctionMode(",
                   "register_forward", "_activate_gpu_trace", "setprofile", "settrace"):
        assert banned not in source, banned
