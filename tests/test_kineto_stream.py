"""A torch.profiler trace read as a stream (kineto/stream.py): the same trace as parsed whole
(top-level members before and after `traceEvents`, chunks cut anywhere, `.json.gz`, without
ijson's C backend, a file yajl refuses), and memory that stays flat as the trace grows (a
fresh process's peak resident memory, measured at two sizes)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memcpy_doctor.kineto import stream
from memcpy_doctor.kineto.et import EtNodes, parse_execution_trace
from memcpy_doctor.kineto.events import Events
from memcpy_doctor.kineto.reader import load_any, read_execution_trace, read_json
from test_kineto_et import et, et_v101

pytestmark = pytest.mark.skipif(not stream.streaming(), reason="ijson's C backend not installed")


def _x(cat: str, name: str, ts: float, dur: float, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def _trace(steps: int) -> dict:
    """`steps` steps of an upload, two ops with their kernels, flows, and an item()."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                           "args": {"name": "python"}}]
    corr = 0
    for s in range(steps):
        t = s * 100.0
        corr += 1
        events += [_x("cpu_op", "aten::to", t, 30, **{"Record function id": corr}),
                   _x("cuda_runtime", "cudaMemcpyAsync", t + 1, 20, correlation=corr),
                   {**_x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 2, 18,
                         correlation=corr, stream=7, bytes=1 << 20), "pid": 0, "tid": 7},
                   _x("cuda_runtime", "cudaStreamSynchronize", t + 22, 5)]
        for i in range(2):
            corr += 1
            events += [_x("python_function", "train.py(12): step", t + 30 + 20 * i, 15),
                       _x("cpu_op", f"aten::op{i} ü", t + 31 + 20 * i, 10, **{
                           "External id": corr, "Sequence number": s, "Ev Idx": corr,
                           "Input Dims": [[64, 256], [256], []], "Record function id": corr,
                           "Input type": ["float", "float", "Scalar"],
                           "Input Strides": [[256, 1], [1], []],
                           "Concrete Inputs": ["", "]}", "1"]}),
                       _x("cuda_runtime", "cudaLaunchKernel", t + 32 + 20 * i, 5,
                          correlation=corr),
                       {**_x("kernel", f"kernel_{i}", t + 38 + 20 * i, 9, correlation=corr,
                             stream=7, grid=[128, 1, 1], block=[256, 1, 1], device=0,
                             context=1, queued=0, **{"registers per thread": 32,
                                                     "shared memory": 0, "blocks per SM": 1.18,
                                                     "warps per SM": 9.48,
                                                     "est. achieved occupancy %": 15,
                                                     "External id": corr}),
                        "pid": 0, "tid": 7},
                       {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": t + 38 + 20 * i,
                        "cat": "ac2g", "name": "ac2g", "bp": "e"}]
        corr += 1
        events += [_x("cpu_op", "aten::item", t + 80, 15),
                   _x("cpu_op", "aten::_local_scalar_dense", t + 81, 13),
                   _x("cuda_runtime", "cudaMemcpyAsync", t + 82, 5, correlation=corr),
                   {**_x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 88, 2,
                         correlation=corr, stream=7, bytes=4), "pid": 0, "tid": 7},
                   _x("cuda_runtime", "cudaStreamSynchronize", t + 90, 4)]
    return {"schemaVersion": 1, "deviceProperties": [{"name": "A ]GPU[ }"}],
            "traceEvents": events, "traceName": "x],}", "INFO": [["a", "]"], {"b": "}"}],
            "distributedInfo": {"rank": 0, "world_size": 1}}


def _streamed(path: str) -> dict:
    """The trace at `path` through the stream only (read_json falls back to a whole parse)."""
    events = Events()
    data = stream._streamed(path, "traceEvents", events)
    data["traceEvents"] = events
    return data


def _fields(events: list) -> list[tuple]:
    return [tuple(getattr(e, f) for f in type(e).__slots__) for e in events]


def _same(a: dict, b: dict) -> None:
    assert {k: v for k, v in a.items() if k != "traceEvents"} == {
        k: v for k, v in b.items() if k != "traceEvents"}
    ea, eb = a["traceEvents"], b["traceEvents"]
    assert _fields(ea) == _fields(eb) and len(ea) > 0
    assert (ea.cats, ea.start, ea.end, ea.seen) == (eb.cats, eb.start, eb.end, eb.seen)


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 16])
def test_the_stream_reads_what_the_whole_parse_reads(tmp_path, monkeypatch, chunk):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(_trace(5), ensure_ascii=False), encoding="utf-8")
    whole = stream._whole(str(path), "a trace")
    monkeypatch.setattr(stream, "CHUNK_BYTES", chunk)
    _same(_streamed(str(path)), whole)


