"""The `memcpy-doctor` command as a user runs it: real subprocesses, the simulated GPU.

Every test writes its scripts into a temporary directory, runs there (cwd), profiles with
`--device sim` and writes the trace with `-o` into that directory. Each launch costs about
2 s (`import torch`) or 4 s (a profiled run), so the checks are grouped: module-scoped
fixtures run a command once and several tests read the result; the plain run a profiled run
is compared with runs beside it; a command's usage errors after the first go through its
entry point in this process.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

import memcpy_doctor
from helpers import cli_in_process, concurrently, signals_as_default
from memcpy_doctor import load_trace, render_text

TIMEOUT = 120
REPORT_HEADINGS = ("Profiling Report", "GpuMemCpy Summary", "Event Summary")


@dataclass
class Run:
    status: int
    out: bytes  # the raw stdout, for byte-for-byte comparisons
    err: str

    @property
    def text(self) -> str:
        return self.out.decode()


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> Run:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=TIMEOUT,
                       env={**os.environ, **(env or {})})
    return Run(p.returncode, p.stdout, p.stderr.decode())


def run_cli(*args: object, cwd: Path, env: dict[str, str] | None = None) -> Run:
    """`python -m memcpy_doctor ARGS` in `cwd`."""
    return _run([sys.executable, "-m", "memcpy_doctor", *map(str, args)], cwd, env)


def run_in_process(*args: object, cwd: Path) -> Run:
    """`memcpy-doctor ARGS` in `cwd`, through the console script's entry point in this process
    (no `import torch` to pay): for the cases of a command after its first, real one."""
    r = cli_in_process(*args, cwd=cwd)
    return Run(r.status, r.out.encode(), r.err)


def run_python(*args: object, cwd: Path, env: dict[str, str] | None = None) -> Run:
    """`python ARGS` in `cwd`: the plain run a profiled run must match."""
    return _run([sys.executable, *map(str, args)], cwd, env)


def profile(script: str, *script_args: object, cwd: Path, trace: str = "trace.json",
            env: dict[str, str] | None = None) -> Run:
    return run_cli("profile", "--device", "sim", "-o", trace, script, *script_args, cwd=cwd,
                   env=env)


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def line_of(path: Path, snippet: str, whole: bool = False) -> int:
    """The 1-based line of the one line of `path` that contains (`whole`: is) `snippet`."""
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1)
            if (line == snippet if whole else snippet in line)]
    assert len(hits) == 1, f"{snippet!r} found on lines {hits} of {path}"
    return hits[0]


def traceback_part(err: str) -> str:
    """stderr up to the Profiling Report banner: what the script itself left there."""
    head, sep, _ = err.partition("-" * 25 + "      Profiling Report")
    assert sep, f"no Profiling Report on stderr:\n{err}"
    return head


def event_order(report: str) -> list[str]:
    """Event names of the Event Summary table, in the order printed."""
    section = report.split("Event Summary", 1)[1].split("Sync copies", 1)[0]
    rows = [line for line in section.splitlines()[1:]
            if line.strip() and not line.startswith(("-", "Event "))]
    return [row.split()[0] for row in rows]


def assert_usage_error(r: Run, *needles: str) -> str:
    assert r.status == 2, (r.status, r.err)
    lines = r.err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{r.err}"
    assert lines[0].startswith("memcpy-doctor: error:"), lines[0]
    assert "Traceback" not in r.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------------
# The script's own environment: __name__, sys.argv, sys.path[0]; its stdout; the report.
# ---------------------------------------------------------------------------------------------

ENV_SCRIPT = """
    import json, os, sys
    import sibling_mod  # only importable when sys.path[0] is this script's directory

    with open(os.environ["MD_ENV_OUT"], "w") as f:
        json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                   "sibling": sibling_mod.VALUE}, f)

    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(6, dtype=torch.float32)
    y = (x.to(dev) * 2).sum()
    print("sum:", float(y))
    print("args:", sys.argv[1:])
    for i in range(3):
        print(i, end=" ")
    print()
    sys.stdout.write("no newline at the end, \u00fcnic\u00f6de \u2713")
