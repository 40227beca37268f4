"""What `profile --light` costs and whether it finds the full tracer's syncs (issue 32).

    python benchmarks/light_overhead.py [--device cuda|sim] [--iters N] [--repeats R]
    python benchmarks/light_overhead.py --instructions

Three checks:

- sites: each program of sample_models/ run in this process under the full tracer and under
  light mode on the device; the syncs per (site, thread, direction) must be equal
  (analysis/compare.py `sync_sites`).
- wall: a GPU-bound loop (a 4096x4096 matmul per step, a `.item()` every 10th step) run
  plain, under light mode and under the full tracer, the best of --repeats each; the goal is
  light within 1.05x of plain. On `--device sim` (a machine without a GPU) the loop is small
  and the plain run is the same loop on host tensors: the figures only show that the
  plumbing works.
- --instructions (valgrind's callgrind, host tensors): CPU instructions per op of a loop of
  small ops that do not sync, plain and with light mode's hooks installed (the warnings
  filter and the wrapped calls of a real GPU's light mode; sync-debug mode itself needs a
  GPU); the goal is within 1% of plain. Also per call of three wrapped entry points that
  do not cross between host and device (`copy_`, `.to(dtype)`, `.item()` of host tensors):
  what the wrapper's look at its arguments costs.

Prints a table per check and one JSON line (`light_overhead: {...}`) for benchmarks/gpu_run.sh,
which keeps its output in log.txt. Exit status 1 when the sites differ.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import shutil
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
SAMPLES = HERE.parent / "sample_models"
SAMPLE_ARGS = {"shape_slice_crop": []}  # the others: --steps 5
SMALL_OPS_ITERS = 2000  # x3 ops, under callgrind
CALL_ITERS = 1000  # of each wrapped call


def sites(device: str) -> list[dict]:
    """Each sample under both tracers: its syncs per site, and whether they are equal."""
    from memcpy_doctor.analysis.compare import sync_sites
    from memcpy_doctor.run.runner import run_script
    from memcpy_doctor.tracer import Tracer
    from memcpy_doctor.tracer.light import LightTracer

    rows = []
    for path in sorted(SAMPLES.glob("*.py")):
        args = SAMPLE_ARGS.get(path.stem, ["--steps", "5"])
        found = {}
        for kind, tracer in (("full", Tracer(device=device)),
                             ("light", LightTracer(device=device))):
            result = run_script(str(path), args, tracer)
            found[kind] = {f"{s.file if s else None}:{s.line if s else 0} {d}"
                           f"{'' if t is None else ' [' + t + ']'}": n
                           for (s, t, d), n in sync_sites(result.trace).items()}
            found[kind + "_status"] = result.exit_status
        rows.append({"program": path.stem, "full": found["full"], "light": found["light"],
                     "equal": found["full"] == found["light"] and not found["full_status"]
                     and not found["light_status"]})
    return rows


def gpu_loop(device: str, steps: int, size: int) -> None:
    import torch
    a = torch.randn(size, size, device=device)
    for i in range(steps):
        b = a @ a
        if i % 10 == 9:
            b[0, 0].item()
    if device == "cuda":
        torch.cuda.synchronize()


def wall(device: str, steps: int, repeats: int) -> dict:
    """Best wall seconds of the loop plain, light and full; ratios to plain."""
    from memcpy_doctor.tracer import Tracer
    from memcpy_doctor.tracer.light import LightTracer

    size = 4096 if device == "cuda" else 256
    plain_device = "cuda" if device == "cuda" else "cpu"
    gpu_loop(plain_device, 3, size)  # warm up: CUDA context, cuBLAS handles
    best = {"plain": float("inf"), "light": float("inf"), "full": float("inf")}
    for _ in range(repeats):  # modes in turns, so that a slow spell hits them all
        for mode in best:
            if mode == "plain":
                t0 = time.perf_counter()
                gpu_loop(plain_device, steps, size)
            else:
                tracer = (LightTracer if mode == "light" else Tracer)(device=device)
                tracer.start()
                t0 = time.perf_counter()
                try:
                    gpu_loop("cuda", steps, size)
                finally:
                    elapsed = time.perf_counter() - t0
                    tracer.stop()
                best[mode] = min(best[mode], elapsed)
                continue
            best[mode] = min(best[mode], time.perf_counter() - t0)
    return {"device": device, "steps": steps, "size": size, **{f"{k}_s": v
                                                             for k, v in best.items()},
            "light_x_plain": best["light"] / best["plain"],
            "full_x_plain": best["full"] / best["plain"]}


# ----- instructions (callgrind) -----

def _small_ops(n: int) -> None:
    import torch
    x = torch.ones(64)
    for _ in range(n):
        y = x + 1
        y = y * 2
        y.relu_()


def _copies(n: int) -> None:
    import torch
    src, dst = torch.ones(64), torch.empty(64)
    for _ in range(n):
        dst.copy_(src)


def _to_dtype(n: int) -> None:
    import torch
    x = torch.ones(64)
    for _ in range(n):
        x.to(torch.float64)


def _items(n: int) -> None:
    import torch
    x = torch.ones(())
    for _ in range(n):
        x.item()


#: What is counted, each plain and with light mode's hooks: (name, loop, calls per loop).
PARTS = (("op", lambda: _small_ops(SMALL_OPS_ITERS), 3 * SMALL_OPS_ITERS),
         ("copy_", lambda: _copies(CALL_ITERS), CALL_ITERS),
         ("to(dtype)", lambda: _to_dtype(CALL_ITERS), CALL_ITERS),
         ("item", lambda: _items(CALL_ITERS), CALL_ITERS))


def _in_iterator(k: int, part) -> None:
    """Run `part` inside the k-th of benchmarks/instructions.py's TOGGLES iterators."""
    runs = (lambda: list(itertools.starmap(part, [()])),
            lambda: list(itertools.filterfalse(lambda _: part(), [0])),
            lambda: list(itertools.dropwhile(lambda _: part(), [0])),
            lambda: list(itertools.takewhile(lambda _: part(), [0])),
            lambda: list(itertools.accumulate([0, 0], lambda *_: part())),
            lambda: list(itertools.compress((part() for _ in [0]), [1])),
            lambda: list(itertools.pairwise(part() if i == 0 else None for i in range(2))),
            lambda: list(itertools.zip_longest(part() for _ in [0])))
    runs[k]()