def test_members_after_the_events_end_with_brackets_in_strings(tmp_path):
    data = _trace(2)
    data["traceEvents"].append({"ph": "i", "name": "x", "ts": 1, "pid": 1, "tid": 1,
                                "args": {"note": "]"}})
    path = tmp_path / "k.json"
    path.write_text(json.dumps(data, indent=1))
    got = _streamed(str(path))
    assert got["INFO"] == [["a", "]"], {"b": "}"}] and got["traceName"] == "x],}"
    assert got["deviceProperties"] == [{"name": "A ]GPU[ }"}]


def test_a_gz_trace_streams(tmp_path):
    plain, packed = tmp_path / "k.json", tmp_path / "k.json.gz"
    plain.write_text(json.dumps(_trace(40)))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    _same(_streamed(str(packed)), stream._whole(str(plain), "a trace"))


def test_without_the_c_backend_the_trace_is_the_same(tmp_path, monkeypatch):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(_trace(20)))
    streamed = load_any(str(path)).to_dict()
    monkeypatch.setattr(stream, "_IJSON", None)
    assert load_any(str(path)).to_dict() == streamed


def test_a_file_yajl_refuses_is_parsed_whole(tmp_path):
    data = _trace(3)
    data["traceEvents"][1]["args"]["occupancy"] = float("nan")  # json writes NaN
    path = tmp_path / "k.json"
    path.write_text(json.dumps(data))
    assert len(read_json(str(path))["traceEvents"]) == len(
        stream._whole(str(path), "a trace")["traceEvents"])


_GROWTH = """
import sys
from memcpy_doctor.kineto.reader import load_any

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))

before = status("VmRSS:")
trace = load_any(sys.argv[1])
assert trace.copies
print(status("VmHWM:") - before)
"""


def _growth_kib(path: Path) -> int:
    """How far a fresh process's resident memory rose (its peak, KiB) while reading `path`."""
    done = subprocess.run([sys.executable, "-c", _GROWTH, str(path)], capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_memory_stays_flat_as_the_trace_grows(tmp_path):
    """Reading 20 times the events raises the peak by less than 6 MiB: the events are rows
    of a database in a bounded page cache, not records (330 bytes an event: 35 MiB more
    here) nor dicts (about 1 KB an event)."""
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    small.write_text(json.dumps(_trace(300)))
    large.write_text(json.dumps(_trace(6000)))
    more = len(_trace(6000)["traceEvents"]) - len(_trace(300)["traceEvents"])
    assert more > 100_000
    grew = _growth_kib(large) - _growth_kib(small)
    assert grew < 6 * 1024, f"{grew} KiB more for {more} more events"


def _et_fields(t) -> tuple:
    """The ET's nodes, and for each node and each storage it has, its producer and
    consumer as the join asks for them."""
    nodes = list(t.nodes.values())
    fields = [(n.id, n.name, n.parent, n.rf, n.is_op, n.ins, n.outs) for n in nodes]
    flows = [(n.id, s, getattr(t.producer(n, s), "id", None),
              getattr(t.consumer(n, s), "id", None))
             for n in nodes for _, s, _ in (*n.ins, *n.outs)]
    assert any(p is not None for _, _, p, _ in flows)
    return (t.schema, t.pid, fields, flows)


@pytest.mark.parametrize("layout", [et, et_v101])
@pytest.mark.parametrize("chunk", [3, 1 << 16])
def test_an_execution_trace_streams_to_what_the_whole_parse_reads(tmp_path, monkeypatch,
                                                                  layout, chunk):
    """The ET's nodes, its schema and pid around them (before and after the array), and the
    writes and reads of each storage, read as a stream in chunks cut anywhere."""
    data = layout()
    data["finish_ts"] = 9  # a member after the nodes
    path = tmp_path / "et.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    monkeypatch.setattr(stream, "CHUNK_BYTES", chunk)
    nodes = EtNodes()
    assert stream.read_array(str(path), "nodes", nodes) is not None  # it did stream
    assert nodes.seen == len(data["nodes"])
    streamed = read_execution_trace(str(path))
    assert _et_fields(streamed) == _et_fields(parse_execution_trace(data, "et.json"))
    assert streamed.schema == data["schema"] and streamed.pid == 1


def test_an_execution_trace_yajl_refuses_is_parsed_whole(tmp_path):
    data = et()
    data["nodes"][0]["weight"] = float("nan")  # json writes NaN
    path = tmp_path / "et.json"
    path.write_text(json.dumps(data))
    assert stream.read_array(str(path), "nodes", EtNodes()) is None
    assert _et_fields(read_execution_trace(str(path))) == _et_fields(
        parse_execution_trace(json.loads(path.read_text()), "et.json"))

