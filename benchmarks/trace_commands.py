"""What a command that reads a saved trace costs end to end: wall time and peak memory of
`memcpy-doctor report|check|explain|diff` on a small trace, each in a fresh process as a CI
gate runs it, against `python -c pass` (issue 33 asks for under 0.2 s on a 15 KB trace).

    python benchmarks/trace_commands.py [--repeat 5] [--trace PATH] [--kineto PATH]

Without --trace, the trace is the hand-built one of tests/helpers.py, saved. With --kineto,
`report` of that torch.profiler trace too (benchmarks/kineto_scale.py --keep PATH writes a
35 MB one with --events 155000). Each figure is the best of --repeat runs, each run measured
in its own intermediate process: the command's wall time, and its peak resident memory
(getrusage of that process's one child). Also says whether the command imported torch (from
`python -X importtime`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _measure(args: list[str], cwd: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of `args`, in a child that runs it once."""
    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL)\n"
            "w = time.perf_counter() - t\n"
            "print(w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)")
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                         text=True, check=True).stdout.split()
    if int(out[2]) not in (0, 1):
        raise SystemExit(f"{' '.join(args)}: exit status {out[2]}")
    return float(out[0]), int(out[1]) / 1024


def _imports_torch(args: list[str], cwd: str) -> bool:
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd,
                          capture_output=True, text=True)
    return any(line.rpartition("|")[2].strip() == "torch" for line in done.stderr.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--trace", metavar="PATH", help="a saved memcpy-doctor trace")
    ap.add_argument("--kineto", metavar="PATH", help="a torch.profiler trace to report too")
    a = ap.parse_args()
    folder = tempfile.mkdtemp()
    trace = a.trace and os.path.abspath(a.trace)
    if trace is None:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from helpers import make_trace
        trace = os.path.join(folder, "trace.json")
        make_trace().save(trace)
    md = [sys.executable, "-m", "memcpy_doctor"]
    runs = {"python -c pass": [sys.executable, "-c", "pass"],
            "report": [*md, "report", trace],
            "check --max sync_calls=100": [*md, "check", trace, "--max", "sync_calls=100"],
            "explain": [*md, "explain", trace],
            "diff": [*md, "diff", trace, trace]}
    if a.kineto:
        runs["report (torch.profiler trace)"] = [*md, "report", os.path.abspath(a.kineto)]
    print(f"trace {os.path.getsize(trace) / 1e3:.1f} KB"
          + (f"; torch.profiler trace {os.path.getsize(a.kineto) / 1e6:.1f} MB"
             if a.kineto else "") + f"; best of {a.repeat}")
    print(f"{'command':32} {'wall (s)':>9} {'peak RSS (MB)':>14}  torch imported")
    for name, args in runs.items():
        best = [_measure(args, folder) for _ in range(a.repeat)]
        wall = min(w for w, _ in best)
        rss = min(r for _, r in best)
        torch = "-" if name.startswith("python") else str(_imports_torch(args[1:], folder))
        print(f"{name:32} {wall:9.3f} {rss:14.0f}  {torch}")


if __name__ == "__main__":
    main()
