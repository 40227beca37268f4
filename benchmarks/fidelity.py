"""Fidelity of the simulated GPU: the same programs profiled on a real GPU and on the simulated
one, side by side.

    python benchmarks/fidelity.py --device-profile CALIBRATED.json   # needs a CUDA GPU
    python benchmarks/fidelity.py --sim-only [--only NAME]...         # sim against sim
    python benchmarks/fidelity.py --subset --jobs 12 --json FILE ...  # what gpu_run.sh runs

Programs: every sample model in sample_models/, the real-library programs of tests/programs/
(transformers, lightning, accelerate, timm, torchmetrics, torchvision; one whose library is not
installed is skipped) and every sync-rule script of tests/test_triggers.py (the sources passed
to `check(...)`, one program per test). Each is run with `memcpy-doctor profile --device cuda`
and with `--device sim --device-profile FILE`, each run in a subprocess of its own folder;
`--jobs N` runs N of them side by side, a program's two together. Per program the table
gives the sync copy calls and bytes (must be equal), the host waits (must be equal), total and
memcpy time with the ratio sim/real (the goal is within 25%), and every copy or wait path
(direction, sync, trigger, file:line) present in one run and missing from the other, or
present in both with different call counts. `--json FILE` writes the same, and each run's
wall time, exit status and error, as data; `--keep DIR` keeps every run's trace.

Exit status: 0 when every program that ran agrees, 1 when any differ or a run failed (no trace,
timed out, not started before `--deadline`), 2 for a usage error (no GPU without --sim-only, an
unreadable profile, no program selected), 130 when interrupted (the JSON is written then too).
`--sim-only` runs the simulated GPU on both sides: a smoke test of this script that needs no GPU
(the two must agree exactly).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from memcpy_doctor.core.trace import Trace  # noqa: E402

#: Modeled time within this fraction of the measured one counts as close (issue 7's goal).
TIME_GOAL = 0.25
SAMPLES_DIR = os.path.join(ROOT, "sample_models")
LIBRARY_DIR = os.path.join(ROOT, "tests", "programs")
TRIGGER_TESTS = os.path.join(ROOT, "tests", "test_triggers.py")
#: The real-library programs and the modules each imports (skipped where one is missing).
LIBRARY_PROGRAMS = {
    "accel.py": ("accelerate",),
    "hf_trainer.py": ("transformers", "accelerate"),
    "lightning_gpu.py": ("lightning",),
    "timm_amp.py": ("timm",),
    "tmetrics.py": ("torchmetrics",),
    "tv_detect.py": ("torchvision",),
    # torch.compile'd programs (issue 31): graphs, graph breaks and their syncs on a GPU
    "compiled_break.py": ("transformers",),
    "compiled_cudagraphs.py": (),
    "compiled_hf.py": ("transformers",),
    "compiled_lightning.py": ("lightning",),
}
#: The compiled programs compile for tens of seconds each: the subset takes one, the one
#: whose graph breaks sync.
_SLOW_TO_COMPILE = ("compiled_cudagraphs.py", "compiled_hf.py", "compiled_lightning.py")
#: `--subset`: what benchmarks/gpu_run.sh compares in its few minutes. Every sample model and
#: library program, and the sync-rule scripts of the paths issue 23 found doubtful: factories
#: with data (3), backward (1), waits below the dispatcher (7), non_blocking copies (8).
SUBSET = (
    "clean_pinned.py", "embedding_l2.py", "item_every_step.py", "shape_slice_crop.py",
    *(name for name in LIBRARY_PROGRAMS if name not in _SLOW_TO_COMPILE),
    "test_explicit_host_to_device", "test_non_blocking_pinned_and_pageable",
    "test_factories_with_data", "test_device_to_host", "test_scalar_reads",
    "test_data_dependent_shapes", "test_host_waits", "test_backward_of_a_transfer_copies_back",
    "test_grad_scaler_step_reads_found_inf",
)
#: One program's run may take this long (seconds) unless --timeout says otherwise.
DEFAULT_TIMEOUT = 300
#: No run starts with less time than this (seconds) before --deadline: `import torch` alone
#: takes seconds, so it could not finish.
MIN_RUN_S = 5


# ----- comparison: pure -----

Path = tuple[str, str, str, str]


@dataclass
class Fidelity:
    """One program's real and simulated runs compared. `paths` map (kind, sync, trigger,
    site) to calls; kind is a copy direction or "wait"."""

    program: str
    sync_calls: tuple[int, int]  # (real, sim)
    sync_bytes: tuple[int, int]
    waits: tuple[int, int]
    total_ns: tuple[int, int]
    memcpy_ns: tuple[int, int]
    only_real: list[tuple[Path, int]] = field(default_factory=list)
    only_sim: list[tuple[Path, int]] = field(default_factory=list)
    calls_differ: list[tuple[Path, int, int]] = field(default_factory=list)

    @property
    def counts_equal(self) -> bool:
        return (self.sync_calls[0] == self.sync_calls[1]
                and self.sync_bytes[0] == self.sync_bytes[1]
                and self.waits[0] == self.waits[1]
                and not (self.only_real or self.only_sim or self.calls_differ))


def ratio(pair: tuple[int, int]) -> float | None:
    """sim / real, None when the real figure is zero."""
    real, sim = pair
    return sim / real if real else None


def paths(trace: Trace) -> Counter:
    """Calls per copy or wait path, sites as file name:line (both runs ran the same file)."""
    found: Counter = Counter()

    def where(site) -> str:
        return f"{os.path.basename(site.file)}:{site.line}" if site is not None else "?"

    for c in trace.copies:
        found[(c.direction, "sync" if c.sync else "async", c.trigger, where(c.site))] += c.calls
    for w in trace.waits:
        found[("wait", "sync", w.kind, where(w.site))] += w.calls
    return found


def compare_runs(program: str, real: Trace, sim: Trace) -> Fidelity:
    """The fidelity row of one program from its real-GPU and simulated traces."""
    def sync(t: Trace) -> tuple[int, int]:
        return (sum(c.calls for c in t.copies if c.sync),
                sum(c.bytes for c in t.copies if c.sync))

    (rc, rb), (sc, sb) = sync(real), sync(sim)
    rp, sp = paths(real), paths(sim)
    return Fidelity(
        program=program, sync_calls=(rc, sc), sync_bytes=(rb, sb),
        waits=(sum(w.calls for w in real.waits), sum(w.calls for w in sim.waits)),
        total_ns=(real.summary.total_ns, sim.summary.total_ns),
        memcpy_ns=(real.summary.memcpy_all.time_ns, sim.summary.memcpy_all.time_ns),
        only_real=sorted((k, n) for k, n in rp.items() if k not in sp),
        only_sim=sorted((k, n) for k, n in sp.items() if k not in rp),
        calls_differ=sorted((k, rp[k], sp[k]) for k in rp if k in sp and rp[k] != sp[k]))


@dataclass
class Problem:
    """A program that was not compared: `status` is "skipped" (a library it needs is not
    installed) or "error" (a run left no trace, timed out or was not started)."""

    program: str
    status: str
    message: str


def render(rows: list[Fidelity], real_label: str = "real",
           problems: list[Problem] | None = None) -> str:
    """The table, one block per program, a line per program not compared, and a last line
    with the verdict."""
    out = []
    for f in rows:
        out.append(f"== {f.program}  [{'counts equal' if f.counts_equal else 'COUNTS DIFFER'}]")
        out.append(f"  {'':18}{real_label:>14}{'sim':>14}{'sim/real':>10}")
        for label, pair, fmt in (("sync copies", f.sync_calls, _count),
                                 ("sync bytes", f.sync_bytes, _count),
                                 ("host waits", f.waits, _count),
                                 ("total ms", f.total_ns, _ms),
                                 ("memcpy ms", f.memcpy_ns, _ms)):
            r = ratio(pair)
            if fmt is _count:
                verdict = "equal" if pair[0] == pair[1] else "DIFFER"
            else:
                verdict = "-" if r is None else f"{r:.2f}" + ("" if abs(r - 1) <= TIME_GOAL
                                                            else " !")
            out.append(f"  {label:18}{fmt(pair[0]):>14}{fmt(pair[1]):>14}{verdict:>10}")
        for title, items in ((f"only in {real_label}", f.only_real), ("only in sim", f.only_sim)):
            for (kind, sync, trigger, site), n in items:
                out.append(f"  {title}: {kind} {sync} {trigger} at {site} (x{n})")
        for (kind, sync, trigger, site), rn, sn in f.calls_differ:
            out.append(f"  calls differ: {kind} {sync} {trigger} at {site}: "
                       f"{real_label} x{rn}, sim x{sn}")
    for p in problems or []:
        out.append(f"== {p.program}  [{p.status.upper()}] {p.message}")
    bad = [f.program for f in rows if not f.counts_equal]
    last = (f"{len(rows)} programs; counts differ in {len(bad)}"
            + (f": {', '.join(bad)}" if bad else ""))
    for status in ("error", "skipped"):
        names = [p.program for p in problems or [] if p.status == status]
        if names:
            last += f"; {len(names)} {status}: {', '.join(names)}"
    out.append(last + f"; '!' marks a time off by more than {TIME_GOAL:.0%}")
    return "\n".join(out) + "\n"


def _count(n: int) -> str:
    return f"{n:,}"


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f}"


def row_json(f: Fidelity) -> dict:
    """One compared program as data: each figure as {real, sim}, times also as their ratio,
    and the paths that differ."""
    def pair(p: tuple[int, int], with_ratio: bool = False) -> dict:
        d: dict = {"real": p[0], "sim": p[1]}
        if with_ratio:
            r = ratio(p)
            d["ratio"] = None if r is None else round(r, 4)
        return d

    def path(k: Path) -> dict:
        return dict(zip(("kind", "sync", "trigger", "site"), k))

    return {
        "program": f.program, "status": "equal" if f.counts_equal else "differ",
        "sync_calls": pair(f.sync_calls), "sync_bytes": pair(f.sync_bytes),
        "waits": pair(f.waits), "total_ns": pair(f.total_ns, True),
        "memcpy_ns": pair(f.memcpy_ns, True),
        "only_real": [{**path(k), "calls": n} for k, n in f.only_real],
        "only_sim": [{**path(k), "calls": n} for k, n in f.only_sim],
        "calls_differ": [{**path(k), "real_calls": r, "sim_calls": s}
                         for k, r, s in f.calls_differ],
    }


def to_json(rows: list[Fidelity], problems: list[Problem], order: list[str],
            runs: dict[str, dict], meta: dict) -> dict:
    """The whole comparison as data, programs in `order`; `runs` holds each program's
    {"real": {...}, "sim": {...}} wall seconds, exit status and error; `meta` the run's
    settings."""
    by_name: dict[str, dict] = {f.program: row_json(f) for f in rows}
    for p in problems:
        by_name[p.program] = {"program": p.program, "status": p.status, "message": p.message}
    programs = []
    for name in order:
        entry = by_name[name]
        if name in runs:
            entry["runs"] = runs[name]
        programs.append(entry)
    counts = Counter(e["status"] for e in programs)
    return {
        "schema_version": 1, **meta, "time_goal": TIME_GOAL,
        "counts": {s: counts.get(s, 0) for s in ("equal", "differ", "error", "skipped")},
        "programs": programs,
    }


def sync_rule_programs(test_file: str = TRIGGER_TESTS) -> list[tuple[str, str]]:
    """(test name, script source) of each `check(tmp_path, \"\"\"...\"\"\", ...)` in the
    sync-rule tests; sources built with an f-string (parametrized) are skipped."""
    with open(test_file, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    programs = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id == "check" and len(call.args) >= 2
                    and isinstance(call.args[1], ast.Constant)
                    and isinstance(call.args[1].value, str)):
                programs.append((node.name, textwrap.dedent(call.args[1].value)))
                break
    return programs


@dataclass(frozen=True)
class Program:
    """A program to compare: a file (`path`), or a script `source` written to `path` (a file
    name) in the run's folder. `needs`: modules it imports that may not be installed."""

    name: str
    path: str
    source: str | None = None
    needs: tuple[str, ...] = ()


