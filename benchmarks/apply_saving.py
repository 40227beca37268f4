"""How close explain's estimated saving comes to what a re-profile with the edit applied shows.

    python benchmarks/apply_saving.py [--runs 5] [--iters 200] [SCRIPT]

Profiles SCRIPT (default: sample_models/shape_slice_crop.py) on the simulated GPU, takes the
top suggestion, re-profiles with it applied (`--apply`), RUNS times each, and prints the
estimate next to the medians of the measured changes: total time, computation time, and the
host time of the copies and ops the edit touches. On the simulated GPU every figure is modeled
(docs/sim-time.md), so the runs agree; the estimate also counts device_guard's own cost on a
real GPU, which the simulated re-profile leaves out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from memcpy_doctor.analysis.attribution import explain
from memcpy_doctor.analysis.rules import suggest
from memcpy_doctor.run.apply import GuardEdit
from memcpy_doctor.run.runner import run_script
from memcpy_doctor.core.trace import Trace
from memcpy_doctor.tracer import Tracer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def profile(script: str, args: list[str], edits: list[GuardEdit] | None) -> Trace:
    devnull = open(os.devnull, "w")
    saved = sys.stdout
    sys.stdout = devnull
    try:
        return run_script(script, args, Tracer(device="sim"), edits).trace
    finally:
        sys.stdout = saved
        devnull.close()


def touched_ns(trace: Trace, sites: set[tuple[str, int]]) -> int:
    """Host time of sync copies plus all time of the ops at the edited sites."""
    copies = sum(c.host_ns for c in trace.copies if c.sync)
    ops = sum(o.host_ns + o.device_ns for o in trace.ops
              if o.site is not None and (o.site.file, o.site.line) in sites)
    return copies + ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", nargs="?",
                        default=os.path.join(ROOT, "sample_models", "shape_slice_crop.py"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--iters", type=int, default=200)
    opts = parser.parse_args()
    args = ["--iters", str(opts.iters)]
    first = profile(opts.script, args, None)
    top = suggest(first, explain(first))[0]
    edits = [GuardEdit(s["file"], s["line"], top.apply["device"]) for s in top.apply["sites"]]
    sites = {(e.file, e.line) for e in edits}
    deltas: dict[str, list[int]] = {"total": [], "computation": [], "touched": []}
    for _ in range(opts.runs):
        before = profile(opts.script, args, None)
        after = profile(opts.script, args, edits)
        deltas["total"].append(before.summary.total_ns - after.summary.total_ns)
        deltas["computation"].append(before.summary.computation_ns
                                     - after.summary.computation_ns)
        deltas["touched"].append(touched_ns(before, sites) - touched_ns(after, sites))
    print(f"script: {os.path.relpath(opts.script)} {' '.join(args)}; top suggestion: "
          f"{top.title}")
    print(f"estimated saving          {top.saving_ns / 1e6:8.3f} ms")
    for name, values in deltas.items():
        med = statistics.median(values)
        spread = f"{min(values) / 1e6:.3f}..{max(values) / 1e6:.3f}"
        ratio = top.saving_ns / med if med else float("nan")
        print(f"measured change, {name:<11} {med / 1e6:8.3f} ms (median of {opts.runs}; "
              f"{spread}); estimate/measured {ratio:.2f}")


if __name__ == "__main__":
    main()
