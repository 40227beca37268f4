"""A quick smoke run of the benchmark workloads (their numbers are measured by
benchmarks/run.py, never asserted here)."""

from __future__ import annotations

import importlib.util
import pathlib
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

