"""A quick smoke run of the benchmark workloads (their numbers are measured by
benchmarks/run.py, never asserted here)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

import memcpy_doctor

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["small-ops", "transformer", "generate"])
def test_workloads_run_plain_and_traced(bench, name):
    fn, _ = bench.WORKLOADS[name]
    assert bench.count_ops(fn, 2) > 0
    with memcpy_doctor.profiler(device="sim") as prof:
        fn("cuda", 2)
    assert any(o.device == "cuda:0" for o in prof.trace.ops)
    if name == "generate":  # the token read back every step
        assert sum(c.calls for c in prof.trace.copies if c.trigger == "int") == 2
