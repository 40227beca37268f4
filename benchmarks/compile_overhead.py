"""The tracer's overhead on a torch.compile'd loop, after compilation, against the plain run.

    python benchmarks/compile_overhead.py [WORKLOAD ...] [--calls N] [--repeat R] [--turns T]
                                          [--instructions] [--icalls N]

Workloads, compiled with torch.compile's default backend (Inductor, CPU kernels), small
enough that the cost of a call, not its arithmetic, is what is measured:
- mlp: an nn.Module of three Linear layers with GELU between them (batch 8, width 64, or
  --batch and --width),
  compiled whole: one graph, in which Inductor fuses the GELUs and calls out to aten's addmm
  for each Linear;
- graph-break: a compiled function that runs the same MLP, reads the sum of its output back to
  the host with `.item()` (a graph break) and scales the output by it: two graphs and the read;
- train: one SGD step a call of the same MLP compiled whole, on an MSE loss: the compiled
  forward, its compiled backward (run by the autograd engine), the loss's and the
  optimizer's eager ops.

Each is called in a loop under torch.no_grad() (train turns grad on inside its step), in five
modes:
- plain: host tensors, no mode;
- bare modes: a forwarding TorchFunctionMode and a forwarding TorchDispatchMode that says
  `ignore_compile_internals` (as the tracer's does), host tensors: what any pair of Python
  modes costs the compiled loop, the tracer's floor;
- memcpy-doctor (host): under `Tracer(device="sim")`, host tensors;
- memcpy-doctor (sim): under `Tracer(device="sim")`, the model moved and the input made with
  `device="cuda"` inside the tracer (simulated GPU tensors, as under `memcpy-doctor profile`
  on a machine without a GPU);
- every call traced: the same with `compiled_calls_traced=None`: the ops inside each graph
  traced on every call, not only on its first calls (tracer/regions.py).

The model is built, compiled and warmed up (the first calls compile) inside the mode, so a
traced run's graphs are compiled under the tracer, as under `memcpy-doctor profile`; only the
calls after that are measured, and a compile during them is reported. Each mode of each
workload runs in its own process (Dynamo's caches and guards, and the tracer, start fresh);
Inductor's on-disk cache makes every compile after the first quick. Wall time: the best of
`--repeat` loops of `--calls` calls in each process, and the best over `--turns` turns, each
turn running every mode's process once, so that a slow minute of the machine costs every mode
alike. memcpy-doctor's stop (the trace and its report) is a cost per run, shown apart.

With --instructions, the CPU instructions per call of `--icalls` calls under valgrind's
callgrind (as benchmarks/instructions.py; `apt install valgrind`), which repeat where wall times
do not: each process runs uninstrumented until it is warm (callgrind's `--instr-atstart=no`;
the compile would take minutes instrumented), then `callgrind_control -i on` switches the
instrumentation on and the loop runs inside itertools.starmap, the only part counted
(`--toggle-collect=starmap_next`). About 40 s a process, two at a time: under 3 minutes.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, Callable

MODES = {"plain": "plain", "bare": "bare modes", "host": "memcpy-doctor (host)",
         "sim": "memcpy-doctor (sim)", "sim-all": "  every call traced"}
WORKLOADS = ("mlp", "graph-break", "train")
#: Calls before the measured ones: the first compiles.
WARMUP = 10


# ----- the workloads (built in the measuring process) -----
def _mlp(device: str, width: int) -> Any:
    import torch
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width),
                         nn.GELU(), nn.Linear(width, width)).to(device)


def build(workload: str, device: str, batch: int = 8,
          width: int = 64) -> tuple[Callable[[Any], Any], Any]:
    """The compiled callable and its input."""
    import torch
    model = _mlp(device, width)
    x = torch.randn(batch, width, device=device)
    if workload == "mlp":
        return torch.compile(model), x
    if workload == "train":
        return _train_step(model, x), x

    @torch.compile
    def step(x):
        y = model(x)
        s = y.sum().item()  # graph break: the host reads the sum
        return y * s

    return step, x


def _train_step(model: Any, x: Any) -> Callable[[Any], Any]:
    """One SGD step of the model compiled whole, on an MSE loss (grad on inside the step)."""
    import torch
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    target = torch.randn_like(x)

    def step(x: Any) -> None:
        with torch.enable_grad():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(compiled(x), target).backward()
            opt.step()

    return step


def calls_of(step: Callable[[Any], Any], x: Any, n: int) -> None:
    import torch
    with torch.no_grad():
        for _ in range(n):
            step(x)


# ----- one mode of one workload, in its own process -----
def bare_modes() -> list[Any]:
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class ForwardingFunction(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class ForwardingDispatch(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return [ForwardingFunction(), ForwardingDispatch()]


def measure(workload: str, mode: str, calls: int, repeat: int, instructions: bool,
            batch: int = 8, width: int = 64) -> None:
    """Print one JSON line: the best seconds per call (or, under callgrind, the calls the
    counted loop made), the graphs compiled during the measured calls, and for memcpy-doctor
    the stop's cost and what the trace holds per call."""
    import torch
    from torch._dynamo.utils import counters
    torch.set_num_threads(1)
    result: dict[str, Any] = {}
    tracer = None
    with ExitStack() as stack:
        if mode == "bare":
            for m in bare_modes():
                stack.enter_context(m)
        elif mode in ("host", "sim", "sim-all"):
            from memcpy_doctor.core.defaults import REGION_CALLS_TRACED
            from memcpy_doctor.tracer import Tracer
            tracer = Tracer(device="sim", compiled_calls_traced=None if mode == "sim-all"
                            else REGION_CALLS_TRACED)
            stack.enter_context(tracer)
        step, x = build(workload, "cuda" if mode.startswith("sim") else "cpu", batch, width)
        calls_of(step, x, WARMUP)
        graphs = counters["stats"]["unique_graphs"]
        if instructions:
            print("warm", flush=True)  # the parent switches callgrind's instrumentation on
            sys.stdin.readline()
            list(itertools.starmap(calls_of, [(step, x, calls)]))
        else:
            best = float("inf")
            for _ in range(repeat):
                gc.collect()
                t0 = time.perf_counter()
                calls_of(step, x, calls)
                best = min(best, time.perf_counter() - t0)
            result["s_per_call"] = best / calls
        result["compiled_while_measured"] = counters["stats"]["unique_graphs"] - graphs
        t0 = time.perf_counter()
    if tracer is not None:
        from memcpy_doctor.render.text import render_text
        render_text(tracer.trace)
        result["stop_s"] = time.perf_counter() - t0
        runs = WARMUP + (calls if instructions else calls * repeat)
        result["per_call"] = {o.op: round(o.calls / runs, 2) for o in tracer.trace.ops
                              if o.calls >= runs}
        info = tracer.trace.compile
        result["graphs"] = info.dynamo_graphs if info else 0
        result["traced_calls"] = [[g.traced_calls, g.calls] for g in info.graphs] if info else []
        result["recompiles"] = info.recompiles if info else 0
    print(json.dumps(result), flush=True)


