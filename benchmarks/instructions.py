"""Tracer overhead per op in CPU instructions, which do not drift with the machine's load.

    python benchmarks/instructions.py [WORKLOAD ...]

Wall times on a shared machine swing by tens of percent between runs (benchmarks/run.py
takes turns and best times to damp that); instruction counts repeat to within about one
percent. This runs each workload of benchmarks/run.py under valgrind's callgrind (which must
be installed: `apt install valgrind`), plain, under the bare forwarding dispatch mode and
under memcpy-doctor (host tensors, and the simulated GPU, each end to end: tracing, then the
trace and its report; and host tracing with the Python version of the producer table, which
an install without a C compiler runs), and prints each mode's instructions per aten op beyond
the plain run and the ratio to the bare mode's. Instructions are not time (a cache miss costs
more than an add), but the tracer's overhead is interpreter work, which they follow closely.

These modes trace with the trace's ordered timeline past its bound from the first op
(`timeline_events=0`): what every op costs once the run's first events are kept, a run's
steady state. What keeping an event costs is measured apart, on the simulated GPU with the
default bound, which keeps every op of these workloads: the instructions each kept event adds,
a cost per run (at most the bound's events), like the end of a run.

Each part runs inside a different C iterator of itertools (starmap, filterfalse, dropwhile,
takewhile, accumulate, compress, pairwise, zip_longest, groupby), which nothing else here
uses, so callgrind's --toggle-collect counts each part's instructions alone: the tracing of
memcpy-doctor's modes, and apart from it the end of their runs (the trace built, then its
report), a cost per run rather than per op. A first, uncounted round warms every mode up.
About 5 minutes per workload on a 2-core machine.
"""

from __future__ import annotations

import argparse
import itertools
from inspect import signature
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
#: The iterator each part runs in, in the order they run: the plain and bare modes, and the
#: tracing and the end of memcpy-doctor's runs.
TOGGLES = {"plain": "starmap_next", "bare": "filterfalse_next",
           "memcpy-doctor (host)": "dropwhile_next", "memcpy-doctor (sim)": "takewhile_next",
           "end (host)": "accumulate_next", "end (sim)": "compress_next",
           "host, Python table": "pairwise_next", "sim, timeline kept": "zip_longest_next",
           "end (sim, timeline kept)": "groupby_next"}
#: Iterations per workload: fewer than benchmarks/run.py's, as callgrind runs 50x slower.
ITERS = {"small-ops": 1000, "transformer": 8, "generate": 100}


def measure(workload: str) -> None:
    """Run inside callgrind: every mode once uncounted, then once each inside its iterator."""
    import torch

    import memcpy_doctor
    from memcpy_doctor.tracer import collector
    from memcpy_doctor.tracer.producers import PyProducerTable
    sys.path.insert(0, str(HERE))
    import run as bench

    torch.set_num_threads(1)
    fn, _ = bench.WORKLOADS[workload]
    iters = ITERS[workload]

    def plain(*_):
        fn("cpu", iters)

    def bare(*_):
        with bench.Forwarding():
            fn("cpu", iters)

    def traced(device, table=None, kept=False):
        """The two parts of a memcpy-doctor run: start and trace; end (trace and report).
        With `table`, the tracer's producer table is that class; with `kept`, the trace's
        timeline has its default bound (else none: every op past it)."""
        # (a package older than the timeline has none: its profiler takes no bound)
        bounded = "timeline_events" in signature(memcpy_doctor.profiler).parameters
        run = memcpy_doctor.profiler(device="sim", **(
            {"timeline_events": 0} if bounded and not kept else {}))
        started = []

        def start_and_trace(*_):
            compiled = collector.ProducerTable
            collector.ProducerTable = table or compiled
            try:
                started.append(run.__enter__())
            finally:
                collector.ProducerTable = compiled
            fn(device, iters)

        def end(*_):
            run.__exit__(None, None, None)
            started.pop().report()

        return start_and_trace, end

    host, host_end = traced("cpu")
    sim, sim_end = traced("cuda")
    py_host, py_host_end = traced("cpu", PyProducerTable)
    kept, kept_end = traced("cuda", kept=True)
    for part in (plain, bare, host, host_end, sim, sim_end, py_host, py_host_end, kept,
                 kept_end):
        part()
    host, host_end = traced("cpu")
    sim, sim_end = traced("cuda")
    py_host, py_host_end = traced("cpu", PyProducerTable)
    kept, kept_end = traced("cuda", kept=True)
    list(itertools.starmap(plain, [()]))
    list(itertools.filterfalse(bare, [0]))
    list(itertools.dropwhile(host, [0]))
    list(itertools.accumulate([0, 0], host_end))
    list(itertools.takewhile(lambda _: sim(), [0]))
    list(itertools.compress((sim_end() for _ in [0]), [1]))
    list(itertools.pairwise(py_host() if i == 0 else None for i in range(2)))
    py_host_end()
    list(itertools.zip_longest(kept() for _ in [0]))
    list(itertools.groupby([0], key=lambda _: kept_end()))
    print(bench.count_ops(fn, iters))


