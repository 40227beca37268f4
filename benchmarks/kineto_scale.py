"""How long a large torch.profiler trace takes to import, and how much memory: issue 20 asks
for a 35 MB trace of about 100k events in seconds, with memory a small multiple of the file.

    python benchmarks/kineto_scale.py [--events 100000] [--items 1] [--library-frames 0]
                                      [--kineto-order] [--gzip] [--keep PATH]
                                      [--execution-trace]

Synthesizes a trace in Kineto's format: training steps of eager ops, each a cpu_op with its
cudaLaunchKernel and kernel, Python frames (with_stack), and per step an upload with its
stream sync and a loss.item(). Then reads it as `memcpy-doctor report` does
(kineto/reader.load_any) and prints the file size, events, wall time, and the peak memory:
the reading process's peak RSS, and over what it held before reading, and the peak of
Python allocations during the read (tracemalloc, a second read, slower; it does not see the
memory of SQLite, where the events are kept: the RSS does). Issue 33 asks that
the peak stay about flat as the trace grows: run it at --events 40000, 155000 and 600000.
With --items N, each step reads N scalars like loss.item() (a copy with its stream sync):
--items 40 makes a trace where copies are one event in ten, for the cost of each copy.
--library-frames N puts N frames of torch's code around each op, as with_stack records
them; --kineto-order writes the events as torch.profiler does (the host's ops and frames
first, then the runtime calls and the device's activity) instead of step by step.

With --execution-trace it also synthesizes the ExecutionTraceObserver file of the same run
(one node per cpu_op, each op reading the one before's output, storages reused every step as
the caching allocator reuses them) and reads both, as `report TRACE --execution-trace ET`
does: the figures then cover the ET's parse and the join, and the ET's size is printed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from memcpy_doctor.kineto.reader import load_any, read_execution_trace  # noqa: E402


class _Et:
    """The nodes of a synthesized execution trace (schema 1.1.1-chakra.0.0.4)."""

    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self.next_id = 3  # 1: the process, 2: the thread

    def add(self, name: str, rf: int, ins: list, outs: list, parent: int = 2) -> int:
        nid, self.next_id = self.next_id, self.next_id + 1
        types = (lambda vs: ["Tensor(float)" if isinstance(v, list) else "Int" for v in vs])
        attrs = {"rf_id": rf, "fw_parent": 0, "seq_id": -1, "scope": 0, "tid": 1,
                 "fw_tid": 0, "op_schema": f"{name}(Tensor self) -> Tensor",
                 "kernel_backend": "", "kernel_file": "", "tensor_range": ""}
        self.nodes.append({
            "id": nid, "name": name, "ctrl_deps": parent,
            "inputs": {"values": ins, "shapes": [[64, 256]] * len(ins), "types": types(ins),
                       "strides": [[256, 1]] * len(ins)},
            "outputs": {"values": outs, "shapes": [[64, 256]] * len(outs),
                        "types": types(outs), "strides": [[256, 1]] * len(outs)},
            "attrs": [{"name": k, "type": "uint64", "value": v} for k, v in attrs.items()]})
        return nid

    def data(self) -> dict:
        thread = {"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1,
                  "inputs": {"values": [], "shapes": [], "types": [], "strides": []},
                  "outputs": {"values": [], "shapes": [], "types": [], "strides": []},
                  "attrs": [{"name": "rf_id", "type": "uint64", "value": 0}]}
        return {"schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "", "start_ts": 0,
                "nodes": [thread, *self.nodes], "finish_ts": 0}


def _tensor(tid: int, sid: int, device: str = "cuda:0") -> list:
    return [tid, sid, 0, 16384, 4, device]


#: Frames of torch's own code, as with_stack records them between a model's forward and its
#: ops (the reader keeps none of them: they are no site).
_LIBRARY_FRAMES = ("torch/nn/modules/module.py(1762): _wrapped_call_impl",
                   "torch/nn/modules/module.py(1773): _call_impl",
                   "torch/nn/modules/linear.py(124): forward",
                   "<built-in method linear of PyCapsule object at 0x7f3a2c1d5e40>")


def synthesize(n_events: int, et: _Et | None = None, items: int = 1,
               library_frames: int = 0) -> dict:
    """A trace of about `n_events` events (see the module docstring), `items` reads like
    loss.item() per step, `library_frames` frames of torch's code around each op; times in
    us. With `et`, its ops carry record function ids and `et` gets their nodes."""
    events: list[dict] = []
    t, corr, step, rf = 0.0, 0, 0, 0
    tensor = 10_000_000  # tensor ids, apart from node ids

    def x(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1,
          **args: object) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                "dur": dur, "args": args}

    while len(events) < n_events:
        step += 1
        start = t
        events.append(x("python_function", "train.py(12): step", t, 0))  # dur set below
        frame = events[-1]
        corr += 1
        rf += 1
        if et is not None:  # the upload: a host batch in, a device tensor out
            tensor += 2
            last = _tensor(tensor, 900)
            et.add("aten::to", rf, [_tensor(tensor - 1, 901, "cpu")], [last])
        events += [x("cpu_op", "aten::to", t + 1, 30, **{"External id": corr,
                                                         "Record function id": rf}),
                   x("cuda_runtime", "cudaMemcpyAsync", t + 2, 20, correlation=corr),
                   x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 3, 18, pid=0,
                     tid=7, correlation=corr, stream=7, bytes=1 << 20, device=0),
                   x("cuda_runtime", "cudaStreamSynchronize", t + 23, 5, correlation=corr + 1)]
        corr += 1
        t += 40
        for i in range(40):
            corr += 1
            rf += 1 if et is not None else 0
            if et is not None:  # reads the last op's output; storages reused every step
                tensor += 1
                out = _tensor(tensor, 1000 + i)
                et.add(f"aten::op{i % 12}", rf, [last, 1], [out])
                last = out
            events += [x("python_function", "model.py(30): forward", t, 12)]
            events += [x("python_function", _LIBRARY_FRAMES[j % len(_LIBRARY_FRAMES)],
                         t + 0.1 * (j + 1), 11.8 - 0.2 * (j + 1))
                       for j in range(library_frames)]
            events += [
                       x("cpu_op", f"aten::op{i % 12}", t + 1, 10, **{
                           "External id": corr, "Sequence number": step, "Ev Idx": corr,
                           "Input Dims": [[64, 256, 56, 56], [256], []],
                           "Input type": ["float", "float", "Scalar"],
                           "Input Strides": [[802816, 3136, 56, 1], [1], []],
                           "Concrete Inputs": ["", "", "1"], "Record function id": rf}),
                       x("cuda_runtime", "cudaLaunchKernel", t + 3, 5, correlation=corr),
                       x("kernel", f"void kernel_{i % 12}<float, 128>(float*, int)", t + 8, 9,
                         pid=0, tid=7, correlation=corr, stream=7, grid=[128, 1, 1],
                         block=[256, 1, 1], device=0, context=1, queued=0,
                         **{"registers per thread": 32, "shared memory": 0,
                            "blocks per SM": 1.18, "warps per SM": 9.48,
                            "est. achieved occupancy %": 15, "External id": corr}),
                       {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": t + 8,
                        "cat": "ac2g", "name": "ac2g", "bp": "e"}]
            t += 15
        for _ in range(items):  # loss.item(), and as many more reads as asked
            corr += 1
            rf += 2
            if et is not None:
                item = et.add("aten::item", rf - 1, [last], [0.5])
                et.add("aten::_local_scalar_dense", rf, [last], [0.5], parent=item)
            events += [x("cpu_op", "aten::item", t, 30, **{"Record function id": rf - 1}),
                       x("cpu_op", "aten::_local_scalar_dense", t + 1, 28,
                         **{"Record function id": rf}),
                       x("cuda_runtime", "cudaMemcpyAsync", t + 2, 5, correlation=corr),
                       x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 8, 2, pid=0,
                         tid=7, correlation=corr, stream=7, bytes=4, device=0),
                       x("cuda_runtime", "cudaStreamSynchronize", t + 10, 15,
                         correlation=corr + 1)]
            corr += 1
            t += 40
        frame["dur"] = t - start - 1  # ends before the next step's frame starts
    return {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}],
            "traceEvents": events}


def kineto_order(events: list[dict]) -> list[dict]:
    """`events` in the order torch.profiler writes them: the host's ops and Python frames
    first, then the runtime calls and the device's activity (with the flows), each part by
    start."""
    host = [e for e in events if e.get("cat") in ("cpu_op", "python_function")]
    rest = [e for e in events if e.get("cat") not in ("cpu_op", "python_function")]
    return (sorted(host, key=lambda e: e["ts"]) + sorted(rest, key=lambda e: e["ts"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--gzip", action="store_true", help="write and read it as .json.gz")
    ap.add_argument("--keep", metavar="PATH", help="write the trace here and keep it")
    ap.add_argument("--items", type=int, default=1, metavar="N",
                    help="reads like loss.item() per step (40 ops): more copies per event")
    ap.add_argument("--library-frames", type=int, default=0, metavar="N",
                    help="frames of torch's code around each op (with_stack records them)")
    ap.add_argument("--kineto-order", action="store_true",
                    help="the events in torch.profiler's order (host events first), not "
                    "interleaved by step")
    ap.add_argument("--execution-trace", action="store_true",
                    help="also an execution trace of the same run, read with it")
    ap.add_argument("--read", metavar="PATH", help=argparse.SUPPRESS)  # the measuring child
    ap.add_argument("--read-et", metavar="PATH", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.read:
        return measure(a.read, a.read_et)
    et = _Et() if a.execution_trace else None
    data = synthesize(a.events, et, a.items, a.library_frames)
    if a.kineto_order:
        data["traceEvents"] = kineto_order(data["traceEvents"])
    raw = json.dumps(data).encode()
    del data
    path = a.keep or os.path.join(tempfile.mkdtemp(), "trace.json" + (".gz" * a.gzip))
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if a.gzip else raw)
    size, n = os.path.getsize(path), raw.count(b'"ph"')
    del raw
    print(f"file {size / 1e6:.1f} MB{' (gzip)' if a.gzip else ''}, {n} events")
    child = [sys.executable, __file__, "--read", path]
    if et is not None:
        et_path = path.replace("trace.json", "et.json") if not a.keep else a.keep + ".et.json"
        with open(et_path, "w") as f:
            json.dump(et.data(), f)
        child += ["--read-et", et_path]
        print(f"execution trace {os.path.getsize(et_path) / 1e6:.1f} MB, "
              f"{len(et.nodes) + 1} nodes")
    sys.stdout.flush()
    try:  # measured in a fresh process, so the synthesis's memory is not counted
        subprocess.run(child, check=True)
    finally:
        if not a.keep:
            os.unlink(path)
            if et is not None:
                os.unlink(et_path)


def _read(path: str, et_path: str | None) -> object:
    return load_any(path, read_execution_trace(et_path) if et_path else None)


def _peak_rss() -> int:
    """This process's peak resident memory, bytes: VmHWM where /proc has it, as it starts
    afresh when the process starts, while ru_maxrss keeps the peak of the parent that
    spawned it (the synthesis's, here)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(path: str, et_path: str | None = None) -> None:
    size = os.path.getsize(path) + (os.path.getsize(et_path) if et_path else 0)
    before = _peak_rss()
    t0 = time.perf_counter()
    trace = _read(path, et_path)
    wall = time.perf_counter() - t0
    peak = _peak_rss()
    rss = peak - before
    if et_path:
        print("  " + trace.meta.untraced[0])
    del trace
    tracemalloc.start()
    _read(path, et_path)
    allocated = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    files = "the files" if et_path else "the file"
    print(f"import: {wall:.2f} s; peak RSS {peak / 1e6:.0f} MB, growth {rss / 1e6:.0f} MB "
          f"({rss / size:.1f}x {files}); peak Python allocations (SQLite's not counted) "
          f"{allocated / 1e6:.0f} MB "
          f"({allocated / size:.1f}x)")


if __name__ == "__main__":
    main()