# ----- the parent -----
def child_command(workload: str, mode: str, opts: argparse.Namespace,
                  instructions: bool = False) -> list[str]:
    return [sys.executable, __file__, "--measure", workload, mode, "--calls",
            str(opts.icalls if instructions else opts.calls), "--repeat", str(opts.repeat),
            "--batch", str(opts.batch), "--width", str(opts.width)] + \
           (["--instructions"] if instructions else [])


def run_child(command: list[str]) -> dict[str, Any]:
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[2:])}: failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def count_child(workload: str, mode: str, opts: argparse.Namespace) -> dict[str, Any]:
    """Instructions per call of one mode, under callgrind (see the module's docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = str(pathlib.Path(tmp) / "callgrind.out")
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   "--collect-atstart=no", "--toggle-collect=starmap_next",
                   f"--callgrind-out-file={out_file}"]
        command += child_command(workload, mode, opts, instructions=True)
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONHASHSEED": "0"})
        line = child.stdout.readline()
        if line.strip() != "warm":
            child.kill()
            sys.exit(f"{workload} {mode} under callgrind: {line}{child.stderr.read()[-3000:]}")
        subprocess.run(["callgrind_control", "-i", "on", str(child.pid)], check=True,
                       capture_output=True)
        out, err = child.communicate("\n")
        if child.returncode != 0:
            sys.exit(f"{workload} {mode} under callgrind failed:\n{err[-3000:]}")
        result = json.loads(out.strip().splitlines()[-1])
        annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                                    "--auto=no", out_file],
                                   capture_output=True, text=True, check=True).stdout
    counted = [int(m.group(1).replace(",", "")) for m in
               re.finditer(r"^\s*([\d,]+) .*:starmap_next(\s|$)", annotated, re.M)]
    result["instructions_per_call"] = max(counted) / opts.icalls
    return result


def wall_table(opts: argparse.Namespace) -> None:
    import torch
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, one thread; batch {opts.batch}, "
          f"width {opts.width}; {opts.calls} calls after {WARMUP} warm-up calls, best of "
          f"{opts.repeat} loops x {opts.turns} turns; wall time")
    for workload in opts.workloads:
        best: dict[str, dict[str, Any]] = {}
        for _ in range(opts.turns):
            for mode in MODES:
                r = run_child(child_command(workload, mode, opts))
                if mode not in best or r["s_per_call"] < best[mode]["s_per_call"]:
                    best[mode] = r
        plain = best["plain"]["s_per_call"]
        print(f"\n{workload}:")
        print(f"  {'mode':<24}{'us/call':>9}{'overhead us/call':>18}{'x plain':>9}")
        for mode, label in MODES.items():
            t = best[mode]["s_per_call"]
            print(f"  {label:<24}{t * 1e6:9.1f}{(t - plain) * 1e6:18.1f}{t / plain:9.2f}")
        notes(workload, best)


def notes(workload: str, results: dict[str, dict[str, Any]]) -> None:
    for mode, r in results.items():
        if r.get("compiled_while_measured"):
            print(f"  ! {MODES[mode]}: {r['compiled_while_measured']} graph(s) compiled "
                  f"during the measured calls")
    sim = results.get("sim")
    if sim and "per_call" in sim:
        rows = ", ".join(f"{op} x{n:g}" for op, n in sim["per_call"].items())
        print(f"  traced per call (sim): {rows}; {sim['graphs']} graph(s), "
              f"{sim['recompiles']} recompile(s)")
        traced = ", ".join(f"{t} of {n}" for t, n in sim.get("traced_calls", []))
        print(f"  calls of each graph traced op by op (sim): {traced}")
        for mode in ("host", "sim"):
            if "stop_s" in results.get(mode, {}):
                print(f"  {MODES[mode]} stop (trace and report): "
                      f"{results[mode]['stop_s'] * 1e3:.1f} ms a run")


def instruction_table(opts: argparse.Namespace) -> None:
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: install valgrind (apt install valgrind)")
    print(f"CPU instructions per call (callgrind, {opts.icalls} calls after {WARMUP} warm-up "
          f"calls, PYTHONHASHSEED=0; batch {opts.batch}, width {opts.width})")
    jobs = [(w, m) for w in opts.workloads for m in MODES]
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        done = dict(zip(jobs, pool.map(lambda job: count_child(*job, opts), jobs)))
    for workload in opts.workloads:
        plain = done[(workload, "plain")]["instructions_per_call"]
        print(f"\n{workload}:")
        print(f"  {'mode':<24}{'instr/call':>11}{'overhead':>10}{'x plain':>9}")
        for mode, label in MODES.items():
            n = done[(workload, mode)]["instructions_per_call"]
            print(f"  {label:<24}{n:11.0f}{n - plain:10.0f}{n / plain:9.3f}")
        for mode in MODES:
            if done[(workload, mode)].get("compiled_while_measured"):
                print(f"  ! {MODES[mode]}: a graph compiled during the counted calls")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"of {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    parser.add_argument("--repeat", type=int, default=5, help="timed loops per process")
    parser.add_argument("--turns", type=int, default=2, help="processes per mode")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind instead of timing "
                             "(under 3 minutes)")
    parser.add_argument("--icalls", type=int, default=200,
                        help="calls counted under callgrind")
    parser.add_argument("--batch", type=int, default=8, help="the input's rows")
    parser.add_argument("--width", type=int, default=64, help="the MLP's width")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.measure:
        measure(*opts.measure, opts.calls, opts.repeat, opts.instructions, opts.batch,
                opts.width)
        return
    unknown = set(opts.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"no workload {', '.join(sorted(unknown))}: choose from "
                     f"{', '.join(WORKLOADS)}")
    opts.workloads = opts.workloads or list(WORKLOADS)
    if opts.instructions:
        instruction_table(opts)
    else:
        wall_table(opts)


if __name__ == "__main__":
    main()