def measure() -> None:
    """Inside callgrind: each part once uncounted, then inside its own itertools iterator
    (benchmarks/instructions.py's scheme), plain and with the hooks of light mode on a real
    GPU installed (its warnings filter and every wrapped call; sync-debug mode itself needs
    a GPU). The hooks are installed and removed outside the counted parts: what is counted
    is what an op or a call costs while light mode runs."""
    import torch

    from memcpy_doctor.tracer.light import LightHooks
    torch.set_num_threads(1)
    for _, part, _ in PARTS:
        part()
        with LightHooks():
            part()
    for i, (_, part, _) in enumerate(PARTS):
        _in_iterator(2 * i, part)
        with LightHooks():
            _in_iterator(2 * i + 1, part)


def instructions() -> dict:
    sys.path.insert(0, str(HERE))
    from instructions import TOGGLES, run_counted
    names = list(TOGGLES.values())[:2 * len(PARTS)]  # (measure's parts, in its order)
    counts, _ = run_counted([sys.executable, __file__, "--measure"], names, "light overhead")
    found = {}
    for i, (what, _, calls) in enumerate(PARTS):
        plain, light = counts[names[2 * i]] / calls, counts[names[2 * i + 1]] / calls
        found[what] = {"calls": calls, "plain": plain, "light": light, "added": light - plain,
                       "added_pct": (light - plain) / plain * 100}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "sim"), default=None,
                        help="default: cuda where torch sees a GPU, else sim")
    parser.add_argument("--iters", type=int, default=200, help="steps of the GPU loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--instructions", action="store_true",
                        help="count CPU instructions per op under callgrind instead")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.measure:
        measure()
        return
    if opts.instructions:
        if shutil.which("valgrind") is None:
            sys.exit("valgrind not found: install valgrind (apt install valgrind)")
        found = instructions()
        print("instructions per call, plain and with light mode's hooks (host tensors):")
        for what, row in found.items():
            print(f"  {what:<10} ({row['calls']} calls) plain {row['plain']:.0f}, light "
                  f"{row['light']:.0f}, added {row['added']:.1f} ({row['added_pct']:.2f}%)")
        print("light_overhead: " + json.dumps({"instructions": found}))
        return
    import torch
    device = opts.device or ("cuda" if torch.cuda.is_available() else "sim")
    rows = sites(device)
    print(f"sync sites, full tracer vs light mode ({device}):")
    for row in rows:
        print(f"  {row['program']:<20} full {sum(row['full'].values()):>4} syncs at "
              f"{len(row['full'])} sites, light {sum(row['light'].values()):>4} at "
              f"{len(row['light'])}: {'equal' if row['equal'] else 'DIFFERENT'}")
        if not row["equal"]:
            print(f"    full:  {row['full']}\n    light: {row['light']}")
    timing = wall(device, opts.iters, opts.repeats)
    print(f"wall time of the loop ({timing['steps']} steps, {timing['size']}^2 matmul, best of "
          f"{opts.repeats}): plain {timing['plain_s']:.3f} s, light {timing['light_s']:.3f} s "
          f"({timing['light_x_plain']:.3f}x), full {timing['full_s']:.3f} s "
          f"({timing['full_x_plain']:.3f}x)" + ("" if device == "cuda" else
                                                 "  [sim: plumbing only, not a measurement]"))
    print("light_overhead: " + json.dumps({"sites": rows, "wall": timing}))
    sys.exit(0 if all(r["equal"] for r in rows) else 1)


if __name__ == "__main__":
    main()
