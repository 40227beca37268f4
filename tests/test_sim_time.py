"""Time on the simulated GPU is modeled, host side included (docs/sim-time.md): exact figures
for a small program, the same trace on every run, and the article's before/after through the
CLI (the total falls by at least the sync time removed; a time gate at 0% holds)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import memcpy_doctor
from helpers import concurrently
from memcpy_doctor.core.costmodel import load_profile

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "shape_slice_crop.py"
#: A program the other tests do not run: a model, an optimizer, a loss read every step.
HELD_OUT = """
import torch
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model.to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(8, 16).to(dev)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if loss.item() < 0:
        break
print(round(loss.item(), 4))
"""


def test_a_small_program_costs_exactly_what_the_model_says():
    p = load_profile()
    with memcpy_doctor.profiler(device="sim") as prof:
        a = torch.ones(4)                       # a host op: 16 bytes written
        a.view(2, 2)                            # no kernel
        x = torch.ones(1000, device="cuda")     # kernels: 4,000, 8,000, 4,004 bytes
        y = x * 2
        y.sum().item()                          # waits for the sum, then a 4-byte copy
    t = prof.trace
    host = {(o.op, o.device): o.host_ns for o in t.ops}
    assert host == {("aten::ones", "cpu"): p.host_op_ns + 2, ("aten::view", "cpu"): p.host_op_ns,
                    ("aten::ones", "cuda:0"): p.launch_ns, ("aten::mul", "cuda:0"): p.launch_ns,
                    ("aten::sum", "cuda:0"): p.launch_ns}
    # what each device op would cost on the host: the dispatcher plus its bytes at 10 GB/s
    assert {o.op: o.run_ns for o in t.ops if o.device == "cuda:0"} == {
        "aten::ones": 2_400, "aten::mul": 2_800, "aten::sum": 2_400}
    # host clock: 6 ops and the end, each after 1 us of the program's Python; the sum ends on
    # the device at 26,004 ns, then the copy (2 us) and the host's wake-up (5 us)
    assert t.summary.total_ns == 7 * p.python_op_ns + 2_002 + 2_000 + 3 * 5_000 + 8_002
    assert (t.summary.total_ns, t.summary.overhead_ns) == (34_004, 7_000)
    assert [(c.trigger, c.host_ns, c.device_ns) for c in t.copies] == [("item", 8_002, 2_000)]
    assert (t.copies[0].first_ns, t.copies[0].last_ns) == (33_004, 33_004)  # when it ended
    assert t.meta.wall_ns > 0  # measured, and kept apart


def _traced_json(fn) -> dict:
    with memcpy_doctor.profiler(device="sim") as prof:
        fn()
    data = json.loads(prof.trace.to_json())
    del data["meta"]["wall_ns"], data["meta"]["started_ns"]  # the clock's, not the model's
    return data


def test_the_same_program_gives_the_same_trace():
    def program():
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64).cuda()
        for _ in range(20):
            loss = model(torch.randn(16, 64, device="cuda")).sum()
            loss.backward()
            print(loss.item(), file=open("/dev/null", "w"))
            torch.cuda.synchronize()
    first, second = (_traced_json(program) for _ in range(2))  # (one line: copies keep stacks)
    assert second == first
    assert first["summary"]["total_ns"] > 0


def _cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memcpy_doctor", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def _report(err: str) -> str:
    """The report without its one measured line and the line about the trace file."""
    return "".join(line for line in err.splitlines(keepends=True)
                   if not line.startswith(("Measured on this machine", "memcpy-doctor: trace")))


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """three_runs(program): its folder and three `profile --device sim -o tK.json` runs of it
    there, side by side; once per module (the article's test reads the sample's t0.json)."""
    cache: dict[str, tuple[Path, list[subprocess.CompletedProcess]]] = {}

    def get(program: str):
        if program not in cache:
            folder = tmp_path_factory.mktemp(program)
            if program == "sample":
                script = folder / "shape_slice_crop.py"
                shutil.copy(SAMPLE, script)
            else:
                script = folder / "held_out.py"
                script.write_text(HELD_OUT)
            cache[program] = folder, concurrently(*(
                lambda i=i: _cli("profile", "--device", "sim", "-o", f"t{i}.json", script.name,
                                 cwd=folder) for i in range(3)))
        return cache[program]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("program", ["sample", "held_out"])
def test_runs_of_one_program_give_byte_identical_reports(three_runs, program):
    tmp_path, runs = three_runs(program)
    assert [r.returncode for r in runs] == [0, 0, 0], runs[0].stderr
    assert "Measured on this machine, with tracing: wall time " in runs[0].stderr
    reports = {_report(r.stderr) for r in runs}
    assert len(reports) == 1
    gate = _cli("check", "--baseline", "t0.json", "--tolerance", "0%", "--tolerance",
                "total_time=0%", "--tolerance", "sync_time=0%", "t1.json", cwd=tmp_path)
    assert gate.returncode == 0, gate.stdout
    assert re.search(r"ok   total_time = [\d.]+ ms, baseline [\d.]+ ms", gate.stdout)


@pytest.mark.slow
def test_the_articles_edit_lowers_the_total_by_at_least_the_sync_time(three_runs):
    """The first of the sample's three runs is the one before the edit (its folder: the edit
    names the script there)."""
    tmp_path, runs = three_runs("sample")
    script = tmp_path / "shape_slice_crop.py"
    assert runs[0].returncode == 0
    shutil.copy(tmp_path / "t0.json", tmp_path / "before.json")
    fix = _cli("explain", "--format", "json", "before.json", cwd=tmp_path)
    assert fix.returncode == 0
    (tmp_path / "fix.json").write_text(fix.stdout)
    assert _cli("profile", "--device", "sim", "--apply", "fix.json", "-o", "after.json",
                script.name, cwd=tmp_path).returncode == 0
    before, after = (memcpy_doctor.load_trace(tmp_path / f"{n}.json") for n in ("before", "after"))
    assert (before.summary.memcpy_sync.calls, after.summary.memcpy_sync.calls) == (20, 0)
    removed = before.summary.memcpy_sync.time_ns
    assert before.summary.total_ns - after.summary.total_ns >= removed
    diff = _cli("diff", "before.json", "after.json", cwd=tmp_path)
    assert re.search(r"Total time +[\d.]+ +[\d.]+ +-\d", diff.stdout), diff.stdout
