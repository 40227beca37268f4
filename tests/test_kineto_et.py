"""Exact producers and consumers from an execution trace (kineto/et.py): a hand-written
torch.profiler trace of a GPU run and its ExecutionTraceObserver file, in both ET layouts,
where the kernel that ran last on the stream is not the op that made the copied tensor, so the
figures prove the ET is read; a real ET recorded here on the CPU for the record-function-id
join and the tensor layout of this PyTorch; the CLI as a user runs it; and the files it refuses
(one line, status 2)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli_in_process
from memcpy_doctor.kineto.reader import (INFERRED_NOTE, from_kineto, kineto_pid, load_any,
                                       read_execution_trace)
from memcpy_doctor.kineto.et import EtJoin, parse_execution_trace
from memcpy_doctor.kineto.events import as_events
from memcpy_doctor.kineto.stacks import enclosing
from memcpy_doctor.core.trace import OpRef, Site, TraceError

MODULE, STEP = Site("train.py", 1, "<module>"), Site("train.py", 10, "step")
THREAD = "[pytorch|profiler|execution_trace|thread]"


def _op(name: str, ts: float, dur: float, rf: int) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"External id": rf, "Record function id": rf}}


def _rt(name: str, ts: float, dur: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": {"correlation": corr}}


def _dev(cat: str, name: str, ts: float, dur: float, corr: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7, **args}}


def _py(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": {}}


def kineto() -> dict:
    """train.py: x = torch.randn(64, 64); xd = x.to("cuda") (pageable, waited for);
    b = torch.ones(4, device="cuda"); then step(): s = xd.sum(); m = xd.mul(2); s.item();
    back at module level: h = m.to("cpu"); h + 1. Times in us, stream 7."""
    return {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}],
            "traceEvents": [
                _py("train.py(1): <module>", 0, 700), _py("train.py(10): step", 150, 330),
                _op("aten::randn", 0, 10, 1), _op("aten::empty", 1, 2, 2),
                _op("aten::normal_", 4, 5, 3),
                _op("aten::to", 20, 40, 4), _op("aten::_to_copy", 22, 36, 5),
                _op("aten::empty_strided", 24, 2, 6), _op("aten::copy_", 28, 30, 7),
                _rt("cudaMemcpyAsync", 30, 10, 1),
                _dev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 35, 5, 1, bytes=16384),
                _rt("cudaStreamSynchronize", 42, 10, 2),
                _op("aten::ones", 100, 20, 8), _op("aten::fill_", 105, 10, 9),
                _rt("cudaLaunchKernel", 106, 5, 3), _dev("kernel", "fill_kernel", 112, 2, 3),
                _op("aten::sum", 200, 20, 10), _rt("cudaLaunchKernel", 205, 5, 4),
                _dev("kernel", "reduce_kernel", 215, 10, 4),
                _op("aten::mul", 300, 20, 11), _rt("cudaLaunchKernel", 305, 5, 5),
                _dev("kernel", "mul_kernel", 310, 10, 5),
                _op("aten::item", 400, 60, 12), _op("aten::_local_scalar_dense", 402, 56, 13),
                _rt("cudaMemcpyAsync", 405, 5, 6),
                _dev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 411, 2, 6, bytes=4),
                _rt("cudaStreamSynchronize", 412, 8, 7),
                _op("aten::to", 500, 40, 14), _op("aten::_to_copy", 502, 36, 15),
                _op("aten::empty_strided", 504, 2, 16), _op("aten::copy_", 508, 30, 17),
                _rt("cudaMemcpyAsync", 510, 5, 8),
                _dev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 516, 4, 8, bytes=16384),
                _rt("cudaStreamSynchronize", 521, 10, 9),
                _op("aten::add", 600, 10, 18)]}


def _t(tensor: int, storage: int, device: str = "cuda:0") -> list:
    """An ET tensor: [tensor id, storage id, offset, numel, itemsize, device]."""
    return [tensor, storage, 0, 4096, 4, device]


X, XD, B = _t(101, 201, "cpu"), _t(102, 202), _t(103, 203)
S, M, H, R = _t(104, 204), _t(105, 205), _t(106, 206, "cpu"), _t(107, 207, "cpu")
#: (id, name, parent, rf_id, inputs, outputs, mutates): ids in the order the ops started
NODES = [
    (10, "aten::randn", 2, 1, [], [X], False), (11, "aten::empty", 10, 2, [], [X], False),
    (12, "aten::normal_", 10, 3, [X], [X], True),
    (20, "aten::to", 2, 4, [X], [XD], False), (21, "aten::_to_copy", 20, 5, [X], [XD], False),
    (22, "aten::empty_strided", 21, 6, [], [XD], False),
    (23, "aten::copy_", 21, 7, [XD, X], [XD], True),
    (30, "aten::ones", 2, 8, [], [B], False), (31, "aten::fill_", 30, 9, [B], [B], True),
    (40, "aten::sum", 2, 10, [XD], [S], False), (50, "aten::mul", 2, 11, [XD], [M], False),
    (60, "aten::item", 2, 12, [S], [0.5], False),
    (61, "aten::_local_scalar_dense", 60, 13, [S], [0.5], False),
    (70, "aten::to", 2, 14, [M], [H], False), (71, "aten::_to_copy", 70, 15, [M], [H], False),
    (72, "aten::empty_strided", 71, 16, [], [H], False),
    (73, "aten::copy_", 71, 17, [H, M], [H], True),
    (80, "aten::add", 2, 18, [H, 1], [R], False)]


def _types(values: list) -> list[str]:
    return ["Tensor(float)" if isinstance(v, list) else "Double" if isinstance(v, float)
            else "Int" for v in values]


def _schema(name: str, mutates: bool) -> str:
    return f"{name}(Tensor{'(a!)' if mutates else ''} self) -> Tensor"


def et(nodes: list = NODES, pid: int = 1) -> dict:
    """The ExecutionTraceObserver file of the same run, schema 1.1.1-chakra.0.0.4, written in
    the order the ops ended (as the observer writes them)."""
    def node(id, name, parent, rf, ins, outs, mutates):
        attrs = {"rf_id": rf, "fw_parent": 0, "seq_id": -1, "scope": 0, "tid": 1, "fw_tid": 0,
                 "op_schema": _schema(name, mutates) if rf else "", "kernel_backend": "",
                 "kernel_file": ""}
        return {"id": id, "name": name, "ctrl_deps": parent,
                "inputs": {"values": ins, "shapes": [[]] * len(ins), "types": _types(ins),
                           "strides": [[]] * len(ins)},
                "outputs": {"values": outs, "shapes": [[]] * len(outs), "types": _types(outs),
                            "strides": [[]] * len(outs)},
                "attrs": [{"name": k, "type": "uint64", "value": v} for k, v in attrs.items()]}
    ended = sorted(nodes, key=lambda n: -n[0] if n[2] != 2 else n[0])  # children first
    return {"schema": "1.1.1-chakra.0.0.4", "pid": pid, "time": "2025-01-01 00:00:00",
            "start_ts": 0, "nodes": [node(2, THREAD, 1, 0, [], [], False)]
            + [node(*n) for n in ended] + [node(1, THREAD.replace("thread", "process"), 1,
                                                0, [], [], False)], "finish_ts": 1}


def et_v101(nodes: list = NODES) -> dict:
    """The same run in the older layout (schema 1.0.1: `parent`, flat fields)."""
    return {"schema": "1.0.1", "pid": 1, "nodes": [
        {"name": name, "id": id, "rf_id": rf, "parent": parent, "fw_parent": 0, "seq_id": -1,
         "scope": 0, "tid": 1, "fw_tid": 0, "op_schema": _schema(name, mutates),
         "inputs": ins, "input_shapes": [[]] * len(ins), "input_types": _types(ins),
         "outputs": outs, "output_shapes": [[]] * len(outs), "output_types": _types(outs)}
        for id, name, parent, rf, ins, outs, mutates in nodes]}


def _ends(trace) -> dict:
    return {(c.direction, c.trigger): (c.producer, c.consumer) for c in trace.copies}


def test_without_the_et_producers_are_the_last_kernel_on_the_stream():
    t = from_kineto(kineto(), "k.json")
    assert _ends(t) == {
        ("HtoD", "to"): (None, None),  # (issue 43: the next kernel, fill_, is no reader)
        ("DtoH", "item"): (OpRef("aten::mul (inferred)", "cuda", STEP), None),
        ("DtoH", "to"): (OpRef("aten::mul (inferred)", "cuda", STEP), None)}
    assert t.meta.untraced[0] == INFERRED_NOTE


@pytest.mark.parametrize("layout", [et, et_v101])
def test_with_the_et_producers_and_consumers_follow_the_tensors(layout):
    t = from_kineto(kineto(), "k.json", parse_execution_trace(layout(), "et.json"))
    assert _ends(t) == {
        # made by randn on the host; first read by sum (not fill_, whose kernel ran next)
        ("HtoD", "to"): (OpRef("aten::randn", "cpu", MODULE),
                         OpRef("aten::sum", "cuda", STEP)),
        # item() reads what sum made, although mul's kernel ran last before it
        ("DtoH", "item"): (OpRef("aten::sum", "cuda", STEP), None),
        ("DtoH", "to"): (OpRef("aten::mul", "cuda", STEP), OpRef("aten::add", "cpu", MODULE))}
    assert t.meta.untraced[0] == (
        "producers of 3 of 3 copies read from the execution trace et.json by tensor ids; "
        "consumers read from it where it shows an op reading the copy, else inferred (the op "
        "around the trigger; none for an upload)")
    assert [c.calls for c in t.copies] == [1, 1, 1]  # the copies themselves do not change
    assert t.summary.memcpy_sync.calls == 3


def test_copies_outside_the_et_keep_their_inferred_producers_and_say_how_many():
    partial = [n for n in NODES if n[0] < 70 or n[0] == 80]  # the ET stopped before m.to()
    t = from_kineto(kineto(), "k.json", parse_execution_trace(et(partial), "et.json"))
    ends = _ends(t)
    assert ends[("DtoH", "item")] == (OpRef("aten::sum", "cuda", STEP), None)
    assert ends[("DtoH", "to")] == (OpRef("aten::mul (inferred)", "cuda", STEP), None)
    assert t.meta.untraced[0].startswith(
        "producers of 2 of 3 copies read from the execution trace et.json by tensor ids; 1 "
        "are not in it; those keep inferred producers (the kernel that ran before the copy on "
        "its stream; none for an upload); ")


def test_a_view_of_the_written_tensor_meets_its_writer_and_a_view_op_is_not_one():
    # s.view(1)[0].item(): the viewed tensor has another id but sum's storage
    view = _t(108, 204)
    nodes = [n for n in NODES if n[0] not in (60, 61)] + [
        (55, "aten::view", 2, 19, [S], [view], False),
        (60, "aten::item", 2, 12, [view], [0.5], False),
        (61, "aten::_local_scalar_dense", 60, 13, [view], [0.5], False)]
    t = from_kineto(kineto(), "k.json", parse_execution_trace(et(nodes), "et.json"))
    assert _ends(t)[("DtoH", "item")] == (OpRef("aten::sum", "cuda", STEP), None)


def _record_on_cpu(tmp_path: Path) -> tuple[dict, dict]:
    """A real ET and torch.profiler trace of one run, recorded here (CPU ops only)."""
    import torch
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile
    observer = ExecutionTraceObserver().register_callback(str(tmp_path / "et.json"))
    x = torch.randn(8, 8)
    try:
        with profile(activities=[ProfilerActivity.CPU],
                     execution_trace_observer=observer) as prof:
            y = x @ x
            s = y.sum()
            m = y * 2
            s.item()
            z = m.to(torch.float64)
            z + 1
    finally:
        observer.unregister_callback()
    prof.export_chrome_trace(str(tmp_path / "kineto.json"))
    return (json.loads((tmp_path / "et.json").read_text()),
            json.loads((tmp_path / "kineto.json").read_text()))


def test_a_real_et_joins_its_profile_by_record_function_id(tmp_path):
    raw, kin = _record_on_cpu(tmp_path)
    real = read_execution_trace(str(tmp_path / "et.json"))
    assert real.schema == raw["schema"] and real.pid == kineto_pid(kin)
    tensors = [v for n in raw["nodes"] for side in ("inputs", "outputs")
               for v, k in zip(n[side]["values"], n[side]["types"]) if k.startswith("Tensor")]
    assert tensors and all(len(v) == 6 and all(type(i) is int for i in v[:5])
                           and v[5] == "cpu" for v in tensors)
    ops = [e for e in kin["traceEvents"] if e.get("cat") == "cpu_op"]
    assert ops and all(real.by_rf[e["args"]["Record function id"]].name == e["name"]
                       for e in ops)
    # the ops the program called (mul and add also call aten::to, on their scalar)
    top = {n.name: n for n in real.nodes.values() if n.parent in real.nodes
           and real.nodes[n.parent].name == THREAD}
    assert list(top) == ["aten::matmul", "aten::sum", "aten::mul", "aten::item", "aten::to",
                         "aten::add"]
    scalar, = [n for n in real.nodes.values() if n.name == "aten::_local_scalar_dense"]
    assert real.producer(scalar, scalar.ins[0][1]).name == "aten::sum"
    to = top["aten::to"]
    copy, = [n for n in real.nodes.values() if n.name == "aten::copy_"
             and to in real.ancestors(n)]
    assert real.producer(copy, copy.ins[1][1]).name == "aten::mul"
    assert real.producer(to, to.ins[0][1]).name == "aten::mul"
    assert real.consumer(to, to.outs[0][1]).name == "aten::add"
    # through the Kineto side: item()'s ops, found by their record function ids
    events = as_events(e for e in kin["traceEvents"] if "ts" in e)
    found = enclosing(events)
    join = EtJoin(real, events, found, "kineto.json")
    item = [e for e in ops if e["name"] in ("aten::item", "aten::_local_scalar_dense")]
    producer, _ = join.ends(item, 0, "HtoD")  # on the CPU, the source is on the host
    assert producer == OpRef("aten::sum", "cpu", None)


def run(*args: str) -> tuple[int, str, str]:
    """memcpy-doctor ARGS in this process: its status, stdout and stderr."""
    r = cli_in_process(*args)
    return r.status, r.out, r.err


def _write(path: Path, data: object) -> str:
    text = json.dumps(data)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return str(path)


def test_import_and_explain_with_the_et_as_a_user_runs_them(tmp_path):
    _write(tmp_path / "k.pt.trace.json.gz", kineto())
    _write(tmp_path / "rank0.et.json", et())
    cmd = [sys.executable, "-m", "memcpy_doctor"]
    r = subprocess.run([*cmd, "import", "k.pt.trace.json.gz", "--execution-trace",
                        "rank0.et.json", "-o", "t.json"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ("memcpy-doctor: 3 copies (3 waited for) from NVIDIA A100-SXM4-80GB, "
                        "written to t.json\n")
    r = subprocess.run([*cmd, "report", "t.json"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line.split(None, 7) for line in r.stdout.splitlines()
            if line.startswith(("HtoD to ", "DtoH "))]  # (ranked by the GPU idle after each)
    assert sorted(row[7] for row in rows) == [
        "aten::mul [cuda] at train.py:10 -> aten::add [cpu] at train.py:1",
        "aten::randn [cpu] at train.py:1 -> aten::sum [cuda] at train.py:10",
        "aten::sum [cuda] at train.py:10 -> -"]
    # the exact data flow (randn -> upload -> sum -> item) is what explain now acts on
    r = subprocess.run([*cmd, "explain", "k.pt.trace.json.gz", "--execution-trace",
                        "rank0.et.json"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert ('1. run aten::sum on the host with device_guard("cpu") at train.py:10'
            in r.stdout.splitlines())


def test_several_traces_take_the_et_of_their_own_process(tmp_path):
    for rank, pid in ((0, 1), (1, 2)):
        data = kineto()
        for e in data["traceEvents"]:
            e["pid"] = pid if e["pid"] == 1 else e["pid"]
        data["distributedInfo"] = {"rank": rank, "world_size": 2}
        _write(tmp_path / f"k{rank}.json", data)
    other = [n for n in NODES if n[0] != 50] + [(50, "aten::mul", 2, 11, [XD], [S], False)]
    _write(tmp_path / "et1.json", et(other, pid=2))  # rank 1: item() reads what mul made
    _write(tmp_path / "et0.json", et(pid=1))
    status, _, err = run("import", str(tmp_path / "k0.json"), str(tmp_path / "k1.json"),
                         "--execution-trace", str(tmp_path / "et1.json"),
                         "--execution-trace", str(tmp_path / "et0.json"),
                         "-o", str(tmp_path / "run.json"))
    assert status == 0, err
    for rank, made in ((0, "aten::sum"), (1, "aten::mul")):
        t = load_any(str(tmp_path / f"run.rank{rank}.json"))
        assert _ends(t)[("DtoH", "item")][0].op == made


def _no_ids(data: dict) -> dict:
    for n in data["nodes"]:
        for side in ("inputs", "outputs"):
            n[side]["values"] = [v[0] if isinstance(v, list) else v
                                 for v in n[side]["values"]]
    return data


def _shifted(data: dict, by: int) -> dict:
    for n in data["nodes"]:
        for a in n["attrs"]:
            if a["name"] == "rf_id" and a["value"]:
                a["value"] += by
    return data


def _no_rf(data: dict) -> dict:
    for e in data["traceEvents"]:
        if e["cat"] == "cpu_op":
            e["args"]["Record function id"] = 0
    return data


#: name -> (ET content, Kineto trace, what the one line says)
BAD = {
    "another_run": (_shifted(et(), 1000), kineto(), "et.json: not of the same run as k.json"),
    "ops_differ": (_shifted(et(), 1), kineto(), "et.json: not of the same run as k.json"),
    "truncated": (json.dumps(et())[:900], kineto(), "et.json: not an execution trace (not "
                  "valid JSON"),
    "no_tensor_ids": (_no_ids(et()), kineto(), "without tensor ids (its tensors are not "
                      "[tensor_id, storage_id, offset, numel, itemsize, device])"),
    "not_an_et": (kineto(), kineto(), "et.json: not an execution trace (no `nodes` list"),
    "bad_node": ({"schema": "9", "nodes": [{"id": 3}]}, kineto(),
                 "et.json: an execution trace (schema 9) this version cannot read (KeyError"),
    "no_rf_ids": (et(), _no_rf(kineto()), "k.json: its ops carry no record function ids"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_an_et_that_cannot_be_joined_is_one_line_and_status_2(tmp_path, monkeypatch, name):
    content, kin, message = BAD[name]
    monkeypatch.chdir(tmp_path)
    Path("et.json").write_text(content if isinstance(content, str) else json.dumps(content))
    _write(Path("k.json"), kin)
    for cmd in (("report",), ("explain",), ("check", "--max", "sync_calls=9"),
                ("import", "-o", "t.json")):
        status, out, err = run(*cmd, "k.json", "--execution-trace", "et.json")
        assert (status, out, len(err.splitlines())) == (2, "", 1), err
        assert err.startswith("memcpy-doctor: error: ") and message in err, err


def test_one_et_per_kineto_trace(tmp_path):
    _write(tmp_path / "k.json", kineto())
    _write(tmp_path / "et.json", et())
    ours = from_kineto(kineto(), "k.json")
    ours.save(str(tmp_path / "ours.json"))
    for args, message in (
            (("k.json", "--execution-trace", "et.json", "--execution-trace", "et.json"),
             "--execution-trace: 2 given for 1 torch.profiler traces; give one per"),
            (("ours.json", "--execution-trace", "et.json"),
             "--execution-trace: 1 given for no torch.profiler trace")):
        status, _, err = run("report", *[str(tmp_path / a) if a.endswith(".json") else a
                                         for a in args])
        assert status == 2 and message in err and len(err.splitlines()) == 1, err
    status, out, err = run("diff", str(tmp_path / "ours.json"), str(tmp_path / "k.json"),
                           "--execution-trace", str(tmp_path / "et.json"))
    assert status == 0, err
    with pytest.raises(TraceError, match="an execution trace goes with a torch.profiler"):
        load_any(str(tmp_path / "ours.json"), parse_execution_trace(et(), "et.json"))
