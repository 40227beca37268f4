"""benchmarks/fidelity.py: the comparison of a real and a simulated run on hand-built traces
(exact figures), the programs it runs, and a sim-against-sim smoke run; the real GPU run is
cuda-marked."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys

import pytest
import torch

from helpers import SYNC_SITE, TRAIN_STEP_ITEM, make_copies, make_trace
from memcpy_doctor.core.trace import CopyRecord, Site, WaitRecord

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


def test_programs_are_the_samples_and_the_sync_rule_scripts(fid):
    names = [name for name, _, _ in fid.programs()]
    assert names[:4] == ["clean_pinned.py", "embedding_l2.py", "item_every_step.py",
                         "shape_slice_crop.py"]
    rules = dict(fid.sync_rule_programs())
    assert {"test_explicit_host_to_device", "test_scalar_reads", "test_host_waits",
            "test_grad_scaler_step_reads_found_inf"} <= set(rules)
    assert "test_second_device_does_not_exist" not in rules  # an f-string: parametrized
    # as check() writes it, leading newline included, so the lines are the test's lines
    assert rules["test_comparisons_to_python_bool"].startswith("\nimport torch\nt = ")
    assert all(compile(src, name, "exec") for name, src in rules.items())


def test_sim_against_sim_smoke(fid, capsys):
    assert fid.main(["--sim-only", "--only", "test_comparisons_to_python_bool"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== test_comparisons_to_python_bool  [counts equal]\n")
    assert "  sync copies                    2             2     equal\n" in out
    assert out.endswith("1 programs; counts differ in 0; '!' marks a time off by more "
                        "than 25%\n")


def test_usage_errors_exit_2(fid, capsys):
    assert fid.main(["--sim-only", "--only", "no-such-program"]) == 2
    assert fid.main(["--sim-only", "--device-profile", "v100"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "fidelity: error: no program matches ['no-such-program']"
    assert err[1].startswith("fidelity: error: no device profile named 'v100'; shipped: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_exit_2(fid, capsys):
    assert fid.main(["--only", "test_scalar_reads"]) == 2
    assert capsys.readouterr().err.startswith("fidelity: error: needs a CUDA GPU")


@pytest.mark.cuda
def test_real_and_simulated_agree_on_the_sync_rules(fid, capsys):
    """Copy and wait counts equal on a real GPU for a few sync-rule scripts."""
    status = fid.main(["--only", "test_scalar_reads", "--only", "test_host_waits",
                       "--only", "test_data_dependent_shapes"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.count("[counts equal]") == 3
