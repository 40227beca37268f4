"""benchmarks/fidelity.py: the comparison of a real and a simulated run on hand-built traces
(exact figures), the programs it runs, and a sim-against-sim smoke run; the real GPU run is
cuda-marked."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import sys

import pytest
import torch

from helpers import SYNC_SITE, TRAIN_STEP_ITEM, make_copies, make_trace
from memcpy_doctor.core.trace import CopyRecord, Site, Trace, WaitRecord

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fid():
    spec = importlib.util.spec_from_file_location("fidelity", ROOT / "benchmarks" / "fidelity.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fidelity"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["fidelity"]


def sim_trace():
    """The default trace as a simulator that got some things wrong would record it: one item
    read fewer (9 calls, 36 bytes), an extra HtoD index copy at model.py:30, the waits gone,
    and 12.5 ms in all instead of 10."""
    to, item, async_to = make_copies()
    item = dataclasses.replace(item, calls=9, bytes=36)
    extra = CopyRecord(direction="HtoD", sync=True, pinned=False, trigger="index", calls=2,
                       bytes=16, host_ns=100_000, device_ns=100_000,
                       site=Site("/work/proj/model.py", 30, "forward"), stack=[],
                       producer=None, consumer=None)
    return make_trace(copies=[to, item, async_to, extra], waits=[], total_ns=12_500_000)


def test_identical_runs_agree(fid):
    f = fid.compare_runs("p.py", make_trace(), make_trace())
    assert f.counts_equal
    assert (f.sync_calls, f.sync_bytes, f.waits) == ((14, 14), (4_136, 4_136), (2, 2))
    assert (f.total_ns, f.memcpy_ns) == ((10_000_000, 10_000_000), (4_000_000, 4_000_000))
    assert (f.only_real, f.only_sim, f.calls_differ) == ([], [], [])


def test_differences_are_all_named(fid):
    f = fid.compare_runs("p.py", make_trace(), sim_trace())
    assert not f.counts_equal
    assert f.sync_calls == (14, 15) and f.sync_bytes == (4_136, 4_148) and f.waits == (2, 0)
    assert f.total_ns == (10_000_000, 12_500_000)
    assert f.memcpy_ns == (4_000_000, 4_200_000)
    assert fid.ratio(f.total_ns) == 1.25 and fid.ratio(f.memcpy_ns) == 1.05
    assert f.only_real == [(("wait", "sync", "synchronize", "train.py:70"), 2)]
    assert f.only_sim == [(("HtoD", "sync", "index", "model.py:30"), 2)]
    assert f.calls_differ == [(("DtoH", "sync", "item", "train.py:50"), 10, 9)]


def test_paths_count_calls_per_site(fid):
    trace = make_trace(waits=[WaitRecord("synchronize", 2, 300_000, SYNC_SITE),
                              WaitRecord("stream_synchronize in aten::foo", 1, 0,
                                         TRAIN_STEP_ITEM)])
    assert fid.paths(trace) == {
        ("HtoD", "sync", "to", "train.py:42"): 4,
        ("DtoH", "sync", "item", "train.py:50"): 10,
        ("DtoH", "async", "to", "train.py:60"): 5,
        ("wait", "sync", "synchronize", "train.py:70"): 2,
        ("wait", "sync", "stream_synchronize in aten::foo", "train.py:50"): 1,
    }


def test_ratio_of_nothing_measured_is_none(fid):
    assert fid.ratio((0, 5)) is None


def test_render(fid):
    rows = [fid.compare_runs("same.py", make_trace(), make_trace()),
            fid.compare_runs("off.py", make_trace(), sim_trace())]
    assert fid.render(rows) == """\
== same.py  [counts equal]
                              real           sim  sim/real
  sync copies                   14            14     equal
  sync bytes                 4,136         4,136     equal
  host waits                     2             2     equal
  total ms                  10.000        10.000      1.00
  memcpy ms                  4.000         4.000      1.00
