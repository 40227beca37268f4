"""A quick smoke run of the benchmark workloads (their numbers are measured by
benchmarks/run.py, never asserted here)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import memcpy_doctor

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name: str):
    path = ROOT / "benchmarks" / name
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load("run.py")


@pytest.mark.parametrize("name", ["small-ops", "transformer", "generate"])
def test_workloads_run_plain_and_traced(bench, name):
    fn, _ = bench.WORKLOADS[name]
    assert bench.count_ops(fn, 2) > 0
    with memcpy_doctor.profiler(device="sim") as prof:
        fn("cuda", 2)
    assert any(o.device == "cuda:0" for o in prof.trace.ops)
    if name == "generate":  # the token read back every step
        assert sum(c.calls for c in prof.trace.copies if c.trigger == "int") == 2


def test_instruction_counts_are_read_from_callgrind_annotate_output():
    instructions = _load("instructions.py")
    annotated = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
  4,000,000 (40.00%)  /build/Python-3.11.7/./Modules/itertoolsmodule.c:takewhile_next [/lib/libpython3.11.so]
  3,500,000 (35.00%)  ???:dropwhile_next [/usr/lib/libpython3.11.so]
  2,000,000 (20.00%)  /build/Python-3.11.7/./Modules/itertoolsmodule.c:filterfalse_next [/lib/libpython3.11.so]
  1,000,000 (10.00%)  /build/Python-3.11.7/./Modules/itertoolsmodule.c:starmap_next
          6 ( 0.00%)  /build/Python-3.11.7/./Include/object.h:starmap_next [/lib/libpython3.11.so]
    800,000 ( 8.00%)  /build/Python-3.11.7/./Modules/itertoolsmodule.c:compress_next_
    900,000 ( 9.00%)  /build/Python-3.11.7/./Modules/itertoolsmodule.c:starmap_new [/lib/libpython3.11.so]
"""
    assert instructions.parse_counts(annotated) == {
        "takewhile_next": 4_000_000, "dropwhile_next": 3_500_000,
        "filterfalse_next": 2_000_000, "starmap_next": 1_000_000}


def test_instruction_benchmark_runs_every_mode_natively():
    """Without callgrind the measuring run is plain Python: every mode runs and it prints the
    op count (4 ops an iteration and the two starting tensors)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "instructions.py"),
                           "--measure", "small-ops"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(4 * 1000 + 2)]


def test_the_python_table_mode_runs_it_and_puts_the_tracers_own_back(bench, monkeypatch):
    from memcpy_doctor.tracer import collector, producers
    used = []

    class Recording(producers.PyProducerTable):
        def __init__(self, *args):
            super().__init__(*args)
            used.append(self)

    monkeypatch.setattr(bench, "PyProducerTable", Recording)
    fn, _ = bench.WORKLOADS["small-ops"]
    bench.modes(fn, 2)["memcpy-doctor (host, Python table)"]()
    assert len(used) == 1  # (emptied when the run ended)
    assert collector.ProducerTable is producers.ProducerTable


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_gpu_trace_cost_without_a_gpu_is_one_line_and_status_2(capsys):
    assert _load("gpu_trace_cost.py").main(["-n", "10"]) == 2
    assert capsys.readouterr().err == (
        "gpu_trace_cost: error: needs a CUDA GPU (torch sees none here)\n")


FAKE_PYTHON = """\
#!/usr/bin/env bash
echo "fake python: $*"
if [ "$1" = - ]; then cat > /dev/null; fi
case "$*" in *calibrate*) exit 2 ;; esac
"""
FAKE_NVIDIA_SMI = """\
#!/usr/bin/env bash
case "$*" in *--query-gpu=name*) echo "NVIDIA H200" ;; *) {hang}echo "fake nvidia-smi" ;; esac
"""


def gpu_run(tmp_path: pathlib.Path, budget: int, hang: bool = False):
    """benchmarks/gpu_run.sh with a fake python (every step exits 0 at once but calibrate,
    which exits 2) and a fake nvidia-smi (an H200; `hang`: its first call sleeps)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(FAKE_PYTHON)
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI.format(hang="sleep 60; " if hang else ""))
    for f in fake.iterdir():
        f.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "OUT": str(out),
           "PYTHON": str(fake / "python"), "GPU_RUN_BUDGET": str(budget), "GPU_RUN_JOBS": "12"}
    env.pop("GPU_RUN_SIM", None)
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_run.sh")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    return done, out, json.loads((out / "summary.json").read_text())


