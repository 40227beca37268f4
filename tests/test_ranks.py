"""Several ranks of one distributed run: rank naming, merge and compare on hand-built traces
(exact figures), the CLI on saved rank traces, and end to end with the gloo backend on CPU
(two processes here, under `profile --ranks 2` and under torchrun)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import (LOG_METRICS, MAIN, TRAIN_STEP_ITEM, TRAIN_STEP_TO, make_copies,
                     make_trace)
from memcpy_doctor.analysis.ranks import (PathDifference, RankDifference, compare_ranks, merge,
                                          sync_paths)
from memcpy_doctor.cli import main
from memcpy_doctor.run.launch import RankExit, rank_environ, worst_status
from memcpy_doctor.run.rankenv import (RankError, RankInfo, expand_traces, path_for, rank_info,
                                       rank_path)
from memcpy_doctor.render.ranks import render_ranks_text
from memcpy_doctor.render.text import render_text
from memcpy_doctor.core.trace import CopyRecord, OpRef, Site, Trace, TraceError, load_trace

EXTRA = Site("/work/proj/train.py", 80, "debug")


def rank_trace(rank: int, world: int = 3, item_calls: int = 10, extra: bool = False,
               **meta) -> Trace:
    """make_trace as rank `rank`: `item_calls` loss.item() calls, `extra`: one more sync
    copy path (a debug .item() at train.py:80)."""
    copies = make_copies()
    copies[1].calls = item_calls
    if extra:
        copies.append(CopyRecord(direction="DtoH", sync=True, pinned=False, trigger="item",
                                 calls=1, bytes=4, host_ns=50_000, device_ns=50_000,
                                 site=EXTRA, stack=[EXTRA], producer=None, consumer=None))
    return make_trace(rank=rank, world_size=world, copies=copies, **meta)


# ---------------------------------------------------------------------------------------------
# rankenv: which rank, which file
# ---------------------------------------------------------------------------------------------

def test_rank_info_from_the_environment():
    assert rank_info({}) is None
    assert rank_info({"RANK": "1"}) is None  # no WORLD_SIZE: not a launcher's worker
    assert rank_info({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == RankInfo(1, 4, 1)
    assert rank_info({"RANK": "5", "WORLD_SIZE": "8"}) == RankInfo(5, 8, 5)
    for bad in ({"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"},
                {"RANK": "-1", "WORLD_SIZE": "2"}, {"RANK": "0", "WORLD_SIZE": "0"}):
        with pytest.raises(RankError):
            rank_info(bad)


def test_rank_paths():
    assert rank_path("memcpy_doctor_trace.json", 0) == "memcpy_doctor_trace.rank0.json"
    assert rank_path("out/t.json", 12) == os.path.join("out", "t.rank12.json")
    assert rank_path("a.b/trace", 3) == os.path.join("a.b", "trace.rank3")
    assert path_for("t.json", None) == "t.json"
    assert path_for("t.json", RankInfo(0, 1, 0)) == "t.json"  # one process: the name as given
    assert path_for("t.json", RankInfo(1, 2, 1)) == "t.rank1.json"


def test_expand_traces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for r in (0, 1, 2, 10):
        Path(f"t.rank{r}.json").write_text("{}")
    Path("other.json").write_text("{}")
    Path("t.rankX.json").write_text("{}")
    ranks = ["t.rank0.json", "t.rank1.json", "t.rank2.json", "t.rank10.json"]
    assert expand_traces(["t.json"]) == ranks  # the name given to -o: its rank traces
    assert expand_traces(["t.rank*.json"]) == ranks + ["t.rankX.json"]  # natural order
    assert expand_traces(["other.json", "t.rank1.json"]) == ["other.json", "t.rank1.json"]
    assert expand_traces(["missing.json"]) == ["missing.json"]  # loading it names the problem
    with pytest.raises(RankError, match="nope.rank\\*.json: no trace file matches"):
        expand_traces(["nope.rank*.json"])


def test_meta_rank_round_trip_and_old_traces(tmp_path):
    trace = rank_trace(2, world=4)
    path = tmp_path / "t.json"
    trace.save(path)
    loaded = load_trace(path)
    assert (loaded.meta.rank, loaded.meta.world_size) == (2, 4)
    data = json.loads(path.read_text())
    assert (data["meta"]["rank"], data["meta"]["world_size"]) == (2, 4)
    del data["meta"]["rank"], data["meta"]["world_size"]  # a trace from before ranks
    path.write_text(json.dumps(data))
    assert (load_trace(path).meta.rank, load_trace(path).meta.world_size) == (None, None)
    data["meta"]["rank"] = "0"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match="meta.rank"):
        load_trace(path)


def test_report_names_the_rank():
    assert "\nRank: 2 of 4\n" in render_text(rank_trace(2, world=4))
    assert "Rank:" not in render_text(make_trace())


# ---------------------------------------------------------------------------------------------
# analysis.ranks: exact figures
# ---------------------------------------------------------------------------------------------

def test_sync_paths():
    assert sync_paths(make_trace()) == {("HtoD", "to", TRAIN_STEP_TO): 4,
                                        ("DtoH", "item", TRAIN_STEP_ITEM): 10}


def test_identical_ranks_are_one_group():
    comp = compare_ranks([rank_trace(r) for r in range(3)])
    assert comp.groups == [[0, 1, 2]]
    assert comp.differences == []
    assert comp.uniform
    f = comp.ranks[1]
    assert (f.index, f.rank, f.total_ns, f.memcpy_calls, f.memcpy_ns, f.sync_calls,
            f.sync_ns) == (1, 1, 10_000_000, 19, 4_000_000, 14, 3_000_000)


def test_a_rank_with_more_calls_on_a_path_is_flagged():
    comp = compare_ranks([rank_trace(0), rank_trace(1, item_calls=11), rank_trace(2)])
    assert comp.groups == [[0, 2], [1]]
    assert comp.differences == [RankDifference(1, 1, [
        PathDifference("DtoH", "item", TRAIN_STEP_ITEM, 11, 10)])]


def test_a_rank_with_another_path_is_flagged_against_the_majority():
    # rank 0 is the odd one: the reference is the larger group (ranks 1 and 2)
    comp = compare_ranks([rank_trace(0, extra=True, item_calls=9), rank_trace(1),
                          rank_trace(2)])
    assert comp.groups == [[1, 2], [0]]
    assert comp.differences == [RankDifference(0, 0, [
        PathDifference("DtoH", "item", TRAIN_STEP_ITEM, 9, 10),
        PathDifference("DtoH", "item", EXTRA, 1, 0)])]


def test_a_tie_takes_the_group_of_the_first_trace_as_reference():
    comp = compare_ranks([rank_trace(0, world=2), rank_trace(1, world=2, extra=True)])
    assert comp.groups == [[0], [1]]
    assert [(d.rank, d.paths) for d in comp.differences] == [
        (1, [PathDifference("DtoH", "item", EXTRA, 1, 0)])]


def test_async_copies_do_not_make_ranks_differ():
    copies = make_copies()
    copies[2].calls = 99  # the async DtoH at log_metrics
    assert compare_ranks([rank_trace(0), make_trace(rank=1, world_size=3,
                                                    copies=copies)]).uniform


def test_merge_sums_every_figure():
    a, b = rank_trace(0, world=2), rank_trace(1, world=2, item_calls=12)
    b.events[0].min_ns, b.events[0].max_ns = 200_000, 900_000  # aten::mm
    b.meta.untraced = ["ops in other threads: 1 thread(s)"]
    b.meta.exit_status, b.meta.ended_by = 3, "exit"
    before = (a.to_dict(), b.to_dict())
    m = merge([a, b])
    assert (a.to_dict(), b.to_dict()) == before  # the inputs are not changed
    s = m.summary
    assert (s.total_ns, s.computation_ns, s.overhead_ns) == (20_000_000, 10_000_000,
                                                             10_000_000)
    assert (s.memcpy_all.calls, s.memcpy_all.time_ns) == (40, 8_000_000)
    assert (s.memcpy_sync.calls, s.memcpy_sync.time_ns) == (30, 6_000_000)
    assert (s.memcpy_async.calls, s.memcpy_async.time_ns) == (10, 2_000_000)
    mm = next(e for e in m.events if e.name == "aten::mm")
    assert (mm.calls, mm.cpu_ns, mm.gpu_ns, mm.min_ns, mm.max_ns) == (
        20, 2_000_000, 6_000_000, 200_000, 900_000)
    assert [(c.trigger, c.site, c.calls, c.bytes, c.host_ns, c.device_ns) for c in m.copies] == [
        ("to", TRAIN_STEP_TO, 8, 8_192, 3_000_000, 1_000_000),
        ("item", TRAIN_STEP_ITEM, 22, 80, 1_800_000, 200_000),
        ("to", LOG_METRICS, 10, 4_000_000, 1_000_000, 1_000_000)]
    assert m.copies[0].stack == [TRAIN_STEP_TO, MAIN]
    assert [(o.op, o.calls, o.host_ns, o.device_ns) for o in m.ops] == [
        ("aten::mm", 20, 2_000_000, 6_000_000), ("aten::add", 40, 4_000_000, 2_000_000)]
    assert [(w.kind, w.calls, w.wait_ns) for w in m.waits] == [("synchronize", 4, 600_000)]
    assert (m.meta.rank, m.meta.world_size) == (None, 2)
    assert (m.meta.exit_status, m.meta.ended_by) == (3, "exit")
    assert m.meta.untraced == ["rank 1: ops in other threads: 1 thread(s)"]
    assert m.transfers == []


def test_merge_keeps_paths_apart_that_differ_in_producer():
    a = rank_trace(0)
    b = rank_trace(1)
    b.copies[0].producer = OpRef("aten::randn", "cpu", TRAIN_STEP_TO)
    m = merge([a, b])
    assert [(c.trigger, c.calls) for c in m.copies] == [("to", 4), ("item", 20),
                                                       ("to", 10), ("to", 4)]


def test_compare_and_merge_need_a_trace():
    with pytest.raises(ValueError):
        compare_ranks([])
    with pytest.raises(ValueError):
        merge([])


def test_ranks_text():
    comp = compare_ranks([rank_trace(0), rank_trace(1, item_calls=11), rank_trace(2)])
    text = render_ranks_text(comp, ["t.rank0.json", "t.rank1.json", "t.rank2.json"],
                             "/work/proj")
    assert text == textwrap.dedent("""\
        Ranks: 3 traces; times are modeled (simulated GPU)
        Rank    Trace         Total (ms)    Memcpy calls    Memcpy (ms)    Sync calls    Sync (ms)    Ended
        rank 0  t.rank0.json  10            19              4              14            3            ok
        rank 1  t.rank1.json  10            20              4              15            3            ok
        rank 2  t.rank2.json  10            19              4              14            3            ok
        all     (merged)      30            58              12             43            9

        Rank 1 makes other sync copies than ranks 0, 2:
          Copy       Site         Calls    Calls on ranks 0, 2
          DtoH item  train.py:50  11       10
        """)  # noqa: E501
    same = render_ranks_text(compare_ranks([rank_trace(0), rank_trace(1)]), ["a", "b"])
    assert same.endswith("\n\nAll 2 traces make the same sync copies.\n")


def test_light_rank_traces_say_their_times_are_the_wall_clock_s():
    """Light mode's times on the simulated GPU are measured around its wrapped calls, not
    modeled: the per-rank table says so, as explain and the report do."""
    light = render_ranks_text(compare_ranks([rank_trace(0, light=True),
                                             rank_trace(1, light=True)]), ["a", "b"])
    assert light.startswith("Ranks: 2 traces; light mode: times are this machine's wall "
                            "clock (simulated GPU)\n")
    full = render_ranks_text(compare_ranks([rank_trace(0), rank_trace(1)]), ["a", "b"])
    assert full.startswith("Ranks: 2 traces; times are modeled (simulated GPU)\n")


def test_traces_without_ranks_are_labelled_by_position():
    comp = compare_ranks([make_trace(), make_trace(exit_status=1, ended_by="exception")])
    text = render_ranks_text(comp, ["a.json", "b.json"])
    assert "\ntrace #0  a.json" in text
    assert "exception (1)" in text


# ---------------------------------------------------------------------------------------------
# launch: pure parts
# ---------------------------------------------------------------------------------------------

def test_rank_environ_is_what_torchrun_sets():
    env = rank_environ({"PATH": "/bin", "OMP_NUM_THREADS": "4"}, 1, 2, 29500)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "PATH")} == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "OMP_NUM_THREADS": "4",
        "PATH": "/bin"}
    assert rank_environ({}, 0, 2, 1)["OMP_NUM_THREADS"] == "1"


def test_worst_status_ignores_ranks_the_launcher_stopped():
    assert worst_status([RankExit(0, 0, None), RankExit(1, 0, None)]) == 0
    assert worst_status([RankExit(0, 1, None), RankExit(1, 143, 15, stopped=True)]) == 1
    assert worst_status([RankExit(0, 3, None), RankExit(1, 137, 9)]) == 137


# ---------------------------------------------------------------------------------------------
# The CLI on saved rank traces (in this process)
# ---------------------------------------------------------------------------------------------

def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        status = 0
    except SystemExit as e:
        status = e.code or 0
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def rank_dir(tmp_path, monkeypatch):
    """t.rank0..2.json in the cwd, rank 1 with one more loss.item() per run; u.rank0..2.json
    the same run after a fix (no loss.item() left)."""
    monkeypatch.chdir(tmp_path)
    for r in range(3):
        rank_trace(r, item_calls=11 if r == 1 else 10).save(f"t.rank{r}.json")
        copies = [c for c in make_copies() if c.trigger != "item"]
        make_trace(rank=r, world_size=3, copies=copies).save(f"u.rank{r}.json")
    return tmp_path


def test_explain_takes_the_rank_traces(rank_dir, capsys):
    status, out, err = cli(capsys, "explain", "t.json")
    assert (status, err) == (0, "")
    assert out.startswith("Ranks: 3 traces; times are modeled (simulated GPU)\n")
    assert "Rank 1 makes other sync copies than ranks 0, 2:" in out
    assert "\n== Ranks 0, 2 ==\n" in out and "\n== Rank 1 ==\n" in out
    assert out.count("Copies the host waited for") == 2
    # a glob gives the same; JSON has the ranks and one explanation per group
    assert cli(capsys, "explain", "t.rank*.json")[1] == out
    status, out, _ = cli(capsys, "explain", "t.json", "--format", "json")
    data = json.loads(out)
    assert data["ranks"]["groups"] == [[0, 2], [1]]
    assert data["ranks"]["differences"][0]["paths"][0]["calls"] == 11
    assert [e["traces"] for e in data["explanations"]] == [["t.rank0.json", "t.rank2.json"],
                                                           ["t.rank1.json"]]
    status, out, _ = cli(capsys, "explain", "t.json", "--format", "markdown")
    assert out.startswith("## Ranks\n") and "\n# Rank 1\n" in out


def test_report_prints_each_rank_in_order(rank_dir, capsys):
    status, out, err = cli(capsys, "report", "t.json")
    assert (status, err) == (0, "")
    assert out.count("Profiling Report") == 3
    assert [out.index(f"Rank: {r} of 3") for r in range(3)] == sorted(
        out.index(f"Rank: {r} of 3") for r in range(3))
    assert "(from t.rank2.json)" in out
    status, one, _ = cli(capsys, "report", "t.rank1.json")
    assert status == 0 and one.count("Profiling Report") == 1 and "(from" not in one


def test_check_gates_every_rank(rank_dir, capsys):
    status, out, err = cli(capsys, "check", "t.json", "--max", "sync_calls=14")
    assert status == 1, err
    assert "== rank 0 (t.rank0.json) ==\nok   sync_calls = 14, max 14\n" in out
    assert "== rank 1 (t.rank1.json) ==\nFAIL sync_calls = 15, max 14" in out
    assert "Rank 1 makes other sync copies than ranks 0, 2:" in out
    assert out.endswith("memcpy-doctor check: FAILED (2 of 3 traces passed)\n")
    status, out, _ = cli(capsys, "check", "t.json", "--max", "sync_calls=15",
                         "--format", "json")
    data = json.loads(out)
    assert status == 0 and data["passed"]
    assert [(r["rank"], r["passed"]) for r in data["ranks"]] == [(0, True), (1, True),
                                                                 (2, True)]
    # each rank against the same rank's baseline; or all against one trace
    for r in range(3):
        rank_trace(r, item_calls=11).save(f"b.rank{r}.json")
    status, out, _ = cli(capsys, "check", "t.json", "--baseline", "b.json")
    assert status == 0, out
    status, out, _ = cli(capsys, "check", "t.json", "--baseline", "t.rank0.json")
    assert status == 1
    for r, verdict in ((0, "ok  "), (1, "FAIL"), (2, "ok  ")):
        assert f"== rank {r} (t.rank{r}.json) ==\n{verdict} " in out
    assert out.endswith("memcpy-doctor check: FAILED (2 of 3 traces passed)\n")
    status, out, err = cli(capsys, "check", "t.json", "--max", "sync_calls=1",
                           "--format", "sarif")
    assert status == 2 and "gates one trace at a time, not 3" in err


def test_diff_compares_rank_with_rank_and_merged(rank_dir, capsys):
    status, out, err = cli(capsys, "diff", "t.json", "u.json")
    assert (status, err) == (0, "")
    assert out.startswith("== rank 0 ==\nBefore: t.rank0.json\nAfter:  u.rank0.json\n")
    assert "\n== rank 2 ==\n" in out
    merged = out.split("== all ranks (merged) ==\n", 1)[1]
    assert merged.startswith("Before: t.json (3 traces)\nAfter:  u.json (3 traces)\n")
    assert "DtoH item  /work/proj/train.py:50  31 -> 0" in merged
    assert "\nBefore (t.json): Rank 1 makes other sync copies than ranks 0, 2:\n" in out
    assert "After (u.json)" not in out  # the fixed run's ranks agree


def test_bad_rank_arguments_are_usage_errors(rank_dir, capsys):
    status, out, err = cli(capsys, "explain", "nope.rank*.json")
    assert status == 2 and err == ("memcpy-doctor: error: nope.rank*.json: no trace file "
                                   "matches\n")
    Path("t.rank3.json").write_text("{")
    status, out, err = cli(capsys, "explain", "t.json")
    assert status == 2 and err.startswith("memcpy-doctor: error: t.rank3.json: not valid JSON")
    assert len(err.splitlines()) == 1


def test_profile_refuses_ranks_under_a_launcher(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.py").write_text("open('ran', 'w').close()\n")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    status, out, err = cli(capsys, "profile", "--ranks", "2", "s.py")
    assert status == 2 and "already rank 0 of 2" in err
    monkeypatch.setenv("RANK", "7")
    status, out, err = cli(capsys, "profile", "s.py")
    assert status == 2 and "RANK=7, WORLD_SIZE=2" in err
    assert not Path("ran").exists()


# ---------------------------------------------------------------------------------------------
# End to end: gloo on CPU, two processes
# ---------------------------------------------------------------------------------------------

TRAIN = """
    import sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dev = sys.argv[1]  # "cuda" (the simulated GPU under --device sim) or "cpu"
    t = torch.full((4,), float(rank + 1), device=dev)
    h = t.cpu()  # gloo reduces host tensors
    dist.all_reduce(h)
    loss = (t * 2).sum()
    if rank == 1:
        print(f"rank 1 extra {loss.item()}", flush=True)
    print(f"rank {rank} sum {h.sum().item()}", flush=True)
    dist.destroy_process_group()
    if len(sys.argv) > 2 and rank == 1:
        sys.exit(int(sys.argv[2]))
