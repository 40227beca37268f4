"""Races (issue 42): the host touching an async copy's host memory before anything ordered the
copy, found by happens-before on the simulated GPU's streams and events (tracer/races.py).
Each program is one kind the issue lists; the lines named `# race` (or `# ok`) are checked
exactly. The real GPU runs the same programs (marked cuda)."""

from __future__ import annotations

import textwrap

import pytest

import memcpy_doctor
from memcpy_doctor.core.races import READ_BEFORE_DONE, WRITE_DURING
from memcpy_doctor.run.runner import run_script
from memcpy_doctor.tracer import Tracer
from memcpy_doctor.tracer.races import RaceChecker

HEAD = """\
import torch
x = torch.randn(1000, device="cuda")
y = x * 2
"""

PROGRAMS = {
    "read right after": ("""\
host = y.to("cpu", non_blocking=True)  # copy
print(host.sum())  # access
""", READ_BEFORE_DONE),
    "read after an unrelated event": ("""\
event = torch.cuda.Event()
event.record()
host = y.to("cpu", non_blocking=True)  # copy
event.synchronize()
total = host.sum()  # access
""", READ_BEFORE_DONE),
    "read after a synchronize": ("""\
host = y.to("cpu", non_blocking=True)  # copy
torch.cuda.synchronize()
total = host.sum()
""", None),
    "read after an event recorded after the copy": ("""\
host = y.to("cpu", non_blocking=True)  # copy
done = torch.cuda.Event()
done.record()
done.synchronize()
total = host.sum()
""", None),
    "read after a query that found the event done": ("""\
host = y.to("cpu", non_blocking=True)  # copy
done = torch.cuda.Event()
done.record()
while not done.query():
    pass
total = host.sum()
""", None),
    "read after item on the same stream": ("""\
host = y.to("cpu", non_blocking=True)  # copy
loss = y.sum().item()
total = host.sum()
""", None),
    "read after item on another stream": ("""\
host = y.to("cpu", non_blocking=True)  # copy
with torch.cuda.stream(torch.cuda.Stream()):
    other = torch.ones(3, device="cuda").sum().item()
total = host.sum()  # access
""", READ_BEFORE_DONE),
    "tolist right after": ("""\
host = y.to("cpu", non_blocking=True)  # copy
values = host.tolist()  # access
""", READ_BEFORE_DONE),
    "a view read right after": ("""\
host = y.to("cpu", non_blocking=True)  # copy
first = host[:10]
value = float(first[0])  # access
""", READ_BEFORE_DONE),
    "a pinned buffer refilled in a loop": ("""\
buf = torch.empty(1000).pin_memory()
for step in range(3):
    buf.copy_(torch.randn(1000))  # access
    dev = buf.to("cuda", non_blocking=True)  # copy
    out = dev * 2
""", WRITE_DURING),
    "a pinned buffer refilled after a read each step": ("""\
buf = torch.empty(1000).pin_memory()
for step in range(3):
    buf.copy_(torch.randn(1000))
    dev = buf.to("cuda", non_blocking=True)  # copy
    loss = (dev * 2).sum().item()
""", None),
    "a side stream joined with wait_stream": ("""\
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    host = y.to("cpu", non_blocking=True)  # copy
torch.cuda.current_stream().wait_stream(side)
torch.cuda.current_stream().synchronize()
total = host.sum()
""", None),
    "a side stream not joined": ("""\
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    host = y.to("cpu", non_blocking=True)  # copy
torch.cuda.current_stream().synchronize()
total = host.sum()  # access
""", READ_BEFORE_DONE),
    "a wait_event alone orders nothing for the host": ("""\
host = y.to("cpu", non_blocking=True)  # copy
done = torch.cuda.Event()
done.record()
torch.cuda.Stream().wait_event(done)
total = host.sum()  # access
""", READ_BEFORE_DONE),
    "the side stream's sync orders its copy": ("""\
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    host = y.to("cpu", non_blocking=True)  # copy
side.synchronize()
total = host.sum()
""", None),
}