def programs() -> list[Program]:
    """Every program: sample models and library programs by path, sync-rule scripts by
    source."""
    found = [Program(name, os.path.join(SAMPLES_DIR, name))
             for name in sorted(os.listdir(SAMPLES_DIR)) if name.endswith(".py")]
    found += [Program(name, os.path.join(LIBRARY_DIR, name), needs=needs)
              for name, needs in LIBRARY_PROGRAMS.items()]
    found += [Program(name, f"{name}.py", source) for name, source in sync_rule_programs()]
    return found


def missing_modules(needs: tuple[str, ...]) -> list[str]:
    """The modules of `needs` that are not installed (found, not imported: importing
    transformers here would cost seconds)."""
    return [m for m in needs if importlib.util.find_spec(m) is None]


def profile_arg(profile: str | None) -> str | None:
    """--device-profile as the children need it: a file as an absolute path (they run in
    other folders), a shipped profile's name as it is (load_profile's rule for which is
    which)."""
    if profile and (os.path.sep in profile or profile.endswith(".json")):
        return os.path.abspath(profile)
    return profile


# ----- running: subprocesses -----

@dataclass
class Run:
    """One `memcpy-doctor profile` subprocess: its trace, or why there is none."""

    trace: Trace | None = None
    exit: int | None = None
    wall_s: float = 0.0
    error: str | None = None
    path: str | None = None  # the trace file, while the run's folder exists

    def as_json(self, device: str) -> dict:
        return {"device": device, "exit": self.exit, "wall_s": round(self.wall_s, 2),
                "error": self.error}