def test_gpu_run_runs_every_step_in_order_and_records_each(tmp_path):
    done, out, summary = gpu_run(tmp_path, budget=285)
    assert done.returncode == 1 and done.stdout == done.stderr == ""  # calibrate failed
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "summary.json"]
    py = str(tmp_path / "bin" / "python")
    steps = summary["steps"]
    assert [(s["name"], s["exit"], s["timed_out"], s["limit_s"]) for s in steps[:6]] == [
        ("nvidia-smi", 0, False, 15), ("versions", 0, False, 30),
        ("cuda-tests", 0, False, 120), ("calibrate", 2, False, 60),
        ("gpu-trace-cost", 0, False, 45), ("light-overhead", 0, False, 45)]
    # fidelity: what is left of the budget, 150 s at most; it stops itself 15 s before
    limit = steps[6]["limit_s"]
    assert (steps[6]["name"], steps[6]["exit"], steps[6]["timed_out"]) == ("fidelity", 0, False)
    assert limit in (149, 150)  # (whole seconds spent so far: none or one)
    assert [s["command"] for s in steps[:6]] == [
        "nvidia-smi", f"{py} -",
        f"{py} -m pytest -q -p no:cacheprovider -m cuda -rfE -o faulthandler_timeout=60 "
        f"--junitxml={out}/cuda-tests.xml tests",
        f"{py} -m memcpy_doctor calibrate --quick -o {out}/calibrated.json --measurements "
        f"{out}/measurements.json",
        f"{py} benchmarks/gpu_trace_cost.py -n 10000 --repeats 3 --json "
        f"{out}/gpu-trace-cost.json",
        f"{py} benchmarks/light_overhead.py --iters 200 --repeats 3"]
    # no calibrated profile: the shipped one of the GPU nvidia-smi names
    assert steps[6]["command"].startswith(
        f"{py} benchmarks/fidelity.py --subset --jobs 12 --timeout 90 --deadline {limit - 15} "
        f"--device-profile h200-sxm-141gb --json {out}/fidelity.json --keep /")
    assert (summary["schema_version"], summary["sim"], summary["budget_s"],
            summary["python"]) == (1, False, 285, py)
    assert all(isinstance(s["wall_s"], float) for s in steps)
    log = (out / "log.txt").read_text().splitlines()
    assert log[:3] == ["=== nvidia-smi (limit 15 s): nvidia-smi", "fake nvidia-smi",
                       log[2]]
    assert log[2].startswith("=== nvidia-smi: exit 0 after ")
    assert "fake python: -m memcpy_doctor calibrate --quick -o " \
           f"{out}/calibrated.json --measurements {out}/measurements.json" in log
    assert log[-1].startswith("=== done in ")


def test_gpu_run_stops_a_step_at_the_budget_and_runs_none_after(tmp_path):
    done, out, summary = gpu_run(tmp_path, budget=5, hang=True)
    assert done.returncode == 1
    steps = summary["steps"]
    assert (steps[0]["name"], steps[0]["exit"], steps[0]["timed_out"], steps[0]["limit_s"]) \
        == ("nvidia-smi", 124, True, 5)
    assert [(s["name"], s["exit"], s["limit_s"]) for s in steps[1:]] == [
        ("versions", None, 0), ("cuda-tests", None, 0), ("calibrate", None, 0),
        ("gpu-trace-cost", None, 0), ("light-overhead", None, 0), ("fidelity", None, 0)]
    log = (out / "log.txt").read_text()
    assert "=== versions: not run, the budget of 5 s is spent\n" in log


def test_explain_replay_benchmark_runs(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "explain_replay.py"),
                           "--ops", "700", "--repeats", "1", "--keep",
                           str(tmp_path / "t.json")], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "701 op calls, 1001 timeline events" in done.stdout  # (randn first; 300 reads)
    found = re.search(r"explain with the replay: +[\d.]+ ms \((\d+) suggestions\)",
                      done.stdout)
    assert found and int(found.group(1)) >= 1  # (the loop's .item() at least)