def _line(text: str, tag: str) -> int | None:
    hits = [i for i, s in enumerate(text.splitlines(), 1) if s.endswith(f"# {tag}")]
    return hits[0] if hits else None


def _run(tmp_path, body: str, device: str = "sim"):
    text = HEAD + textwrap.dedent(body)
    path = tmp_path / "prog.py"
    path.write_text(text)
    result = run_script(str(path), [], Tracer(device=device))
    assert result.exit_status == 0, result.exception
    return text, result.trace


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    return request.param


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_kind_of_program(name, tmp_path, device):
    body, kind = PROGRAMS[name]
    text, trace = _run(tmp_path, body, device)
    found = [(r.kind, r.copy_site.line, r.access_site.line, r.direction) for r in trace.races]
    if kind is None:
        assert found == []
        return
    copy_line, access_line = _line(text, "copy"), _line(text, "access")
    direction = "HtoD" if kind == WRITE_DURING else "DtoH"
    assert found == [(kind, copy_line, access_line, direction)]
    [race] = trace.races
    assert race.calls == (2 if "loop" in name else 1)  # (the loop's first fill is before)
    assert race.bytes == 4000 * race.calls


def test_a_race_is_counted_once_per_copy_however_many_ops_the_access_runs(tmp_path):
    """`print(t)` runs several ops on `t`: one race, named by the call that made them."""
    _, trace = _run(tmp_path, """\
host = y[:8].to("cpu", non_blocking=True)
print(host)
host = y[:8].to("cpu", non_blocking=True)
array = host.numpy()
""")
    assert sorted((r.access_site.line, r.op, r.calls) for r in trace.races) == [
        (5, "print", 1), (7, "numpy", 1)]


def test_the_checker_keeps_nothing_once_ordered_and_forgets_nothing_before():
    """The vector clocks, on their own: a copy on stream A is ordered by A's sync, by an
    event recorded on A after it, or by a sync of stream B after B waited for such an
    event; not by B's sync alone, nor by an event recorded before it."""
    import torch
    current = ["A"]
    checker = RaceChecker(lambda: current[0])
    host = torch.empty(4)

    def issue():
        checker.copy("DtoH", host, "copy-site", 16, "to")

    checker.event_recorded("early")
    issue()
    checker.event_synced("early")
    checker.synced_stream("B")
    assert len(checker.inflight) == 1
    checker.event_recorded("after")
    checker.stream_waited("B", "after")
    assert len(checker.inflight) == 1  # (a wait orders nothing for the host)
    checker.synced_stream("B")
    assert checker.inflight == {}
    issue()
    checker.synced_device()
    assert checker.inflight == {}
    issue()
    checker.access("aten::sum", "sum", [host], "access-site", None)
    checker.access("aten::add", "add", [host], "access-site", None)  # (the same access site)
    assert [(r.kind, r.calls, r.bytes, r.op) for r in checker.records()] == [
        (READ_BEFORE_DONE, 1, 16, "aten::sum")]


def test_no_race_on_the_samples(tmp_path):
    import pathlib
    samples = pathlib.Path(__file__).resolve().parent.parent / "sample_models"
    for path in sorted(samples.glob("*.py")):
        args = [] if path.stem == "shape_slice_crop" else ["--steps", "3"]
        result = run_script(str(path), args, Tracer(device="sim"))
        assert result.exit_status == 0, (path, result.exception)
        assert result.trace.races == [], path


def test_races_round_trip_and_older_traces_have_none(tmp_path):
    _, trace = _run(tmp_path, PROGRAMS["read right after"][0])
    trace.save(tmp_path / "t.json")
    loaded = memcpy_doctor.load_trace(tmp_path / "t.json")
    assert loaded.races == trace.races and len(loaded.races) == 1
    import json
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["races"][0]["copy"]["direction"] == "DtoH"
    assert data["races"][0]["access"]["op"] == trace.races[0].op
    del data["races"]
    assert memcpy_doctor.core.trace.Trace.from_dict(data).races == []


