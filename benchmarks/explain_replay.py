"""How long `explain` takes on the trace of a large run, with the replay that prices each
suggestion (analysis/replay.py) and without it: issue 40 asks that the replay not make
explain on the trace of a million-op run slower than 1 s.

    python benchmarks/explain_replay.py [--ops 1000000] [--timeline-events 10000]
                                        [--repeats 3] [--keep PATH]

Profiles (on the simulated GPU) a training-like loop of about OPS ops: each step a few
kernels, a host->device upload and two reads to the host, so explain has suggestions to
price. Then, in this process, loads the trace and runs what `memcpy-doctor explain` runs
(explain, suggest, the joint replay, the text), best of --repeats, with the trace's timeline
and with it removed (the rules' upper bounds alone), and prints both and the difference.
--timeline-events is `profile --timeline-events` (the replay's window): the default is what
users get.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import textwrap
import time

PROGRAM = textwrap.dedent("""\
    import torch
    w = torch.randn(64, 64, device="cuda")
    total = 0.0
    for step in range({steps}):
        x = torch.randn(32, 64).to("cuda")
        y = x @ w
        y = torch.relu(y)
        y = y * 2 + 1
        loss = y.mean()
        total += loss.item()
        if loss > 1e9:
            break
    print(total)
""")
OPS_PER_STEP = 7  # (randn, mm, relu, mul, add, mean, gt: the copies and reads are not ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--timeline-events", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", help="keep the trace at this path (reused when it exists)")
    a = ap.parse_args()

    from memcpy_doctor.analysis.attribution import explain
    from memcpy_doctor.analysis.replay import Replay, joint_saving
    from memcpy_doctor.analysis.rules import suggest
    from memcpy_doctor.core.trace import Trace
    from memcpy_doctor.render.explain import render_explain

    with tempfile.TemporaryDirectory() as tmp:
        path = a.keep or os.path.join(tmp, "trace.json")
        if not os.path.exists(path):
            prog = os.path.join(tmp, "loop.py")
            with open(prog, "w") as f:
                f.write(PROGRAM.format(steps=a.ops // OPS_PER_STEP))
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile", "--no-report",
                            "--timeline-events", str(a.timeline_events), "-o", path, prog],
                           check=True, stdout=subprocess.DEVNULL)
            print(f"profiled {a.ops} ops in {time.perf_counter() - t0:.1f} s")
        trace = Trace.load(path)
        ops = sum(o.calls for o in trace.ops)
        kept = len(trace.timeline.events) if trace.timeline else 0
        print(f"trace: {os.path.getsize(path)} bytes, {ops} op calls, {kept} timeline events")

        def run(t: Trace) -> tuple[float, int]:
            best, count = float("inf"), 0
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                exp = explain(t)
                replay = Replay(t)
                found = suggest(t, exp, os.getcwd(), None, [], replay)
                exp.together = joint_saving(t, found, replay)
                render_explain(exp, found, "text", os.getcwd())
                best, count = min(best, time.perf_counter() - t0), len(found)
            return best, count

        with_replay, n = run(trace)
        without, _ = run(dataclasses.replace(trace, timeline=None))
        print(f"explain with the replay:    {with_replay * 1e3:8.1f} ms ({n} suggestions)")
        print(f"explain without a timeline: {without * 1e3:8.1f} ms")
        print(f"the replay adds:            {(with_replay - without) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
