"""Host time per CUDA op with PyTorch's GPU trace callbacks on and off (issue 23, item 6).

    python benchmarks/gpu_trace_cost.py [-n 20000] [--repeats 5] [--json FILE]  # needs a GPU

`--device cuda` calls `torch._C._activate_gpu_trace()`, which cannot be undone: from then on
every CUDA event, allocator malloc and free, stream and sync in the process calls into Python
(an empty callback list once the tracer has stopped). This measures what that costs a program:
each side runs in a child process of its own, "off" never activating, "on" activating first
and registering nothing, as a process is after a `memcpy_doctor.profiler(device="cuda")`
session. The children run off, on, off, on, and each side keeps its best figure per workload.

Workloads, each N ops on a 256-element float32 CUDA tensor, host time only (the launches, not
the kernels: the device is synchronized before the clock starts, not before it stops):

- `add_`:  `x.add_(1)`, a kernel launch that allocates nothing;
- `add`:   `x + 1`, a launch and a tensor from the caching allocator, freed at once (malloc
  and free callbacks when on);
- `event`: `torch.cuda.Event()` then `.record()`, what the tracer does around an op (event
  creation and record callbacks when on).

Prints one line per workload and writes JSON with `--json`. Exit status 2, with one line,
where torch sees no CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _workloads():
    import torch

    x = torch.zeros(256, device="cuda")

    def add_(n: int) -> None:
        for _ in range(n):
            x.add_(1)

    def add(n: int) -> None:
        for _ in range(n):
            x + 1

    def event(n: int) -> None:
        for _ in range(n):
            torch.cuda.Event().record()

    return {"add_": add_, "add": add, "event": event}


def child(mode: str, n: int, repeats: int) -> dict[str, int]:
    """Best host ns per op of each workload in this process, trace callbacks `mode`."""
    import torch

    if mode == "on":
        torch._C._activate_gpu_trace()  # the switch --device cuda flips, here with no callback
    best: dict[str, int] = {}
    for name, fn in _workloads().items():
        fn(min(n, 1000))  # warm up: the allocator's blocks, the kernels loaded
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter_ns()
            fn(n)
            ns = (time.perf_counter_ns() - start) // n
            best[name] = min(best.get(name, ns), ns)
    torch.cuda.synchronize()
    return best


def measure(n: int, repeats: int, rounds: int = 2) -> dict:
    """Both sides, each in `rounds` children taken alternately; the best per workload."""
    sides: dict[str, dict[str, int]] = {"off": {}, "on": {}}
    for _ in range(rounds):
        for mode in ("off", "on"):
            done = subprocess.run([sys.executable, __file__, "--child", mode, "-n", str(n),
                                   "--repeats", str(repeats)], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"child {mode} exited {done.returncode}: "
                                   f"{done.stderr[-2000:]}")
            for name, ns in json.loads(done.stdout).items():
                sides[mode][name] = min(sides[mode].get(name, ns), ns)
    return {
        "ops_per_run": n, "repeats": repeats, "rounds": rounds,
        "ns_per_op": sides,
        "extra_ns_per_op": {k: sides["on"][k] - sides["off"][k] for k in sides["off"]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20_000, help="ops per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per workload")
    parser.add_argument("--json", metavar="FILE", default=None)
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_trace_cost: error: needs a CUDA GPU (torch sees none here)", file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps(child(args.child, args.n, args.repeats)))
        return 0
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              **measure(args.n, args.repeats)}
    off, on = result["ns_per_op"]["off"], result["ns_per_op"]["on"]
    print(f"host ns per op, GPU trace callbacks off -> on ({result['gpu']}, "
          f"torch {result['torch']}, best of {2 * args.repeats} runs of {args.n:,} ops):")
    for name in off:
        print(f"  {name:6} {off[name]:>8,} -> {on[name]:>8,}  ({on[name] - off[name]:+,})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
