"""SIGTERM and SIGHUP during a profiled run: the trace of what ran is written, the report says
the run was cut short by the signal, and the process dies of the signal as it would without
the tool. A script's own handler keeps working; handlers are ours only during the run."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from helpers import signals_as_default
from memcpy_doctor.run.runner import RunResult, run_script
from memcpy_doctor.core.trace import load_trace
from memcpy_doctor.tracer import Tracer

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name == "nt",
                                reason="POSIX signals")

TIMEOUT = 60

#: Busy with ops after "ready", so the signal usually lands inside the tracer's own code
#: (where the handler waits for it to return) as well as in the script's.
BUSY = """
    import sys
    import torch
    x = torch.ones(8, device="cuda")
    for _ in range(20):
        x = (x * 1.0 + 0.0).relu()
    print("ready", float(x.sum()), flush=True)
    while True:
        x = (x * 1.0001 + 0.5).relu()
"""

OWN_HANDLER = """
    import signal, sys, time
    import torch

    def on_term(signum, frame):
        print("own handler", signum, flush=True)
        sys.exit(5)

    signal.signal(signal.SIGTERM, on_term)
    x = torch.ones(8, device="cuda")
    print("ready", x.sum().item(), flush=True)
    while True:
        time.sleep(0.01)
"""


def start(tmp_path: Path, source: str) -> subprocess.Popen:
    (tmp_path / "s.py").write_text(textwrap.dedent(source).lstrip())
    return subprocess.Popen(
        [sys.executable, "-m", "memcpy_doctor", "profile", "--device", "sim", "-o",
         "trace.json", "s.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=signals_as_default)


def signal_when_ready(proc: subprocess.Popen, sig: int) -> tuple[str, str, str]:
    """Wait for the script's "ready" line, send `sig`, return (ready line, stdout, stderr)."""
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
        try:
            first = lines.get(timeout=TIMEOUT)
        except queue.Empty:
            pytest.fail("the script never printed its ready line")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return first, out, err


@pytest.mark.parametrize("name", [n for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)])
def test_a_signal_writes_the_trace_and_the_process_dies_of_it(tmp_path, name):
    sig = getattr(signal, name)
    proc = start(tmp_path, BUSY)
    first, out, err = signal_when_ready(proc, sig)
    assert proc.returncode == -sig  # a death by the signal, as a parent sees it without us
    proc_status = 128 + sig
    assert first == "ready 8.0\n"
    assert f"Run cut short: {name} (exit status {proc_status})" in err
    assert "Profiling Report" in err and "trace written to trace.json" in err
    assert "Traceback" not in err
    trace = load_trace(tmp_path / "trace.json")
    assert (trace.meta.ended_by, trace.meta.exit_status) == (name, proc_status)
    assert [c.trigger for c in trace.copies] == ["float"]
    assert sum(e.calls for e in trace.events if e.name == "aten::relu") >= 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py", "trace.json"]  # no temp


#: A copy listener runs inside the tracer's handling of the op that copies (where torch has
#: taken the tracer's modes off its stack); it signals the process and keeps Python busy there
#: past SIGNAL_DEFER_MAX_S, so the handler acts where it lands: inside the tracer.
STUCK_IN_TRACER = """
    import os, signal, time
    import torch
    from memcpy_doctor.tracer import active_tracer

    def on_copy(event):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pass
        print("not cut short", flush=True)

    active_tracer().add_copy_listener(on_copy)
    torch.ones(8, device="cuda").sum().item()
"""


def test_a_signal_acted_on_inside_the_tracer_still_writes_the_trace(tmp_path):
    proc = start(tmp_path, STUCK_IN_TRACER)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM and out == ""
    assert "Run cut short: SIGTERM (exit status 143)" in err and "Traceback" not in err
    trace = load_trace(tmp_path / "trace.json")
    assert (trace.meta.ended_by, trace.meta.exit_status) == ("SIGTERM", 143)
    assert [e.name for e in trace.events if e.name.startswith("aten::")] == ["aten::ones",
                                                                          "aten::sum"]


def test_a_scripts_own_handler_keeps_working(tmp_path):
    proc = start(tmp_path, OWN_HANDLER)
    first, out, err = signal_when_ready(proc, signal.SIGTERM)
    assert first == "ready 8.0\n"
    assert out == f"own handler {int(signal.SIGTERM)}\n"
    assert proc.returncode == 5
    assert "Run cut short: exit (exit status 5)" in err
    trace = load_trace(tmp_path / "trace.json")
    assert (trace.meta.ended_by, trace.meta.exit_status) == ("exit", 5)


# ---------------------------------------------------------------------------------------------
# In this process: which handler is in place during and after the run
# ---------------------------------------------------------------------------------------------

SEES = """
    import signal
    SEEN.append(signal.getsignal(signal.SIGTERM))
"""


def _run(tmp_path: Path, source: str, seen: list) -> RunResult:
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent(source).lstrip())
    import builtins
    builtins.SEEN = seen
    try:
        return run_script(str(script), [], Tracer(device="sim"),
                          on_hard_exit=lambda result: None)
    finally:
        del builtins.SEEN


def test_handlers_are_ours_during_the_run_only(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    assert before is signal.SIG_DFL
    seen: list = []
    result = _run(tmp_path, SEES, seen)
    assert result.ended_by == "completed"
    assert callable(seen[0]) and seen[0] not in (signal.SIG_DFL, signal.SIG_IGN)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_an_ignored_signal_stays_ignored(tmp_path):
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as under nohup for SIGHUP
    try:
        seen: list = []
        _run(tmp_path, SEES, seen)
        assert seen == [signal.SIG_IGN]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_handler_the_script_installs_is_taken_out_after(tmp_path):
    seen: list = []
    _run(tmp_path, """
        import signal
        signal.signal(signal.SIGTERM, lambda *a: None)
        SEEN.append(signal.getsignal(signal.SIGTERM))
    """, seen)
    assert seen[0].__name__ == "<lambda>"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
