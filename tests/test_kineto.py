"""torch.profiler (Kineto) traces read as memcpy-doctor traces (kineto/reader.py): exact figures
from a small hand-written trace in Kineto's format, the CLI on it (by content, .json or
.json.gz), and, where ../shared/kineto is present, the real A100 traces' own copy counts."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli_in_process
from memcpy_doctor.kineto.reader import from_kineto, load_any
from memcpy_doctor.core.trace import TraceError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "kineto"


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _gpu(cat: str, name: str, ts: float, dur: float, corr: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, **args}}


def kineto_trace(sync: bool = True) -> dict:
    """x.to("cuda") from pageable memory, waited for; loss.item(); a matmul; a
    torch.cuda.synchronize(); a pinned non_blocking copy. Times in us."""
    events = [
        _x("cpu_op", "aten::to", 0, 100), _x("cpu_op", "aten::copy_", 10, 80),
        _x("cuda_runtime", "cudaMemcpyAsync", 20, 10, correlation=1),
        _gpu("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 25, 5, 1, bytes=4096),
        _x("cpu_op", "aten::item", 200, 60), _x("cpu_op", "aten::_local_scalar_dense", 205, 50),
        _x("cuda_runtime", "cudaMemcpyAsync", 210, 10, correlation=3),
        _gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 215, 2, 3, bytes=4),
        _x("cpu_op", "aten::mm", 300, 20), _x("cuda_runtime", "cudaLaunchKernel", 305, 5,
                                                 correlation=5),
        _gpu("kernel", "gemm", 310, 50, 5),
        _x("cuda_runtime", "cudaDeviceSynchronize", 400, 50, correlation=6),
        _x("cpu_op", "aten::copy_", 500, 20),
        _x("cuda_runtime", "cudaMemcpyAsync", 505, 5, correlation=7),
        _gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 506, 3, 7, bytes=1024),
    ]
    if sync:  # PyTorch's memcpy_and_sync: a stream sync inside the same op
        events += [_x("cuda_runtime", "cudaStreamSynchronize", 32, 8, correlation=2),
                   _x("cuda_runtime", "cudaStreamSynchronize", 222, 8, correlation=4)]
    return {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}],
            "traceEvents": events}


def test_copies_waits_and_events_map_exactly():
    t = from_kineto(kineto_trace(), "k.json")
    assert t.meta.device_name == "NVIDIA A100-SXM4-80GB" and not t.meta.simulated
    assert t.meta.imported_from == "k.json" and t.meta.rank is None
    assert sorted((c.direction, c.sync, c.pinned, c.trigger, c.calls, c.bytes, c.host_ns,
                   c.device_ns) for c in t.copies) == [
        ("DtoH", True, False, "item", 1, 4, 18_000, 2_000),      # the call and its wait
        ("HtoD", False, True, "copy_", 1, 1024, 5_000, 3_000),   # pinned, not waited for
        ("HtoD", True, False, "to", 1, 4096, 18_000, 5_000)]
    assert [(w.kind, w.calls, w.wait_ns) for w in t.waits] == [("synchronize", 1, 50_000)]
    rows = {e.name: (e.calls, e.cpu_ns, e.gpu_ns) for e in t.events}
    assert rows["aten::mm"] == (1, 20_000, 50_000)  # its kernel, by correlation
    assert rows["GpuMemcpySync:CPU->GPU"] == (1, 18_000, 5_000)
    assert rows["HostWait:synchronize"] == (1, 50_000, 0)
    assert t.summary.total_ns == 520_000  # first event to last end
    assert (t.summary.memcpy_sync.calls, t.summary.memcpy_async.calls) == (2, 1)


def test_a_trace_without_stream_syncs_counts_scalar_reads_and_pageable_copies_as_waited_for():
    """Without stream syncs to pair: a scalar read waited; so did a copy from pageable memory
    (cudaMemcpyAsync returns once the driver has staged it: issue 43); the pinned one not."""
    t = from_kineto(kineto_trace(sync=False), "k.json")
    assert sorted((c.trigger, c.sync, c.pinned) for c in t.copies) == [
        ("copy_", False, True), ("item", True, False), ("to", True, False)]
    assert [u for u in t.meta.untraced if "no stream syncs" in u] == [
        "the trace holds no stream syncs, though PyTorch makes one after each of its 1 scalar "
        "reads (aten::_local_scalar_dense): its runtime calls were filtered or sampled; those "
        "reads count as waited for, their wait untimed, and other waits are not seen"]


def test_a_complete_trace_without_syncs_is_not_called_sampled():
    """(issue 43) Five steps of pinned non_blocking uploads and a kernel, nothing waited for:
    no stream sync because the program made none, not because the trace lost them."""
    events = []
    for step in range(5):
        t0, corr = step * 100, step * 2 + 1
        events += [_x("cpu_op", "aten::copy_", t0, 20),
                   _x("cuda_runtime", "cudaMemcpyAsync", t0 + 5, 5, correlation=corr),
                   _gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", t0 + 6, 3, corr,
                        bytes=1024),
                   _x("cpu_op", "aten::mm", t0 + 30, 20),
                   _x("cuda_runtime", "cudaLaunchKernel", t0 + 35, 5, correlation=corr + 1),
                   _gpu("kernel", "gemm", t0 + 40, 50, corr + 1)]
    t = from_kineto({"schemaVersion": 1, "traceEvents": events}, "k.json")
    assert (t.summary.memcpy_async.calls, t.summary.memcpy_sync.calls) == (5, 0)
    assert not [u for u in t.meta.untraced if "sync" in u]


def test_the_events_order_in_the_file_does_not_change_the_trace():
    """torch.profiler writes the cpu_ops before the runtime calls they enclose; other tools
    write them in time order, or in none: the reader sorts what it joins."""
    data = kineto_trace()
    want = from_kineto(data, "k.json").to_dict()
    for seed in range(5):
        events = list(data["traceEvents"])
        random.Random(seed).shuffle(events)
        got = from_kineto({**data, "traceEvents": events}, "k.json").to_dict()
        for key in ("copies", "events", "waits"):
            got[key].sort(key=repr)
            want[key].sort(key=repr)
        assert got == want


def test_ops_deeper_than_three_around_a_copy_come_outermost_first():
    """The trigger is the outermost op that names one (item() around to() here), whatever
    the depth; the op around it is the consumer."""
    depth = ["aten::index", "aten::item", "aten::_local_scalar_dense", "aten::to",
             "aten::_to_copy", "aten::copy_"]
    events = [_x("cpu_op", name, 10 * i, 200 - 20 * i) for i, name in enumerate(depth)]
    events += [_x("cuda_runtime", "cudaMemcpyAsync", 60, 10, correlation=1),
               _gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 62, 2, 1, bytes=4),
               _x("cuda_runtime", "cudaStreamSynchronize", 72, 8)]
    t = from_kineto({"traceEvents": events}, "k.json")
    copy, = t.copies
    assert (copy.trigger, copy.sync, copy.host_ns) == ("item", True, 18_000)
    assert copy.consumer.op == "aten::index (inferred)"


def test_a_cpu_only_trace_is_one_clear_error():
    data = {"traceEvents": [_x("cpu_op", "aten::add", 0, 5)]}
    with pytest.raises(TraceError, match="no CUDA activity"):
        from_kineto(data, "cpu.json")


def _cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memcpy_doctor", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _in_process(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    """The same through the console script's entry point, in this process."""
    r = cli_in_process(*args, cwd=cwd)
    return subprocess.CompletedProcess(list(args), r.status, r.out, r.err)