"""

#: Options after SCRIPT belong to the script, even those `profile` itself knows.
SCRIPT_ARGS = ("a", "--flag", "b", "--sort", "calls", "-o", "other.json", "--help")


@dataclass
class EnvRuns:
    root: Path
    proj: Path
    prof: Run
    plain: Run
    prof_env: dict
    plain_env: dict


@pytest.fixture(scope="module")
def env_runs(tmp_path_factory) -> EnvRuns:
    # The script lives in a subdirectory of the cwd, so a sibling import works only if
    # sys.path[0] is the script's directory (for `-m`, it starts out as the cwd).
    root = tmp_path_factory.mktemp("env")
    proj = root / "proj"
    write(proj / "s.py", ENV_SCRIPT)
    write(proj / "sibling_mod.py", 'VALUE = "sibling-ok"\n')
    prof, plain = concurrently(
        lambda: profile("proj/s.py", *SCRIPT_ARGS, cwd=root,
                        env={"MD_ENV_OUT": str(root / "env_prof.json")}),
        lambda: run_python("proj/s.py", *SCRIPT_ARGS, cwd=root,
                           env={"MD_ENV_OUT": str(root / "env_plain.json")}))
    assert plain.status == 0, plain.err
    assert prof.status == 0, prof.err
    return EnvRuns(root, proj, prof, plain,
                   json.loads((root / "env_prof.json").read_text()),
                   json.loads((root / "env_plain.json").read_text()))


def test_script_runs_as_main_with_its_directory_first_on_path(env_runs):
    e = env_runs.prof_env
    assert e["name"] == "__main__"
    assert e["sibling"] == "sibling-ok"
    assert os.path.realpath(e["path0"]) == os.path.realpath(env_runs.proj)
    # the options after SCRIPT reached the script, none was taken by memcpy-doctor
    assert e["argv"][1:] == list(SCRIPT_ARGS)
    assert not (env_runs.root / "other.json").exists()
    assert "Sorted by total time" in env_runs.prof.err
    # sanity of the expectation used by the next test: what plain Python gives
    assert env_runs.plain_env["argv"] == ["proj/s.py", *SCRIPT_ARGS]
    assert env_runs.plain_env["name"] == "__main__"


def test_script_argv_is_exactly_what_python_gives(env_runs):
    assert env_runs.prof_env["argv"] == ["proj/s.py", *SCRIPT_ARGS]
    assert env_runs.prof_env["argv"] == env_runs.plain_env["argv"]


def test_stdout_is_the_scripts_and_the_report_goes_to_stderr(env_runs):
    prof, plain = env_runs.prof, env_runs.plain
    assert prof.out == plain.out  # byte for byte
    assert plain.out.endswith("\u2713".encode())
    for heading in REPORT_HEADINGS:
        assert heading in prof.err
        assert heading.encode() not in prof.out
    assert "Run cut short" not in prof.err
    assert prof.err.endswith("memcpy-doctor: trace written to trace.json\n")
    trace = load_trace(env_runs.root / "trace.json")
    assert trace.meta.exit_status == 0
    assert trace.meta.ended_by == "completed"
    assert trace.meta.simulated is True and trace.meta.device == "sim"
    # the script's copies were traced, at its own lines
    script = env_runs.proj / "s.py"
    assert {(c.direction, c.site.line) for c in trace.copies} == {
        ("HtoD", line_of(script, "x.to(dev)")),
        ("DtoH", line_of(script, "float(y)")),
    }


def test_sys_path0_through_a_symlinked_directory(tmp_path):
    real = tmp_path / "real"
    write(real / "s.py", """
        import json, os, sys
        with open(os.environ["MD_ENV_OUT"], "w") as f:
            json.dump(sys.path[0], f)
    """)
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    r = profile("link/s.py", cwd=tmp_path, env={"MD_ENV_OUT": str(tmp_path / "p0.json")})
    assert r.status == 0, r.err
    assert json.loads((tmp_path / "p0.json").read_text()) == str(real.resolve())


def test_relative_output_is_taken_before_the_script_changes_directory(tmp_path):
    write(tmp_path / "s.py", """
        import os
        os.makedirs("sub")
        os.chdir("sub")
    """)
    r = profile("s.py", cwd=tmp_path)
    assert r.status == 0, r.err
    assert (tmp_path / "trace.json").is_file()
    assert not (tmp_path / "sub" / "trace.json").exists()


# ---------------------------------------------------------------------------------------------
# Exit status, how the run ended, and the trace written in every case.
# ---------------------------------------------------------------------------------------------

EXIT_SCRIPT = """
    import sys
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.ones(4).to(dev)
    print("before", float(x.sum()), flush=True)
    how = sys.argv[1]
    if how == "code":
        sys.exit(3)
    if how == "message":
        sys.exit("msg: giving up")
    if how == "interrupt":
        raise KeyboardInterrupt
    print("not reached")
