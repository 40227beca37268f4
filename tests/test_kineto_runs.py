"""Several torch.profiler traces read together (issue 43): a folder, a glob or several files
of one run are its ranks; files of different runs are refused with one line naming the
difference, unless --allow-mixed."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from helpers import cli_in_process
from memcpy_doctor.kineto.reader import from_kineto
from memcpy_doctor.run.traces import InputError, load_traces
from test_kineto import kineto_trace

#: 2023-11-14 22:13:20 UTC, in ns since the epoch
BASE_NS = 1_700_000_000 * 10**9


def _rank(rank: int, world: int = 2, device: str = "NVIDIA A100-SXM4-80GB",
          base_ns: int | None = BASE_NS, **dist: object) -> dict:
    data = {**kineto_trace(), "deviceProperties": [{"name": device}],
            "distributedInfo": {"rank": rank, "world_size": world, "backend": "nccl", **dist}}
    if base_ns is not None:
        data["baseTimeNanoseconds"] = base_ns
    return data


def _write(path: Path, data: dict) -> str:
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
    else:
        path.write_text(json.dumps(data))
    return str(path)


def _refusal(tmp_path: Path, a: dict, b: dict) -> str:
    names = [_write(tmp_path / "a.json", a), _write(tmp_path / "b.json", b)]
    with pytest.raises(InputError) as e:
        load_traces(names)
    return str(e.value)


def test_the_start_is_read_from_kineto_base_time_or_absolute_timestamps():
    assert from_kineto(_rank(0), "k.json").meta.started_ns == BASE_NS  # first event at ts 0
    absolute = kineto_trace()
    for e in absolute["traceEvents"]:
        e["ts"] += 1_700_000_000 * 10**6
    assert from_kineto(absolute, "k.json").meta.started_ns == BASE_NS
    assert from_kineto(kineto_trace(), "k.json").meta.started_ns is None  # relative, no base
    meta = from_kineto(_rank(1, world=4, pg_count=3), "k.json").meta
    assert meta.distributed == {"backend": "nccl", "world_size": 4}  # what all ranks share


def test_the_ranks_of_one_run_are_read_together_in_rank_order(tmp_path):
    names = [_write(tmp_path / "r1.json", _rank(1, base_ns=BASE_NS + 2 * 10**9)),
             _write(tmp_path / "r0.json", _rank(0))]
    traces, order = load_traces(names)
    assert [t.meta.rank for t in traces] == [0, 1] and order == names[::-1]


@pytest.mark.parametrize("a, b, why", [
    (_rank(0), _rank(0), "both are rank 0"),
    (_rank(0, world=16), _rank(3, world=8, device="NVIDIA A100-PG509-200"),
     "device NVIDIA A100-SXM4-80GB vs NVIDIA A100-PG509-200"),
    (_rank(0, world=16), _rank(3, world=8), "world size 16 vs 8"),
    (_rank(0), _rank(1, backend="gloo"), "distributedInfo backend nccl vs gloo"),
    (_rank(0), _rank(1, base_ns=BASE_NS + 3 * 86400 * 10**9),
     "begun 3 days apart (2023-11-14 22:13:20 UTC vs 2023-11-17 22:13:20 UTC)"),
    (_rank(0), kineto_trace(), "a trace without a rank (a run of one process)"),
])
def test_traces_of_different_runs_are_refused_naming_the_difference(tmp_path, a, b, why):
    assert _refusal(tmp_path, a, b) == (
        f"{tmp_path / 'a.json'} and {tmp_path / 'b.json'} are not the ranks of one run: {why} "
        "(give one run's traces, or --allow-mixed to read them together all the same)")


def test_ranks_begun_within_minutes_are_one_run(tmp_path):
    names = [_write(tmp_path / "a.json", _rank(0)),
             _write(tmp_path / "b.json", _rank(1, base_ns=BASE_NS + 599 * 10**9))]
    assert len(load_traces(names)[0]) == 2


@pytest.mark.parametrize("command", ["explain", "check", "report"])
def test_the_cli_refuses_two_runs_in_one_line_unless_allow_mixed(tmp_path, command):
    _write(tmp_path / "a.json.gz", _rank(0, world=16))
    _write(tmp_path / "b.json.gz", _rank(3, world=8, device="NVIDIA A100-PG509-200"))
    gate = ["--max", "sync_calls=100"] if command == "check" else []
    r = cli_in_process(command, "a.json.gz", "b.json.gz", *gate, cwd=tmp_path)
    assert r.status == 2
    assert r.err == ("memcpy-doctor: error: a.json.gz and b.json.gz are not the ranks of "
                        "one run: device NVIDIA A100-SXM4-80GB vs NVIDIA A100-PG509-200 (give "
                        "one run's traces, or --allow-mixed to read them together all the "
                        "same)\n")
    r = cli_in_process(command, "a.json.gz", "b.json.gz", *gate, "--allow-mixed", cwd=tmp_path)
    assert r.status == 0, r.err


def test_diff_refuses_a_side_of_two_runs(tmp_path):
    _write(tmp_path / "b.rank0.json", _rank(0))
    _write(tmp_path / "b.rank1.json", _rank(1, backend="gloo"))
    _write(tmp_path / "a.json", kineto_trace())
    r = cli_in_process("diff", "b.json", "a.json", cwd=tmp_path)
    assert r.status == 2 and "distributedInfo backend nccl vs gloo" in r.err
    assert cli_in_process("diff", "b.json", "a.json", "--allow-mixed",
                          cwd=tmp_path).status == 0


def test_a_folder_is_read_as_the_ranks_it_holds(tmp_path):
    """What tensorboard_trace_handler writes: one `.pt.trace.json` per worker, other files
    beside them ignored."""
    run = tmp_path / "log"
    run.mkdir()
    for rank in (1, 0):
        _write(run / f"host_{100 + rank}.1700000000000.pt.trace.json.gz", _rank(rank))
    (run / "events.out.tfevents.1700000000").write_text("not a trace")
    r = cli_in_process("report", "log", cwd=tmp_path)
    assert r.status == 0, r.err
    assert r.out.count("Rank: 0 of 2") == 1 and r.out.count("Rank: 1 of 2") == 1
    r = cli_in_process("explain", "log", cwd=tmp_path)
    assert r.status == 0 and "rank" in r.out.lower()
    r = cli_in_process("import", "log", "-o", "run.json", cwd=tmp_path)
    assert r.status == 0, r.err
    assert (tmp_path / "run.rank0.json").exists() and (tmp_path / "run.rank1.json").exists()


def test_a_folder_without_traces_and_a_folder_of_two_runs_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    r = cli_in_process("report", "empty", cwd=tmp_path)
    assert (r.status, r.err) == (2, "memcpy-doctor: error: empty: a folder with no "
                                           "trace file in it (.json, .json.gz)\n")
    (tmp_path / "two").mkdir()
    _write(tmp_path / "two" / "w.1.pt.trace.json", _rank(0))
    _write(tmp_path / "two" / "w.2.pt.trace.json", _rank(0))  # a second recording of rank 0
    r = cli_in_process("explain", "two", cwd=tmp_path)
    assert r.status == 2 and "both are rank 0" in r.err


def test_the_shared_traces_are_not_one_run():
    shared = Path(__file__).resolve().parents[2] / "shared" / "kineto"
    if not shared.is_dir():
        pytest.skip("../shared/kineto is not here")
    with pytest.raises(InputError, match="a trace without a rank"):  # its device unnamed
        load_traces([str(shared / "a100_alexnet.json.gz"), str(shared / "sampled_rank0.json.gz")])


def test_a_profiled_trace_records_when_it_began(tmp_path):
    import torch
    from memcpy_doctor.tracer import Tracer
    before = time.time_ns()
    with Tracer(device="sim") as tracer:
        torch.ones(2).sum()
    assert before <= tracer.trace.meta.started_ns <= time.time_ns()