def test_report_and_check_read_a_kineto_trace_by_its_content(tmp_path):
    """report and check each once as a user runs them (a subprocess), the other cases through
    main() in this process."""
    (tmp_path / "plain.json").write_text(json.dumps(kineto_trace()))
    (tmp_path / "trace.pt.trace.json.gz").write_bytes(gzip.compress(
        json.dumps(kineto_trace()).encode()))
    for name, run in (("plain.json", _cli), ("trace.pt.trace.json.gz", _in_process)):
        assert load_any(str(tmp_path / name)).summary.memcpy_sync.calls == 2
        r = run("report", name, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert ("Place: CUDA:0 (measured on NVIDIA A100-SXM4-80GB; imported from "
                "torch.profiler)") in r.stdout
        assert "  GpuMemcpySync          Calls: 2 " in r.stdout
    assert _cli("check", "--max", "sync_calls=0", "plain.json", cwd=tmp_path).returncode == 1
    assert _in_process("check", "--max", "sync_calls=2", "plain.json",
                       cwd=tmp_path).returncode == 0
    (tmp_path / "cpu.json").write_text(json.dumps({"traceEvents": [_x("cpu_op", "a", 0, 1)]}))
    r = _in_process("report", "cpu.json", cwd=tmp_path)
    assert r.returncode == 2 and "no CUDA activity" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kineto is not here")
@pytest.mark.parametrize("name", ["a100_alexnet", "a100_event_sync", "sampled_rank0"])
def test_the_real_traces_copies_are_their_own_memcpy_events(name):
    path = SHARED / f"{name}.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    memcpy = [e for e in events if isinstance(e, dict) and e.get("cat") == "gpu_memcpy"]
    t = load_any(os.fspath(path))
    for d in ("HtoD", "DtoH", "DtoD"):
        mine = [c for c in t.copies if c.direction == d]
        theirs = [e for e in memcpy if f" {d} " in e["name"]]
        assert sum(c.calls for c in mine) == len(theirs)
        assert sum(c.bytes for c in mine) == sum(e["args"]["bytes"] for e in theirs)
    syncs = sum(1 for e in events if isinstance(e, dict) and e.get("cat") == "cuda_runtime"
                and e.get("name") == "cudaStreamSynchronize")
    if name == "a100_alexnet":  # 16 pageable uploads, each followed by its stream sync
        assert t.summary.memcpy_sync.calls == 16 and syncs >= 16
    # (issue 43) a copy into or from pageable memory made the host wait, whatever call made
    # it: none is async
    pageable = [c for c in t.copies if c.pinned is False]
    assert pageable and all(c.sync for c in pageable)
    # each HostWait row has the shortest and longest of its calls, as the raw events do
    for kind, api in (("synchronize", "cudaDeviceSynchronize"),
                      ("event_synchronize", "cudaEventSynchronize")):
        [row] = [e for e in t.events if e.name == f"HostWait:{kind}"] or [None]
        if row is None:
            continue
        durations = [round(e["dur"] * 1000) for e in events if isinstance(e, dict)
                     and e.get("cat") == "cuda_runtime" and e.get("name") == api]
        assert (row.min_ns, row.max_ns) == (min(durations), max(durations)), kind


def test_import_writes_one_trace_per_rank(tmp_path):
    for rank in (0, 1):
        data = {**kineto_trace(), "distributedInfo": {"rank": rank, "world_size": 2}}
        (tmp_path / f"r{rank}.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
    r = _cli("import", "r0.json.gz", "r1.json.gz", "-o", "run.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == ("memcpy-doctor: 3 copies (2 waited for) from NVIDIA "
                                        "A100-SXM4-80GB, written to run.rank0.json")
    saved = load_any(str(tmp_path / "run.rank1.json"))
    assert (saved.meta.rank, saved.meta.world_size) == (1, 2)
    assert saved.meta.imported_from == "r1.json.gz"
    r = _in_process("import", "run.rank0.json", cwd=tmp_path)  # ours: nothing to import
    assert r.returncode == 2 and "give torch.profiler traces" in r.stderr


def test_an_imported_report_shows_no_time_split_it_did_not_measure(tmp_path):
    """(issue 43) torch.profiler does not split the run into computation and framework
    overhead: the report of an imported trace gives its span alone."""
    (tmp_path / "k.json").write_text(json.dumps(kineto_trace()))
    r = _in_process("report", "k.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ("Total time: 0.52 (the trace's span, first event to last; torch.profiler does not "
            "split it into computation and framework overhead)") in r.stdout.splitlines()
    assert "Computation time" not in r.stdout and "Framework overhead" not in r.stdout


def test_no_consumer_is_guessed_for_an_upload_and_no_kernel_name_is_an_op():
    """(issue 43) The next kernel on an upload's stream need not read it (a100_alexnet's
    parameter uploads were "read by aten::uniform_"); a kernel that no op launched, and a
    copy with no CPU launch, name no producer."""
    events = [_gpu("kernel", "void at::native::vectorized_elementwise_kernel<4>", 0, 10, 9),
              _gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 20, 2, 10, bytes=4),
              _x("cpu_op", "aten::to", 30, 20),
              _x("cuda_runtime", "cudaMemcpyAsync", 32, 5, correlation=11),
              _gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 40, 2, 11, bytes=64),
              _x("cpu_op", "aten::uniform_", 60, 10),
              _x("cuda_runtime", "cudaLaunchKernel", 62, 5, correlation=12),
              _gpu("kernel", "uniform_kernel", 70, 5, 12)]
    t = from_kineto({"schemaVersion": 1, "traceEvents": events}, "k.json")
    assert sorted((c.direction, c.producer, c.consumer) for c in t.copies) == [
        ("DtoH", None, None), ("HtoD", None, None)]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kineto is not here")
def test_the_alexnet_parameter_uploads_have_no_guessed_reader():
    t = load_any(os.fspath(SHARED / "a100_alexnet.json.gz"))
    assert [(c.direction, c.calls, c.consumer) for c in t.copies] == [("HtoD", 16, None)]


def test_the_profilers_window_is_not_an_event_of_the_span():
    """torch.profiler's `Trace` event is its recording window, which can run on seconds past
    the last event (sampled_rank0: 3.37 s, with 1.23 s of events), and its metadata events
    are stamped with the window's start: the total is the events'."""
    data = kineto_trace()
    data["traceEvents"].append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)",
                                "ts": -100, "dur": 5000, "pid": "Traces", "tid": "PyTorch"})
    data["traceEvents"].append({"ph": "M", "name": "process_name", "ts": -100, "pid": 1,
                                "tid": 0, "args": {"name": "trainer"}})  # at the window's start
    assert from_kineto(data, "k.json").summary.total_ns == 520_000