"""


def check_cut_short(r: Run, trace_path: Path, status: int, ended_by: str) -> None:
    assert r.status == status, (r.status, r.err)
    assert r.text == "before 4.0\n"
    trace = load_trace(trace_path)
    assert trace.meta.exit_status == status
    assert trace.meta.ended_by == ended_by
    # the work done before the end is in the trace
    assert sum(c.calls for c in trace.copies) == 2
    assert f"Run cut short: {ended_by} (exit status {status})" in r.err
    for heading in REPORT_HEADINGS:
        assert heading in r.err


@pytest.mark.parametrize("how, status, ended_by", [
    ("code", 3, "exit"),
    ("message", 1, "exit"),
    ("interrupt", 130, "interrupt"),
])
def test_exit_status_and_trace_when_the_run_is_cut_short(tmp_path, how, status, ended_by):
    script = write(tmp_path / "s.py", EXIT_SCRIPT)
    r = profile("s.py", how, cwd=tmp_path)
    check_cut_short(r, tmp_path / "trace.json", status, ended_by)
    if how == "message":
        assert r.err.startswith("msg: giving up\n")
    if how == "interrupt":
        tb = traceback_part(r.err)
        assert tb.startswith("Traceback (most recent call last):\n")
        assert f'File "{script}", line {line_of(script, "raise KeyboardInterrupt")}' in tb
        assert tb.rstrip().endswith("KeyboardInterrupt")
        assert "runner.py" not in tb and "runpy" not in tb


def test_uncaught_exception_prints_pythons_traceback(tmp_path):
    script = write(tmp_path / "s.py", """
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        x = torch.ones(4).to(dev)
        print("before", float(x.sum()), flush=True)

        def inner():
            raise ValueError("boom from the script")

        def outer():
            inner()

        outer()
        print("not reached")
    """)
    r, plain = concurrently(lambda: profile("s.py", cwd=tmp_path),
                            lambda: run_python("s.py", cwd=tmp_path))
    check_cut_short(r, tmp_path / "trace.json", 1, "exception")
    assert r.out == plain.out
    tb = traceback_part(r.err)
    assert tb.startswith("Traceback (most recent call last):\n")
    assert f'File "{script}", line {line_of(script, "raise ValueError")}, in inner' in tb
    assert f'File "{script}", line {line_of(script, "outer()", whole=True)}, in <module>' in tb
    assert tb.rstrip().endswith("ValueError: boom from the script")
    assert "runner.py" not in tb
    assert "runpy" not in tb
    assert "memcpy_doctor" not in tb
    # exactly the traceback plain Python prints
    assert plain.status == 1
    assert tb == plain.err


def test_exception_inside_a_torch_op_shows_no_profiler_frames(tmp_path):
    script = write(tmp_path / "s.py", """
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        a = torch.ones(2, device=dev)
        b = torch.ones(3, device=dev)
        c = a + b
    """)
    r = profile("s.py", cwd=tmp_path)
    assert r.status == 1, r.err
    assert load_trace(tmp_path / "trace.json").meta.ended_by == "exception"
    tb = traceback_part(r.err)
    assert "RuntimeError: The size of tensor a (2) must match" in tb
    files = [line.strip() for line in tb.splitlines() if line.strip().startswith('File "')]
    assert files == [f'File "{script}", line {line_of(script, "c = a + b")}, in <module>']


def test_syntax_error_in_the_script_is_reported_as_python_would(tmp_path):
    script = write(tmp_path / "s.py", "x = (\n")
    r = profile("s.py", cwd=tmp_path)
    assert r.status == 1, r.err
    trace = load_trace(tmp_path / "trace.json")
    assert (trace.meta.exit_status, trace.meta.ended_by) == (1, "exception")
    tb = traceback_part(r.err)
    assert "SyntaxError" in tb
    assert "runner.py" not in tb
    assert "runpy" not in tb
    assert tb.startswith(f'  File "{script}", line 1\n')


def test_ctrl_c_ends_with_130_and_writes_the_trace(tmp_path):
    write(tmp_path / "s.py", """
        import time
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        x = torch.ones(16).to(dev)
        print("ready", (x * 2).sum().item(), flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
        print("not interrupted")
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "memcpy_doctor", "profile", "--device", "sim", "-o", "trace.json",
         "s.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=signals_as_default)
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
        try:
            first = lines.get(timeout=60)
        except queue.Empty:
            pytest.fail("the script never printed its ready line")
        assert first == "ready 32.0\n", first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "not interrupted" not in out
    assert "KeyboardInterrupt" in err
    assert "Run cut short: interrupt (exit status 130)" in err
    trace = load_trace(tmp_path / "trace.json")
    assert (trace.meta.exit_status, trace.meta.ended_by) == (130, "interrupt")
    assert {c.direction for c in trace.copies} == {"HtoD", "DtoH"}


@pytest.mark.skipif(shutil.which("memcpy-doctor") is None,
                    reason="the memcpy-doctor console script is not on PATH")
def test_console_script_passes_the_scripts_exit_status_through(tmp_path):
    write(tmp_path / "s.py", EXIT_SCRIPT)
    r = _run([shutil.which("memcpy-doctor"), "profile", "--device", "sim", "-o", "trace.json",
              "s.py", "code"], tmp_path)
    check_cut_short(r, tmp_path / "trace.json", 3, "exit")
    assert r.err.endswith("memcpy-doctor: trace written to trace.json\n")


# ---------------------------------------------------------------------------------------------
# Usage errors: one line on stderr, status 2, nothing run, nothing written.
# ---------------------------------------------------------------------------------------------

MARKER_SCRIPT = """
    open("ran.marker", "w").close()
"""


@pytest.mark.parametrize("args, needles", [
    (["profile", "--device", "sim", "-o", "trace.json", "missing.py"], ["missing.py"]),
    (["profile", "--bogus", "s.py"], ["--bogus"]),
    (["profile", "--device", "gpu", "-o", "trace.json", "s.py"], ["--device", "gpu"]),
    (["profile", "--device", "sim", "--sort", "bogus", "-o", "trace.json", "s.py"],
     ["--sort", "bogus"]),
    (["profile", "--device", "sim", "-o", "nodir/trace.json", "s.py"], ["nodir"]),
    (["profile", "--device", "sim", "--device-profile", "no-such-gpu", "-o", "trace.json",
      "s.py"], ["no-such-gpu"]),
], ids=["missing-script", "unknown-option", "bad-device", "bad-sort", "output-dir-missing",
        "unknown-device-profile"])
def test_profile_usage_errors(tmp_path, args, needles):
    """The first case as a user runs it (a subprocess), the others through main() here."""
    write(tmp_path / "s.py", MARKER_SCRIPT)
    r = (run_cli if args[-1] == "missing.py" else run_in_process)(*args, cwd=tmp_path)
    assert_usage_error(r, *needles)
    assert r.out == b""
    assert not (tmp_path / "ran.marker").exists(), "the script ran despite the usage error"
    assert not (tmp_path / "trace.json").exists()
    assert not (tmp_path / "nodir").exists()


# ---------------------------------------------------------------------------------------------
# `report`: a saved trace reprinted, sorted; unreadable traces.
# ---------------------------------------------------------------------------------------------

OPS_SCRIPT = """
    import torch
    x = torch.ones(8, device="cuda")
    for _ in range(7):
        x = x + 1
    for _ in range(5):
        x = x * 2
    for _ in range(3):
        x = x - 1
    a = torch.ones(1024, 1024, device="cuda")
    b = a @ a
    print(int(x.sum().item()))
"""

#: Event Summary of OPS_SCRIPT by total time (modeled, deterministic on the simulated GPU):
#: the one big matmul first, then the item() that waits for it to finish. By calls: 7 adds,
#: 5 muls, 3 subs, 2 ones, then the 1-call rows in name order ("G" sorts before "a").
ORDER_BY_TOTAL = ["aten::mm", "GpuMemcpySync:GPU->CPU", "aten::add", "aten::mul", "aten::sub",
                  "aten::ones", "aten::sum"]
ORDER_BY_CALLS = ["aten::add", "aten::mul", "aten::sub", "aten::ones",
                  "GpuMemcpySync:GPU->CPU", "aten::mm", "aten::sum"]


@dataclass
class OpsRun:
    root: Path
    prof: Run


@pytest.fixture(scope="module")
def ops_run(tmp_path_factory) -> OpsRun:
    root = tmp_path_factory.mktemp("ops")
    write(root / "ops.py", OPS_SCRIPT)
    prof = profile("ops.py", cwd=root, trace="ops_trace.json")
    assert prof.status == 0, prof.err
    assert prof.text == "2024\n"  # 8 * ((1 + 7) * 2**5 - 3)
    return OpsRun(root, prof)


def test_report_reprints_the_saved_report_sorted_by_calls(ops_run):
    trace = load_trace(ops_run.root / "ops_trace.json")
    by_total = render_text(trace, cwd=str(ops_run.root))
    by_calls = render_text(trace, sort="calls", cwd=str(ops_run.root))
    # `profile` printed the report, then one line about the trace; the saved trace gives it back
    assert ops_run.prof.err == by_total + "\nmemcpy-doctor: trace written to ops_trace.json\n"
    assert "Sorted by total time in descending order" in by_total
    assert event_order(by_total) == ORDER_BY_TOTAL

    r = run_cli("report", "--sort", "calls", "ops_trace.json", cwd=ops_run.root)
    assert r.status == 0, r.err
    assert r.err == ""
    assert r.text == by_calls + "\n"
    assert "Sorted by number of calls in descending order" in r.text
    assert event_order(r.text) == ORDER_BY_CALLS
    # only the order changed: the same rows, the same figures
    rows = lambda text: sorted(  # noqa: E731
        line for line in text.split("Event Summary", 1)[1].split("Sync copies", 1)[0]
        .splitlines() if line.startswith(("aten::", "Gpu")))
    assert rows(r.text) == rows(ops_run.prof.err)


def _write_bad_trace(root: Path, kind: str) -> str:
    name = f"{kind}.json"
    if kind == "missing":
        return name
    text = {
        "empty": "",
        "not-json": "this is not JSON {\n",
        "not-a-trace": json.dumps({"hello": "world", "copies": []}),
    }.get(kind)
    if kind == "schema-999":
        data = json.loads((root / "ops_trace.json").read_text())
        data["schema_version"] = 999
        text = json.dumps(data)
    (root / name).write_text(text)
    return name


@pytest.mark.parametrize("kind, needle", [
    ("missing", "cannot read"),
    ("empty", "empty"),
    ("not-json", "not valid JSON"),
    ("not-a-trace", "not a memcpy-doctor trace"),
    ("schema-999", "999"),
])
def test_report_on_an_unreadable_trace(ops_run, kind, needle):
    """Not valid JSON as a user runs it (a subprocess), the others through main() here."""
    name = _write_bad_trace(ops_run.root, kind)
    r = (run_cli if kind == "not-json" else run_in_process)("report", name, cwd=ops_run.root)
    assert_usage_error(r, name, needle)
    assert r.out == b""


# ---------------------------------------------------------------------------------------------
# --version, --help
# ---------------------------------------------------------------------------------------------

def test_version(tmp_path):
    r = run_cli("--version", cwd=tmp_path)
    assert r.status == 0, r.err
    assert r.text == f"memcpy-doctor, version {memcpy_doctor.__version__}\n"


def test_help(tmp_path):
    r = run_cli("--help", cwd=tmp_path)
    assert r.status == 0, r.err
    assert r.text.startswith("Usage: memcpy-doctor [OPTIONS] COMMAND [ARGS]...")
    assert re.search(r"^\s+profile\s", r.text, re.M)
    assert re.search(r"^\s+report\s", r.text, re.M)


def test_warnings_from_inside_ops_point_at_the_users_line(tmp_path):
    """torch warns from C++ inside an op; under the tracer the innermost Python frame is the
    tracer's, but the user must see the warning where plain Python shows it. (float(y) warns
    on torch 2.11 and 2.13, not on 2.6; the resized output warns on all three.)"""
    script = write(tmp_path / "w.py", """
        import torch
        x = torch.ones(2, requires_grad=True)
        y = (x * 2).sum()
        z = float(y)
        torch.add(x.detach(), 1, out=torch.empty(3))
        print(z)
    """)
    plain, profiled = concurrently(lambda: run_python("w.py", cwd=tmp_path),
                                   lambda: profile("w.py", cwd=tmp_path))
    assert profiled.status == plain.status == 0
    warnings = [line for line in plain.err.splitlines() if "UserWarning" in line]
    at = tuple(f"{script}:{line_of(script, snippet)}:" for snippet in ("z = float(y)", "out="))
    assert any("was resized" in w for w in warnings)
    assert all(w.startswith(at) for w in warnings)
    assert all(w in profiled.err.splitlines() for w in warnings)
    assert "memcpy_doctor" not in profiled.err.split("Profiling Report")[0]


def test_explain_and_diff_usage_errors_are_one_line(tmp_path):
    script = write(tmp_path / "s.py", """
        import torch
        t = torch.ones(3, device="cuda")
        for _ in range(3):
            t.sum().item()
    """)
    assert profile(script.name, cwd=tmp_path).status == 0
    # the commands that read the trace, side by side; each usage error after the first of a
    # command goes through main() in this process
    missing, good, bad_diff = concurrently(
        lambda: run_cli("explain", cwd=tmp_path),
        lambda: run_cli("explain", "trace.json", "--format", "markdown", cwd=tmp_path),
        lambda: run_cli("diff", "trace.json", "nope.json", cwd=tmp_path))
    # without TRACE, explain reads the default path: not written here (-o trace.json)
    assert missing.status == 2 and "memcpy_doctor_trace.json" in missing.err
    assert good.status == 0 and "## Copies the host waited for" in good.text
    assert "read once after the loop instead of 3 times at s.py:4" in good.text
    for args, bad in (
            (("explain", "trace.json", "--device-memory", "lots"),
             run_in_process("explain", "trace.json", "--device-memory", "lots", cwd=tmp_path)),
            (("explain", "nope.json"), run_in_process("explain", "nope.json", cwd=tmp_path)),
            (("diff", "trace.json", "nope.json"), bad_diff)):
        lines = bad.err.strip().splitlines()
        assert bad.status == 2 and len(lines) == 1, (args, bad.err)
        assert lines[0].startswith("memcpy-doctor: error:") and "Traceback" not in bad.err


def test_os_exit_still_writes_the_report_and_trace(tmp_path):
    """os._exit skips every cleanup; the profiler hands over the trace first."""
    write(tmp_path / "h.py", """
        import os
        import torch
        t = torch.ones(3, device="cuda")
        print(float(t.sum()), flush=True)
        os._exit(7)
    """)
    run = profile("h.py", cwd=tmp_path)
    assert run.status == 7 and run.text == "3.0\n"
    assert "Run cut short: os._exit (exit status 7)" in run.err
    trace = load_trace(tmp_path / "trace.json")
    assert (trace.meta.exit_status, trace.meta.ended_by) == (7, "os._exit")
    assert [c.trigger for c in trace.copies] == ["float"]


def test_nested_modes_and_profilers(tmp_path):
    """A script's own TorchDispatchMode and torch.profiler work under the tool; its own
    memcpy_doctor.profiler() fails with a clear message, and the trace so far is kept."""
    write(tmp_path / "n.py", """
        import torch
        from torch.profiler import ProfilerActivity, profile
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            n = 0
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Count.n += 1
                return func(*args, **(kwargs or {}))

        x = torch.ones(4, device="cuda")
        with Count():
            y = (x * 2).sum()
        with profile(activities=[ProfilerActivity.CPU]) as p:
            z = (x + 1).sum().item()
        print(Count.n, float(y), z, len(p.key_averages()) > 0, flush=True)
        import memcpy_doctor
        with memcpy_doctor.profiler():
            pass
    """)
    run = profile("n.py", cwd=tmp_path)
    assert run.text == "2 8.0 8.0 True\n"
    assert run.status == 1
    assert "RuntimeError: a memcpy-doctor tracer is already running in this process" in run.err
    trace = load_trace(tmp_path / "trace.json")
    assert sorted(c.trigger for c in trace.copies) == ["float", "item"]
    assert trace.meta.ended_by == "exception"