def parse_counts(annotated: str) -> dict[str, int]:
    """Instructions inside each toggled iterator function, from `callgrind_annotate
    --inclusive=yes` output (lines like "  1,234 (5.00%)  .../itertoolsmodule.c:starmap_next
    [...]", with or without the library in brackets; "???:" where Python was built without
    debug information)."""
    counts = {}
    names = "|".join(TOGGLES.values())
    for line in annotated.splitlines():
        found = re.match(rf"\s*([\d,]+) .*:({names})(\s|$)", line)
        if found:  # the largest: inlined parts are listed again under their header files
            name, value = found.group(2), int(found.group(1).replace(",", ""))
            counts[name] = max(value, counts.get(name, 0))
    return counts


def run_counted(argv: list[str], toggles: list[str], what: str) -> tuple[dict[str, int], str]:
    """Run `argv` under callgrind, counting only inside the functions `toggles` (of TOGGLES'
    iterators); the instructions counted in each, and the run's stdout. Exits with its
    stderr's end when the run fails (`what` names it)."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = str(pathlib.Path(tmp) / "callgrind.out")
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                   f"--callgrind-out-file={out_file}"]
        command += [f"--toggle-collect={fn}" for fn in toggles]
        # one string hash seed for every run: dict and set layouts, and so the probes of
        # their look-ups, change with it (about 1% of the bare mode's count between runs)
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command + argv, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            sys.exit(f"{what}: the run under callgrind failed:\n{done.stderr[-2000:]}")
        # --threshold=100: by default only the functions that make up 99% of the count are
        # listed, and the end of a run can be less than the other 1%.
        annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                                    "--auto=no", out_file],
                                   capture_output=True, text=True, check=True).stdout
    return parse_counts(annotated), done.stdout


def count(workload: str) -> None:
    counts, stdout = run_counted([sys.executable, __file__, "--measure", workload],
                                 list(TOGGLES.values()), workload)
    ops = int(stdout.split()[-1])
    plain = counts[TOGGLES["plain"]]
    bare = counts[TOGGLES["bare"]] - plain
    print(f"\n{workload}: {ops} aten ops per run; instructions per op (every op past the "
          "timeline's bound)")
    print(f"  {'mode':<24}{'total':>10}{'overhead':>10}{'x bare overhead':>17}")
    for mode in ("plain", "bare", "memcpy-doctor (host)", "memcpy-doctor (sim)"):
        over = counts[TOGGLES[mode]] - plain
        print(f"  {mode:<24}{counts[TOGGLES[mode]] / ops:10.0f}{over / ops:10.0f}"
              f"{over / bare:17.3f}")
    over = counts[TOGGLES["host, Python table"]] - plain
    print(f"  {'(host, Python table)':<24}{counts[TOGGLES['host, Python table']] / ops:10.0f}"
          f"{over / ops:10.0f}{over / bare:17.3f}  (an install without a C compiler)")
    for where in ("host", "sim"):
        end = counts[TOGGLES[f"end ({where})"]]
        whole = counts[TOGGLES[f"memcpy-doctor ({where})"]] - plain + end
        print(f"  end of the {where} run (trace and report): {end / 1e6:.1f} M instructions, "
              f"{end / ops:.0f} per op of this run; end to end {whole / bare:.3f}x bare")
    kept = counts[TOGGLES["sim, timeline kept"]] - counts[TOGGLES["memcpy-doctor (sim)"]]
    kept_end = counts[TOGGLES["end (sim, timeline kept)"]] - counts[TOGGLES["end (sim)"]]
    print(f"  the timeline, every op kept (sim): {kept / ops:.0f} instructions per kept event "
          f"while tracing, {kept_end / ops:.0f} more at the end; a run keeps at most "
          "the bound's events")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"of {', '.join(ITERS)} (default: all)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    unknown = set(opts.workloads) - set(ITERS)
    if unknown:
        parser.error(f"no workload {', '.join(sorted(unknown))}: choose from {', '.join(ITERS)}")
    if opts.measure:
        measure(opts.measure)
        return
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: install valgrind (apt install valgrind)")
    for workload in opts.workloads or ITERS:
        count(workload)


if __name__ == "__main__":
    main()