def test_a_trace_of_runtime_calls_alone_is_read_from_its_launches():
    """(issue 43) Recorded without ProfilerActivity.CUDA (CUPTI's runtime calls alone): each
    copy is its cudaMemcpy* call, waited for when a stream sync follows in its op; the
    direction where the op tells it; no bytes or device time; the waits as ever."""
    events = [_x("cpu_op", "aten::item", 0, 60), _x("cpu_op", "aten::_local_scalar_dense", 5, 50),
              _x("cuda_runtime", "cudaMemcpyAsync", 10, 10, correlation=1),
              _x("cuda_runtime", "cudaStreamSynchronize", 22, 8, correlation=2),
              _x("cpu_op", "aten::to", 100, 40), _x("cpu_op", "aten::copy_", 105, 30),
              _x("cuda_runtime", "cudaMemcpyAsync", 110, 5, correlation=3),
              _x("cuda_runtime", "cudaLaunchKernel", 150, 5, correlation=4),
              _x("cuda_runtime", "cudaDeviceSynchronize", 200, 40, correlation=5)]
    t = from_kineto({"schemaVersion": 1, "traceEvents": events}, "k.json")
    assert sorted((c.direction, c.sync, c.trigger, c.calls, c.host_ns, c.bytes, c.device_ns,
                   c.producer, c.idle_ns) for c in t.copies) == [
        ("DtoH", True, "item", 1, 18_000, 0, 0, None, None),
        ("unknown", False, "to", 1, 5_000, 0, 0, None, None)]
    assert [(w.kind, w.calls, w.wait_ns) for w in t.waits] == [("synchronize", 1, 40_000)]
    assert t.meta.untraced[0].startswith("no device activity in the trace")


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kineto is not here")
def test_the_alexnet_trace_without_its_device_activity(tmp_path):
    data = json.loads(gzip.decompress((SHARED / "a100_alexnet.json.gz").read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") not in
                           ("kernel", "gpu_memcpy", "gpu_memset", "ac2g")]
    (tmp_path / "runtime.json").write_text(json.dumps(data))
    t = load_any(str(tmp_path / "runtime.json"))
    # its 16 cudaMemcpyAsync, each followed by its stream sync inside aten::to: 57.55 ms
    assert [(c.direction, c.sync, c.trigger, c.calls, c.host_ns) for c in t.copies] == [
        ("unknown", True, "to", 16, 57_550_000)]
    assert [(w.kind, w.calls, w.wait_ns) for w in t.waits] == [("synchronize", 5, 938_000)]
    r = _in_process("explain", "runtime.json", cwd=tmp_path)
    assert r.returncode == 0 and "Note: no device activity in the trace" in r.stdout
    assert "GPU idle 0" not in r.stdout  # (not measured without device activity)
