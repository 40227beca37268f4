"""How long a large torch.profiler trace takes to import, and how much memory: issue 20 asks
for a 35 MB trace of about 100k events in seconds, with memory a small multiple of the file.

    python benchmarks/kineto_scale.py [--events 100000] [--gzip] [--keep PATH]

Synthesizes a trace in Kineto's format: training steps of eager ops, each a cpu_op with its
cudaLaunchKernel and kernel, Python frames (with_stack), and per step an upload with its
stream sync and a loss.item(). Then reads it as `memcpy-doctor report` does
(core/kineto.load_any) and prints the file size, events, wall time, and the peak memory:
the process's peak RSS over what it held before reading (resource), and the peak of Python
allocations during the read (tracemalloc, a second read, slower).
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

from memcpy_doctor.core.kineto import load_any  # noqa: E402


def synthesize(n_events: int) -> dict:
    """A trace of about `n_events` events (see the module docstring); times in us."""
    events: list[dict] = []
    t, corr, step = 0.0, 0, 0

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
        events += [x("cpu_op", "aten::to", t + 1, 30, **{"External id": corr}),
                   x("cuda_runtime", "cudaMemcpyAsync", t + 2, 20, correlation=corr),
                   x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 3, 18, pid=0,
                     tid=7, correlation=corr, stream=7, bytes=1 << 20, device=0),
                   x("cuda_runtime", "cudaStreamSynchronize", t + 23, 5, correlation=corr + 1)]
        corr += 1
        t += 40
        for i in range(40):
            corr += 1
            events += [x("python_function", "model.py(30): forward", t, 12),
                       x("cpu_op", f"aten::op{i % 12}", t + 1, 10, **{
                           "External id": corr, "Sequence number": step, "Ev Idx": corr,
                           "Input Dims": [[64, 256, 56, 56], [256], []],
                           "Input type": ["float", "float", "Scalar"],
                           "Input Strides": [[802816, 3136, 56, 1], [1], []],
                           "Concrete Inputs": ["", "", "1"], "Record function id": 0}),
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
        corr += 1
        events += [x("cpu_op", "aten::item", t, 30), x("cpu_op", "aten::_local_scalar_dense",
                                                        t + 1, 28),
                   x("cuda_runtime", "cudaMemcpyAsync", t + 2, 5, correlation=corr),
                   x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 8, 2, pid=0, tid=7,
                     correlation=corr, stream=7, bytes=4, device=0),
                   x("cuda_runtime", "cudaStreamSynchronize", t + 10, 15,
                     correlation=corr + 1)]
        corr += 1
        t += 40
        frame["dur"] = t - start
    return {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}],
            "traceEvents": events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--gzip", action="store_true", help="write and read it as .json.gz")
    ap.add_argument("--keep", metavar="PATH", help="write the trace here and keep it")
    ap.add_argument("--read", metavar="PATH", help=argparse.SUPPRESS)  # the measuring child
    a = ap.parse_args()
    if a.read:
        return measure(a.read)
    data = synthesize(a.events)
    raw = json.dumps(data).encode()
    del data
    path = a.keep or os.path.join(tempfile.mkdtemp(), "trace.json" + (".gz" * a.gzip))
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if a.gzip else raw)
    size, n = os.path.getsize(path), raw.count(b'"ph"')
    del raw
    print(f"file {size / 1e6:.1f} MB{' (gzip)' if a.gzip else ''}, {n} events")
    sys.stdout.flush()
    try:  # measured in a fresh process, so the synthesis's memory is not counted
        subprocess.run([sys.executable, __file__, "--read", path], check=True)
    finally:
        if not a.keep:
            os.unlink(path)


def measure(path: str) -> None:
    size = os.path.getsize(path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    trace = load_any(path)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    del trace
    tracemalloc.start()
    load_any(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"import: {wall:.2f} s; peak RSS growth {rss / 1e6:.0f} MB ({rss / size:.1f}x the "
          f"file); peak Python allocations {peak / 1e6:.0f} MB ({peak / size:.1f}x)")


if __name__ == "__main__":
    main()