def test_report_check_and_the_ci_formats_show_each_race_at_its_access(tmp_path):
    """The report's Races section; `check --max races=0` fails; GitHub, SARIF and JUnit name
    each race at the access's line (as a user runs them: the CLI in this process)."""
    import json
    import xml.etree.ElementTree as ET

    from helpers import cli_in_process

    (tmp_path / "prog.py").write_text(HEAD + PROGRAMS["read right after"][0])
    done = cli_in_process("profile", "--device", "sim", "-o", "t.json", "prog.py",
                          cwd=tmp_path)
    assert done.status == 0, done.err
    report = (done.out + done.err).split("Races")[-1]
    assert "read_before_copy_done  DtoH to prog.py:4      aten::sum prog.py:5  1" in report
    check = cli_in_process("check", "--max", "races=0", "t.json", cwd=tmp_path)
    assert check.status == 1 and "FAIL races = 1, max 0" in check.out
    assert "race (read_before_copy_done): `aten::sum` at prog.py:5 reads" in check.out
    assert cli_in_process("check", "--max", "races=1", "t.json", cwd=tmp_path).status == 0
    github = cli_in_process("check", "--max", "races=0", "--format", "github", "t.json",
                            cwd=tmp_path).out
    assert "::error file=prog.py,line=5,title=memcpy-doctor::race (read_before_copy_done)" \
        in github
    sarif = json.loads(cli_in_process("check", "--max", "races=0", "--format", "sarif",
                                      "t.json", cwd=tmp_path).out)
    [race] = [r for r in sarif["runs"][0]["results"] if "/race/" in r["ruleId"]]
    assert race["ruleId"] == "memcpy-doctor/race/read_before_copy_done"
    assert race["level"] == "error"
    region = race["locations"][0]["physicalLocation"]
    assert (region["artifactLocation"]["uri"], region["region"]["startLine"]) == ("prog.py", 5)
    junit = ET.fromstring(cli_in_process("check", "--max", "races=0", "--format", "junit",
                                         "t.json", cwd=tmp_path).out)
    [failure] = junit.iter("failure")
    assert "race (read_before_copy_done): `aten::sum` at prog.py:5" in failure.text


def test_real_gpu_hooks_feed_the_checker_from_cudas_callbacks_and_undo_themselves():
    """On a real GPU, CUDA's trace callbacks (with its handles) drive the checker: a copy on
    stream 7 is ordered by an event recorded on 7 once the host syncs that event, not by a
    sync of stream 9 before 9 waited for it; and nothing stays registered after."""
    import torch
    from memcpy_doctor.core.torch_private import gpu_trace
    from memcpy_doctor.tracer.cuda_races import RaceHooks

    current = [7]
    checker = RaceChecker(lambda: current[0])
    registries = (gpu_trace.EventRecordCallbacks, gpu_trace.EventWaitCallbacks,
                  gpu_trace.StreamSynchronizationCallbacks,
                  gpu_trace.DeviceSynchronizationCallbacks,
                  gpu_trace.EventSynchronizationCallbacks)
    before = [list(r.callback_list) for r in registries]
    queries = (torch.cuda.Event.query, torch.cuda.Stream.query)
    with RaceHooks(checker):
        assert torch.cuda.Event.query is not queries[0]
        host = torch.empty(2)  # (kept: a freed host storage leaves nothing in flight)
        checker.copy("DtoH", host, "copy-site", 8, "to")
        gpu_trace.EventRecordCallbacks.fire_callbacks(1001, 7)
        gpu_trace.StreamSynchronizationCallbacks.fire_callbacks(9)
        assert checker.inflight
        gpu_trace.EventWaitCallbacks.fire_callbacks(1001, 9)
        gpu_trace.StreamSynchronizationCallbacks.fire_callbacks(9)
        assert not checker.inflight
        checker.copy("HtoD", host, "copy-site", 8, "to")
        assert checker.inflight
        gpu_trace.DeviceSynchronizationCallbacks.fire_callbacks()
        assert not checker.inflight
    assert [list(r.callback_list) for r in registries] == before
    assert (torch.cuda.Event.query, torch.cuda.Stream.query) == queries


