"""Tracer overhead and scale, against plain PyTorch, a bare dispatch mode and torch.profiler.

    python benchmarks/run.py [--quick] [--million]

Workloads, each run plain, under a bare forwarding TorchDispatchMode, under memcpy-doctor
(ops on the host, also with the Python version of its producer table, which an install
without a C compiler runs; and on the simulated GPU) and under torch.profiler (CPU activity
only; with key_averages(); with stacks, shapes and key_averages()), all in this one process:
- small-ops: a loop of 64x64 matmul, relu, mul, add;
- transformer: a small TransformerEncoder forward and backward with an optimizer step;
- generate: a generate-style loop that reads a token back to the host every step.
memcpy-doctor's modes are end to end: tracing, then the trace and its Profiling Report.
Then the memory and size check (10x the iterations: trace size and the tracer's own peak
Python memory, by tracemalloc) and, with --million, explain and check on the trace of a run of
about a million ops. Times are wall time on this machine; one thread. A shared machine's speed
drifts by tens of percent over minutes, so the modes take turns: each repetition runs every
mode once, and each mode's time is its best. benchmarks/instructions.py counts instructions
instead, which do not drift.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memcpy_doctor
from memcpy_doctor.analysis.attribution import explain
from memcpy_doctor.analysis.gates import check
from memcpy_doctor.analysis.rules import suggest
from memcpy_doctor.core.trace import Trace
from memcpy_doctor.tracer import collector
from memcpy_doctor.tracer.producers import PyProducerTable


class Forwarding(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def small_ops(device: str, iters: int) -> None:
    a = torch.randn(64, 64, device=device)
    b = torch.randn(64, 64, device=device)
    for _ in range(iters):
        c = torch.mm(a, b)
        c = torch.relu(c)
        c = c * 0.5
        a = c + b


def transformer(device: str, iters: int) -> None:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                             batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16, 64, device=device)
    for _ in range(iters):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def generate(device: str, iters: int) -> None:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(100, 32).to(device)
    cell = torch.nn.GRUCell(32, 32).to(device)
    head = torch.nn.Linear(32, 100).to(device)
    h = torch.zeros(1, 32, device=device)
    token = 1
    with torch.no_grad():
        for _ in range(iters):
            x = emb(torch.tensor([token], device=device))
            h = cell(x, h)
            token = int(head(h).argmax())  # the host reads the token every step


WORKLOADS: dict[str, tuple[Callable[[str, int], None], int]] = {
    "small-ops": (small_ops, 3000),
    "transformer": (transformer, 20),
    "generate": (generate, 300),
}


def count_ops(fn: Callable[[str, int], None], iters: int) -> int:
    counter = OpCounter()
    with counter:
        fn("cpu", iters)
    return counter.ops


#: Each mode's time is the best of this many runs (the least disturbed by the rest of the
#: machine).
REPEAT = 5


def timed(runs: dict[str, Callable[[], None]], repeat: int) -> dict[str, float]:
    """The best time of each run over `repeat` rounds, each round running each once in turn
    (so a slow minute of the machine costs every mode alike)."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            gc.collect()
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def modes(fn: Callable[[str, int], None], iters: int) -> dict[str, Callable[[], None]]:
    from torch.profiler import ProfilerActivity, profile

    def plain():
        fn("cpu", iters)

    def bare():
        with Forwarding():
            fn("cpu", iters)

    def md_host():
        with memcpy_doctor.profiler(device="sim") as prof:
            fn("cpu", iters)
        prof.report()

    def md_host_python_table():
        """As md_host, with the Python version of the producer table (what an install without
        a C compiler runs)."""
        compiled = collector.ProducerTable
        collector.ProducerTable = PyProducerTable
        try:
            md_host()
        finally:
            collector.ProducerTable = compiled

    def md_sim():
        with memcpy_doctor.profiler(device="sim") as prof:
            fn("cuda", iters)
        prof.report()

    def tp_cpu():
        with profile(activities=[ProfilerActivity.CPU]):
            fn("cpu", iters)

    def tp_avg():
        with profile(activities=[ProfilerActivity.CPU]) as p:
            fn("cpu", iters)
        p.key_averages()

    def tp_full():
        with profile(activities=[ProfilerActivity.CPU], with_stack=True,
                     record_shapes=True) as p:
            fn("cpu", iters)
        p.key_averages()

    return {"plain": plain, "bare dispatch mode": bare, "memcpy-doctor (host)": md_host,
            "memcpy-doctor (host, Python table)": md_host_python_table,
            "memcpy-doctor (sim)": md_sim, "torch.profiler cpu": tp_cpu,
            "torch.profiler + key_averages": tp_avg,
            "torch.profiler stack+shapes+key_averages": tp_full}