"""

TIMEOUT = 120


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR",
                        "PYTHONUNBUFFERED")}  # buffered: one write per line, never torn
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT,
                          env=env)


def test_profile_ranks_gloo_simulated_gpu(tmp_path, capsys, monkeypatch):
    """Two ranks on the simulated GPU; rank 1 reads one more value back and exits 3."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN).lstrip())
    r = run([sys.executable, "-m", "memcpy_doctor", "profile", "--ranks", "2", "--device",
             "sim", "-o", "t.json", "train.py", "cuda", "3"], tmp_path)
    assert r.returncode == 3, r.stderr  # the worst rank's status
    for line in ("rank 0 sum 12.0", "rank 1 extra 16.0", "rank 1 sum 12.0"):
        assert line in r.stdout  # each print is one write; the ranks' may interleave
    assert not (tmp_path / "t.json").exists()
    traces = [load_trace(tmp_path / f"t.rank{k}.json") for k in (0, 1)]
    assert [(t.meta.rank, t.meta.world_size, t.meta.ended_by, t.meta.exit_status)
            for t in traces] == [(0, 2, "completed", 0), (1, 2, "exit", 3)]
    lines = script.read_text().splitlines()
    cpu_line = next(i for i, ln in enumerate(lines, 1) if "h = t.cpu()" in ln)
    item_line = next(i for i, ln in enumerate(lines, 1) if "loss.item()" in ln)
    assert [(c.trigger, c.site.line) for c in traces[0].copies if c.sync] == [("cpu",
                                                                              cpu_line)]
    assert sorted((c.trigger, c.site.line) for c in traces[1].copies if c.sync) == [
        ("cpu", cpu_line), ("item", item_line)]
    assert any(e.name == "c10d::allreduce_" for e in traces[0].events)
    # each rank's report once, labelled, then the ranks side by side
    assert r.stderr.count("Profiling Report") == 2
    assert r.stderr.index("Rank: 0 of 2") < r.stderr.index("Rank: 1 of 2")
    assert "Run cut short: exit (exit status 3)" in r.stderr
    assert "Rank 1 makes other sync copies than rank 0:" in r.stderr
    assert f"DtoH item  train.py:{item_line}  1        0" in r.stderr
    assert r.stderr.endswith("memcpy-doctor: traces written to t.rank0.json, t.rank1.json\n")
    monkeypatch.chdir(tmp_path)
    status, out, _ = cli(capsys, "check", "t.json", "--max", "sync_calls=1")
    assert status == 1 and "FAIL sync_calls = 2, max 1" in out