REUSED_BUFFER = """\
import torch
buf = torch.empty(1000).pin_memory()
for step in range(5):
    buf.copy_(torch.randn(1000))
    dev = buf.to("cuda")
    out = dev * 2
{read}
"""


@pytest.mark.parametrize("read, proposed", [("", False),
                                            ("    loss = out.sum().item()", True)])
def test_explain_never_proposes_non_blocking_that_would_race(tmp_path, read, proposed):
    """A pinned buffer refilled every step and copied with a wait: `non_blocking=True` there
    would let the next refill overwrite it while the copy still reads it, unless something
    (here `.item()`) waits in between; explain proposes it only then."""
    from helpers import cli_in_process

    (tmp_path / "prog.py").write_text(REUSED_BUFFER.format(read=read))
    assert cli_in_process("profile", "--device", "sim", "-o", "t.json", "prog.py",
                          cwd=tmp_path).status == 0
    out = cli_in_process("explain", "t.json", cwd=tmp_path).out
    assert ("non_blocking=True" in out) == proposed, out


def test_explain_gives_each_race_its_fix_first(tmp_path):
    """Three races, three edits: drop non_blocking where the next statement reads the copy;
    an event recorded after the copy and waited for before a later read; the device
    synchronized before a refill that comes first in the loop. Required, with their cost."""
    from helpers import cli_in_process

    (tmp_path / "prog.py").write_text("""\
import torch


def step(x):
    y = x * 2
    host = y.to("cpu", non_blocking=True)
    z = y + 1
    print(host.sum())
    host2 = y.to("cpu", non_blocking=True)
    print(host2.sum())


x = torch.randn(1000, device="cuda")
for _ in range(3):
    step(x)
buf = torch.empty(1000).pin_memory()
for i in range(3):
    buf.copy_(torch.randn(1000))
    dev = buf.to("cuda", non_blocking=True)
    out = dev * 2
""")
    assert cli_in_process("profile", "--device", "sim", "-o", "t.json", "prog.py",
                          cwd=tmp_path).status == 0
    out = cli_in_process("explain", "t.json", cwd=tmp_path).out
    titles = [line for line in out.splitlines() if line[:3] in ("1. ", "2. ", "3. ")]
    assert sorted(t.split(" (")[0][3:] for t in titles) == [
        "race: drop non_blocking: the copy is read at once anyway",
        "race: record an event after the copy and wait for it before the access",
        "race: synchronize the device before the access"], out
    assert "-    host2 = y.to(\"cpu\", non_blocking=True)\n   +    host2 = y.to(\"cpu\")" in out
    assert ("   +    copy_done = torch.cuda.Event()\n   +    copy_done.record()\n"
            "        z = y + 1\n   +    copy_done.synchronize()\n") in out
    assert "   +    torch.cuda.synchronize()  # the copy must be done first\n" \
           "        buf.copy_(torch.randn(1000))" in out
    assert out.count("costs ~") == 3


def test_a_freed_host_storage_is_forgotten_so_its_address_can_be_reused():
    """The checker keeps no tensor, and a copy's host storage that is freed leaves nothing in
    flight: a new storage at its address must not be taken for it."""
    import gc
    import weakref

    import torch
    checker = RaceChecker(lambda: "A")
    host = torch.empty(4)
    alive = weakref.ref(host)
    checker.copy("DtoH", host, "copy-site", 16, "to")
    assert checker.inflight
    del host
    gc.collect()
    assert alive() is None and checker.inflight == {}


def test_verify_judges_a_race_fix_by_the_races_it_removes():
    """`explain --verify`: a race's fix is verified when the copies raced fall, though the
    wait it adds costs time; any other edit that makes a race is worse."""
    from memcpy_doctor.run.verify import Verified

    fix = Verified((0, 3), (100, 120), races=(8, 5), fixes_race=True)
    assert fix.helped and not fix.worse and fix.outcome == "verified"
    assert Verified((0, 0), (100, 90), races=(1, 1), fixes_race=True).worse
    faster_but_racy = Verified((4, 2), (100, 90), races=(0, 1))
    assert faster_but_racy.worse and not faster_but_racy.helped
    assert Verified((4, 2), (100, 90)).helped