def overhead_table(quick: bool) -> None:
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, one thread; "
          f"{'quick' if quick else 'full'} run; best of {1 if quick else REPEAT} turns")
    for name, (fn, iters) in WORKLOADS.items():
        if quick:
            iters = max(2, iters // 10)
        ops = count_ops(fn, iters)
        runs = modes(fn, iters)
        for run in runs.values():
            run()  # warm up (the first dispatch mode imports torch._dynamo)
        results = timed(runs, 1 if quick else REPEAT)
        plain = results["plain"]
        bare = results["bare dispatch mode"] - plain
        md = results["memcpy-doctor (host)"] - plain
        full = results["torch.profiler stack+shapes+key_averages"] - plain
        print(f"\n{name}: {ops} aten ops per run")
        print(f"  {'mode':<42}{'us/op':>9}{'overhead us/op':>16}{'x bare overhead':>17}")
        for mode, t in results.items():
            over = (t - plain) / ops * 1e6
            ratio = (t - plain) / bare if bare > 0 else float("nan")
            print(f"  {mode:<42}{t / ops * 1e6:9.1f}{over:16.1f}{ratio:17.2f}")
        print(f"  torch.profiler (stack+shapes+key_averages) / memcpy-doctor (host) overhead: "
              f"{full / md:.1f}x")


def size_and_memory(quick: bool) -> None:
    base = 300 if quick else 1000
    print("\nmemory and trace size (small-ops loop, simulated GPU):")
    rows = []
    for iters in (base, 10 * base):
        tracemalloc.start()
        with memcpy_doctor.profiler(device="sim") as prof:
            small_ops("cuda", iters)
            x = torch.ones(8, device="cuda")
            for _ in range(iters // 10):
                x.sum().item()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows.append((iters, len(prof.trace.to_json()), peak))
        print(f"  {iters:>6} iterations: trace {rows[-1][1]:>8} bytes, tracer peak Python "
              f"memory {peak / 1024:.0f} KiB")
    print(f"  10x iterations: trace size x{rows[1][1] / rows[0][1]:.3f}, peak memory "
          f"x{rows[1][2] / rows[0][2]:.3f}")


def million() -> None:
    print("\nexplain and check on the trace of a run of about a million ops:")
    t0 = time.perf_counter()
    with memcpy_doctor.profiler(device="sim") as prof:
        small_ops("cuda", 250_000)
        x = torch.ones(8, device="cuda")
        for _ in range(1000):
            x.sum().item()
    traced = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        prof.trace.save(path)
        t0 = time.perf_counter()
        trace = Trace.load(path)
        suggest(trace, explain(trace))
        t_explain = time.perf_counter() - t0
        t0 = time.perf_counter()
        check(Trace.load(path), {"sync_calls": 0})
        t_check = time.perf_counter() - t0
    ops = sum(o.calls for o in prof.trace.ops)
    print(f"  {ops} ops traced in {traced:.1f} s; trace {len(prof.trace.to_json())} bytes")
    print(f"  load + explain + suggest: {t_explain:.3f} s; load + check: {t_check:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--million", action="store_true", help="also the million-op check")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    overhead_table(opts.quick)
    size_and_memory(opts.quick)
    if opts.million:
        million()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