def test_torchrun_gloo_cpu_gives_one_trace_per_rank(tmp_path):
    """torchrun starts the tool on each rank; the script uses plain CPU tensors."""
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN).lstrip())
    from memcpy_doctor.run.launch import free_port
    r = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
             "--master-port", str(free_port()), "-m", "memcpy_doctor", "profile", "--device",
             "sim", "-o", "t.json", "train.py", "cpu"], tmp_path)
    assert r.returncode == 0, r.stderr
    # t.cpu() of a CPU tensor is t itself, so all_reduce changed t too (3 * 2 * 4 = 24)
    for line in ("rank 0 sum 12.0", "rank 1 extra 24.0", "rank 1 sum 12.0"):
        assert line in r.stdout  # each print is one write; the ranks' may interleave
    assert "Rank: 0 of 2" in r.stderr and "Rank: 1 of 2" in r.stderr
    assert "memcpy-doctor: trace written to t.rank1.json" in r.stderr
    traces = [load_trace(tmp_path / f"t.rank{k}.json") for k in (0, 1)]
    assert [(t.meta.rank, t.meta.world_size) for t in traces] == [(0, 2), (1, 2)]
    assert all(t.copies == [] for t in traces)  # nothing is copied between devices
    assert any(e.name == "c10d::allreduce_" for e in traces[1].events)
    assert compare_ranks(traces).uniform


def test_launch_stops_the_other_ranks_after_one_fails():
    """Rank 0 fails at once; rank 1 would sleep a minute: after the grace time it gets
    SIGTERM, is marked stopped, and the run's status is rank 0's."""
    from memcpy_doctor.run.launch import launch
    code = ("import os, sys, time\n"
            "rank = int(os.environ['RANK'])\n"
            "assert os.environ['WORLD_SIZE'] == '2' and os.environ['MASTER_ADDR']\n"
            "sys.exit(3) if rank == 0 else time.sleep(60)\n")
    exits, interrupted = launch([sys.executable, "-c", code], 2, grace_s=0.3)
    assert not interrupted
    assert exits == [RankExit(0, 3, None), RankExit(1, 143, 15, stopped=True)]
    assert worst_status(exits) == 3