class Runner:
    """Starts profile runs, at most `timeout` seconds each and none after `deadline` (a
    time.monotonic() value); `stop()` kills the running ones and starts no more."""

    def __init__(self, profile: str | None, timeout: float, deadline: float | None,
                 env: dict[str, str]):
        self.profile, self.timeout, self.deadline, self.env = profile, timeout, deadline, env
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self._stopped = False

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for proc in self._procs:
                proc.kill()

    def run(self, script: str, device: str, workdir: str) -> Run:
        """Profile `script` on `device` in `workdir` and load its trace."""
        timeout = self.timeout
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left < MIN_RUN_S:
                return Run(error=f"not started: under {MIN_RUN_S} s before the deadline")
            timeout = min(timeout, left)
        os.makedirs(workdir, exist_ok=True)
        out = os.path.join(workdir, "trace.json")
        cmd = [sys.executable, "-m", "memcpy_doctor", "profile", "--device", device, "-o", out]
        if self.profile and device == "sim":
            cmd += ["--device-profile", self.profile]
        start = time.monotonic()
        with self._lock:
            if self._stopped:
                return Run(error="not started: interrupted")
            proc = subprocess.Popen(cmd + [script], cwd=workdir, env=self.env, text=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self._procs.add(proc)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return Run(exit=proc.returncode, wall_s=time.monotonic() - start,
                       error=f"timed out after {timeout:.0f} s")
        finally:
            with self._lock:
                self._procs.discard(proc)
        run = Run(exit=proc.returncode, wall_s=time.monotonic() - start, path=out)
        if self._stopped:
            run.error = "interrupted"
        elif not os.path.exists(out):
            run.error = f"no trace (exit {proc.returncode}): {err[-2000:]}"
        else:
            try:
                run.trace = Trace.load(out)
            except Exception as e:  # a trace cut short: the run's failure, not the script's
                run.error = f"unreadable trace (exit {proc.returncode}): {e}"
        return run


def child_env(jobs: int) -> dict[str, str]:
    """The children's environment: this checkout first on PYTHONPATH (the package need not be
    installed), and the CPU shared out between the runs side by side unless
    OMP_NUM_THREADS is set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "")
                                                  .split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    return env


def run_programs(progs: list[Program], runner: Runner, real_device: str, jobs: int,
                 workdir: str) -> dict[str, dict[str, Run]]:
    """Both runs of every program, {"real": Run, "sim": Run} by name. With jobs > 1 a
    program's two runs go side by side, jobs // 2 programs at a time (so the GPU holds half
    of the runs at most, and a --deadline cuts whole programs); the library programs, the
    slowest, start first."""
    results: dict[str, dict[str, Run]] = {p.name: {} for p in progs}
    for p in progs:
        if p.source is not None:
            os.makedirs(os.path.join(workdir, p.name), exist_ok=True)
            with open(os.path.join(workdir, p.name, p.path), "w", encoding="utf-8") as f:
                f.write(p.source)
    order = sorted(progs, key=lambda p: not p.needs)  # stable: else in the given order
    pairs = max(1, jobs // 2)
    with ThreadPoolExecutor(pairs) as real_pool, ThreadPoolExecutor(pairs) as sim_pool:
        futures = []
        for p in order:
            script = p.path if p.source is None else os.path.join(workdir, p.name, p.path)
            real = partial(runner.run, script, real_device, os.path.join(workdir, p.name, "real"))
            sim = partial(runner.run, script, "sim", os.path.join(workdir, p.name, "sim"))
            pair = real_pool.submit(_both, real, sim, sim_pool if jobs > 1 else None)
            futures.append((p.name, pair))
        try:
            for name, fut in futures:
                results[name]["real"], results[name]["sim"] = fut.result()
        except KeyboardInterrupt:
            runner.stop()
            for name, fut in futures:
                results[name]["real"], results[name]["sim"] = fut.result()
            raise Interrupted(results) from None
    return results


def _both(real: Callable[[], Run], sim: Callable[[], Run],
          sim_pool: ThreadPoolExecutor | None) -> tuple[Run, Run]:
    """A program's real and sim runs: side by side (the sim one in `sim_pool`), or one after
    the other without a pool."""
    if sim_pool is None:
        return real(), sim()
    sim_run = sim_pool.submit(sim)
    return real(), sim_run.result()


class Interrupted(Exception):
    """Ctrl-C (or `timeout -s INT`) while programs ran: the runs as far as they got."""

    def __init__(self, results: dict[str, dict[str, Run]]):
        super().__init__("interrupted")
        self.results = results


def compare_all(progs: list[Program], results: dict[str, dict[str, Run]]
                ) -> tuple[list[Fidelity], list[Problem]]:
    rows, problems = [], []
    for p in progs:
        runs = results.get(p.name, {})
        real, sim = runs.get("real"), runs.get("sim")
        if real and sim and real.trace is not None and sim.trace is not None:
            rows.append(compare_runs(p.name, real.trace, sim.trace))
        else:
            why = "; ".join(f"{side}: {r.error}" for side, r in runs.items() if r.error)
            problems.append(Problem(p.name, "error", why or "not run"))
    return rows, problems


def keep(results: dict[str, dict[str, Run]], folder: str) -> None:
    """Copy every trace a run left to `folder` (made if missing)."""
    os.makedirs(folder, exist_ok=True)
    for name, by_side in results.items():
        for side, r in by_side.items():
            if r.trace is not None and r.path:
                shutil.copyfile(r.path, os.path.join(folder, f"{name}.{side}.json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-profile", metavar="NAME|FILE", default=None,
                        help="profile of the simulated GPU (the calibrated one; default: "
                             "the shipped default)")
    parser.add_argument("--sim-only", action="store_true",
                        help="simulated GPU on both sides (no GPU needed; must agree)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run the programs whose name contains NAME (repeatable)")
    parser.add_argument("--subset", action="store_true",
                        help="the programs gpu_run.sh compares (SUBSET in this file)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="runs side by side (default 1)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds one run may take (default {DEFAULT_TIMEOUT})")
    parser.add_argument("--deadline", type=float, default=None, metavar="S",
                        help="start no run, and stop each, after S seconds from now")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="write the comparison and each run's status as JSON")
    parser.add_argument("--keep", metavar="DIR", default=None,
                        help="keep each run's trace as DIR/PROGRAM.real.json and .sim.json")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    from memcpy_doctor.core.costmodel import ProfileError, load_profile
    profile = profile_arg(args.device_profile)
    try:
        load_profile(profile)
    except ProfileError as e:
        print(f"fidelity: error: {e}", file=sys.stderr)
        return 2
    import torch
    if not args.sim_only and not torch.cuda.is_available():
        print("fidelity: error: needs a CUDA GPU (torch sees none here); --sim-only "
              "compares the simulated GPU with itself", file=sys.stderr)
        return 2
    chosen = [p for p in programs()
              if (not args.only or any(o in p.name for o in args.only))
              and (not args.subset or p.name in SUBSET)]
    if not chosen:
        print(f"fidelity: error: no program matches {args.only}"
              + (" in the subset" if args.subset else ""), file=sys.stderr)
        return 2
    skipped = [Problem(p.name, "skipped", f"needs {', '.join(missing)}")
               for p in chosen if (missing := missing_modules(p.needs))]
    to_run = [p for p in chosen if p.name not in {s.program for s in skipped}]
    deadline = None if args.deadline is None else started + args.deadline
    runner = Runner(profile, args.timeout, deadline, child_env(args.jobs))
    status = None
    with tempfile.TemporaryDirectory(prefix="memcpy-doctor-fidelity-") as tmp:
        try:
            results = run_programs(to_run, runner, "sim" if args.sim_only else "cuda",
                                   args.jobs, tmp)
        except Interrupted as e:
            results, status = e.results, 130
        if args.keep:
            keep(results, args.keep)
    rows, problems = compare_all(to_run, results)
    problems += skipped
    real_label = "sim#1" if args.sim_only else "real"
    sys.stdout.write(render(rows, real_label, problems))
    if args.json:
        real_device = "sim" if args.sim_only else "cuda"
        runs = {name: {side: r.as_json(real_device if side == "real" else "sim")
                       for side, r in by_side.items()} for name, by_side in results.items()}
        meta = {"real_label": real_label, "real_device": real_device,
                "device_profile": profile, "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name() if not args.sim_only else None,
                "jobs": args.jobs, "timeout_s": args.timeout,
                "wall_s": round(time.monotonic() - started, 2)}
        doc = to_json(rows, problems, [p.name for p in chosen], runs, meta)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if status is not None:
        return status
    return 0 if all(f.counts_equal for f in rows) and not any(
        p.status == "error" for p in problems) else 1


if __name__ == "__main__":
    sys.exit(main())