== off.py  [COUNTS DIFFER]
                              real           sim  sim/real
  sync copies                   14            15    DIFFER
  sync bytes                 4,136         4,148    DIFFER
  host waits                     2             0    DIFFER
  total ms                  10.000        12.500      1.25
  memcpy ms                  4.000         4.200      1.05
  only in real: wait sync synchronize at train.py:70 (x2)
  only in sim: HtoD sync index at model.py:30 (x2)
  calls differ: DtoH sync item at train.py:50: real x10, sim x9
2 programs; counts differ in 1: off.py; '!' marks a time off by more than 25%
"""


def test_render_marks_times_off_by_more_than_the_goal(fid):
    f = fid.compare_runs("slow.py", make_trace(), make_trace(total_ns=12_600_000))
    line = [s for s in fid.render([f]).splitlines() if s.strip().startswith("total ms")][0]
    assert line.split()[-2:] == ["1.26", "!"]


def test_programs_are_the_samples_the_library_programs_and_the_sync_rule_scripts(fid):
    progs = fid.programs()
    names = [p.name for p in progs]
    assert names[:14] == ["clean_pinned.py", "embedding_l2.py", "item_every_step.py",
                          "shape_slice_crop.py", "accel.py", "hf_trainer.py",
                          "lightning_gpu.py", "timm_amp.py", "tmetrics.py", "tv_detect.py",
                          "compiled_break.py", "compiled_cudagraphs.py", "compiled_hf.py",
                          "compiled_lightning.py"]
    assert [p.path for p in progs[3:5]] == [str(ROOT / "sample_models" / "shape_slice_crop.py"),
                                            str(ROOT / "tests" / "programs" / "accel.py")]
    assert {p.name: p.needs for p in progs[4:14]} == {
        "accel.py": ("accelerate",), "hf_trainer.py": ("transformers", "accelerate"),
        "lightning_gpu.py": ("lightning",), "timm_amp.py": ("timm",),
        "tmetrics.py": ("torchmetrics",), "tv_detect.py": ("torchvision",),
        "compiled_break.py": ("transformers",), "compiled_cudagraphs.py": (),
        "compiled_hf.py": ("transformers",), "compiled_lightning.py": ("lightning",)}
    # every file of tests/programs is one of them
    assert sorted(f.name for f in (ROOT / "tests" / "programs").glob("*.py")) == sorted(
        names[4:14])
    rules = dict(fid.sync_rule_programs())
    assert [(p.name, p.path, p.source, p.needs) for p in progs[14:]] == [
        (name, f"{name}.py", source, ()) for name, source in rules.items()]
    assert {"test_explicit_host_to_device", "test_scalar_reads", "test_host_waits",
            "test_grad_scaler_step_reads_found_inf"} <= set(rules)
    assert "test_second_device_does_not_exist" not in rules  # an f-string: parametrized
    # as check() writes it, leading newline included, so the lines are the test's lines
    assert rules["test_comparisons_to_python_bool"].startswith("\nimport torch\nt = ")
    assert all(compile(src, name, "exec") for name, src in rules.items())


def test_the_subset_names_programs_that_exist(fid):
    names = [p.name for p in fid.programs()]
    assert len(fid.SUBSET) == len(set(fid.SUBSET)) == 20
    assert [n for n in names if n in fid.SUBSET] == list(fid.SUBSET)  # in the same order
    # every sample and library program, and one compiled one (each compiles for a while)
    assert set(names[:11]) <= set(fid.SUBSET)
    assert not set(names[11:14]) & set(fid.SUBSET)


def test_a_profile_file_reaches_the_children_as_an_absolute_path(fid, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert fid.profile_arg("calibrated.json") == str(tmp_path / "calibrated.json")
    assert fid.profile_arg("out/gpu.prof") == str(tmp_path / "out" / "gpu.prof")
    assert fid.profile_arg("/abs/p.json") == "/abs/p.json"
    assert fid.profile_arg("h200-sxm-141gb") == "h200-sxm-141gb"  # a shipped name
    assert fid.profile_arg(None) is None


def test_children_find_this_checkout_and_share_the_cpus(fid, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(fid.os, "cpu_count", lambda: 16)
    env = fid.child_env(jobs=12)
    assert env["PYTHONPATH"] == f"{ROOT}:/elsewhere"
    assert env["OMP_NUM_THREADS"] == "1"
    assert fid.child_env(jobs=4)["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert fid.child_env(jobs=4)["OMP_NUM_THREADS"] == "3"  # the user's choice stands


def test_json_of_compared_and_problem_programs(fid):
    rows = [fid.compare_runs("same.py", make_trace(), make_trace()),
            fid.compare_runs("off.py", make_trace(), sim_trace())]
    problems = [fid.Problem("gone.py", "error", "real: timed out after 90 s"),
                fid.Problem("timm_amp.py", "skipped", "needs timm")]
    runs = {"same.py": {"real": {"device": "cuda", "exit": 0, "wall_s": 1.5, "error": None}}}
    doc = fid.to_json(rows, problems, ["off.py", "timm_amp.py", "same.py", "gone.py"], runs,
                      {"real_label": "real"})
    assert doc["schema_version"] == 1 and doc["real_label"] == "real"
    assert doc["time_goal"] == 0.25
    assert doc["counts"] == {"equal": 1, "differ": 1, "error": 1, "skipped": 1}
    assert [p["program"] for p in doc["programs"]] == ["off.py", "timm_amp.py", "same.py",
                                                       "gone.py"]
    off, timm, same, gone = doc["programs"]
    assert off == {
        "program": "off.py", "status": "differ",
        "sync_calls": {"real": 14, "sim": 15}, "sync_bytes": {"real": 4_136, "sim": 4_148},
        "waits": {"real": 2, "sim": 0},
        "total_ns": {"real": 10_000_000, "sim": 12_500_000, "ratio": 1.25},
        "memcpy_ns": {"real": 4_000_000, "sim": 4_200_000, "ratio": 1.05},
        "only_real": [{"kind": "wait", "sync": "sync", "trigger": "synchronize",
                       "site": "train.py:70", "calls": 2}],
        "only_sim": [{"kind": "HtoD", "sync": "sync", "trigger": "index",
                      "site": "model.py:30", "calls": 2}],
        "calls_differ": [{"kind": "DtoH", "sync": "sync", "trigger": "item",
                          "site": "train.py:50", "real_calls": 10, "sim_calls": 9}],
    }
    assert timm == {"program": "timm_amp.py", "status": "skipped", "message": "needs timm"}
    assert gone == {"program": "gone.py", "status": "error",
                    "message": "real: timed out after 90 s"}
    assert same["status"] == "equal" and same["runs"] == runs["same.py"]
    assert same["total_ns"] == {"real": 10_000_000, "sim": 10_000_000, "ratio": 1.0}


def test_render_names_the_programs_not_compared(fid):
    rows = [fid.compare_runs("off.py", make_trace(), sim_trace())]
    problems = [fid.Problem("gone.py", "error", "real: timed out after 90 s"),
                fid.Problem("timm_amp.py", "skipped", "needs timm")]
    assert fid.render(rows, problems=problems).splitlines()[-3:] == [
        "== gone.py  [ERROR] real: timed out after 90 s",
        "== timm_amp.py  [SKIPPED] needs timm",
        "1 programs; counts differ in 1: off.py; 1 error: gone.py; 1 skipped: timm_amp.py; "
        "'!' marks a time off by more than 25%"]


def test_sim_against_sim_smoke(fid, capsys, tmp_path):
    """Both runs side by side (--jobs 2), the JSON and the kept traces."""
    status = fid.main(["--sim-only", "--only", "test_comparisons_to_python_bool", "--jobs", "2",
                       "--json", str(tmp_path / "f.json"), "--keep", str(tmp_path / "traces")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.startswith("== test_comparisons_to_python_bool  [counts equal]\n")
    assert "  sync copies                    2             2     equal\n" in out
    assert out.endswith("1 programs; counts differ in 0; '!' marks a time off by more "
                        "than 25%\n")
    doc = json.loads((tmp_path / "f.json").read_text())
    assert (doc["real_label"], doc["real_device"], doc["device_profile"], doc["gpu"],
            doc["jobs"]) == ("sim#1", "sim", None, None, 2)
    assert doc["counts"] == {"equal": 1, "differ": 0, "error": 0, "skipped": 0}
    (prog,) = doc["programs"]
    assert (prog["program"], prog["status"]) == ("test_comparisons_to_python_bool", "equal")
    assert prog["sync_calls"] == {"real": 2, "sim": 2}
    assert prog["sync_bytes"] == {"real": 2, "sim": 2}
    assert prog["waits"] == {"real": 0, "sim": 0}
    assert prog["total_ns"]["real"] == prog["total_ns"]["sim"]  # the model is deterministic
    assert prog["total_ns"]["ratio"] == prog["memcpy_ns"]["ratio"] == 1.0
    assert (prog["only_real"], prog["only_sim"], prog["calls_differ"]) == ([], [], [])
    assert {side: (r["device"], r["exit"], r["error"]) for side, r in prog["runs"].items()} \
        == {"real": ("sim", 0, None), "sim": ("sim", 0, None)}
    assert all(isinstance(r["wall_s"], float) for r in prog["runs"].values())
    kept = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert kept == ["test_comparisons_to_python_bool.real.json",
                    "test_comparisons_to_python_bool.sim.json"]
    trace = Trace.load(tmp_path / "traces" / kept[0])
    assert sum(c.calls for c in trace.copies if c.sync) == 2


def test_a_run_past_its_timeout_is_killed_and_named(fid, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(fid, "programs", lambda: [
        fid.Program("sleeper", "sleeper.py", "import time\ntime.sleep(60)\n"),
        fid.Program("needs_more", "x.py", "", needs=("memcpy_doctor_no_such_module",))])
    status = fid.main(["--sim-only", "--jobs", "2", "--timeout", "1",
                       "--json", str(tmp_path / "f.json")])
    assert status == 1
    assert capsys.readouterr().out.splitlines() == [
        "== sleeper  [ERROR] real: timed out after 1 s; sim: timed out after 1 s",
        "== needs_more  [SKIPPED] needs memcpy_doctor_no_such_module",
        "0 programs; counts differ in 0; 1 error: sleeper; 1 skipped: needs_more; '!' marks a "
        "time off by more than 25%"]
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["counts"] == {"equal": 0, "differ": 0, "error": 1, "skipped": 1}
    sleeper, needs_more = doc["programs"]
    assert [(r["error"], r["exit"]) for r in sleeper["runs"].values()] == [
        ("timed out after 1 s", -9), ("timed out after 1 s", -9)]  # SIGKILL
    assert needs_more == {"program": "needs_more", "status": "skipped",
                          "message": "needs memcpy_doctor_no_such_module"}


def test_nothing_starts_close_to_the_deadline(fid, capsys):
    assert fid.main(["--sim-only", "--only", "test_scalar_reads", "--deadline", "4"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "== test_scalar_reads  [ERROR] real: not started: under 5 s before the deadline; "
        "sim: not started: under 5 s before the deadline")


def test_usage_errors_exit_2(fid, capsys):
    assert fid.main(["--sim-only", "--only", "no-such-program"]) == 2
    assert fid.main(["--sim-only", "--device-profile", "v100"]) == 2
    assert fid.main(["--sim-only", "--subset", "--only", "test_no_copy_cases"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "fidelity: error: no program matches ['no-such-program']"
    assert err[1].startswith("fidelity: error: no device profile named 'v100'; shipped: ")
    assert err[2] == "fidelity: error: no program matches ['test_no_copy_cases'] in the subset"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_exit_2(fid, capsys):
    assert fid.main(["--only", "test_scalar_reads"]) == 2
    assert capsys.readouterr().err.startswith("fidelity: error: needs a CUDA GPU")


@pytest.mark.cuda
def test_real_and_simulated_agree_on_the_sync_rules(fid, capsys):
    """Copy and wait counts equal on a real GPU for a few sync-rule scripts."""
    status = fid.main(["--only", "test_scalar_reads", "--only", "test_host_waits",
                       "--only", "test_data_dependent_shapes", "--jobs", "6"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.count("[counts equal]") == 3
