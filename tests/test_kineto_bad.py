"""Torch.profiler traces memcpy-doctor cannot read, or only in part: truncated, malformed,
CPU only, a range profiler's (runtime calls, no device rows), another vendor's copy names.
Each gets one clear line and exit status 2, or a report that says what was missing; never a
traceback (the CLI as a subprocess for one of them, through its entry point in this process for
the others; calibrate --from-trace through its library call)."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli_in_process, make_trace
from memcpy_doctor.kineto import events, stream
from memcpy_doctor.kineto.reader import load_any
from memcpy_doctor.run.calibrate import CalibrationError
from memcpy_doctor.run.calibrate_trace import trace_timings


def _x(cat: str, name: str, ts: object, dur: object = 5, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


GOOD = {"schemaVersion": 1, "traceEvents": [
    _x("cuda_runtime", "cudaMemcpyAsync", 0, 5, correlation=1),
    _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 1, 2, correlation=1, bytes=64)]}
TEXT = json.dumps(GOOD)

#: name -> (file content, what stderr says)
BAD = {
    "truncated.json.gz": (gzip.compress(TEXT.encode())[:40], "truncated or corrupt .gz"),
    "truncated.json": (TEXT[:60].encode(), "not valid JSON"),
    "empty.json": (b"", "empty file"),
    "cpu_only.json": (json.dumps({"schemaVersion": 1, "traceEvents": [
        _x("cpu_op", "aten::add", 0)]}).encode(), "no CUDA activity"),
    "bad_times.json": (json.dumps({"schemaVersion": 1, "traceEvents": [
        _x("cuda_runtime", "cudaMemcpyAsync", "soon", correlation=1),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1, 2, correlation=1,
           bytes=64)]}).encode(), "this version cannot read"),
    "bad_args.json": (json.dumps({"schemaVersion": 1, "traceEvents": [
        {**_x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1), "args": [1]}]}).encode(),
        "this version cannot read"),
    "list_field.json": (json.dumps({"schemaVersion": 1, "traceEvents": [
        _x("cuda_runtime", "cudaMemcpyAsync", 0, correlation=[1]),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1, 2, correlation=1,
           bytes={"n": 64})]}).encode(), "this version cannot read"),
    "huge_time.json": (TEXT.replace('"dur": 2', '"dur": 1e400').encode(),
                       "this version cannot read"),
}


def _cli(*args: object, cwd: Path) -> tuple[int, str, str]:
    """`memcpy-doctor ARGS` as a user runs it: (exit status, stdout, stderr)."""
    r = subprocess.run([sys.executable, "-m", "memcpy_doctor", *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def _in_process(*args: object, cwd: Path) -> tuple[int, str, str]:
    """The same through the console script's entry point, in this process."""
    r = cli_in_process(*args, cwd=cwd)
    return r.status, r.out, r.err


#: The case run as a real subprocess; the others go through main() in this process.
AS_A_USER_RUNS_IT = "truncated.json.gz"


@pytest.mark.parametrize("name", sorted(BAD))
def test_an_unreadable_trace_is_one_line_and_status_2(tmp_path, name):
    content, message = BAD[name]
    (tmp_path / name).write_bytes(content)
    run = _cli if name == AS_A_USER_RUNS_IT else _in_process
    status, out, err = run("report", name, cwd=tmp_path)
    assert status == 2, out
    assert err.startswith(f"memcpy-doctor: error: {name}: ") and message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    if name not in ("cpu_only.json", "range_profiler.json"):  # these two just have no copies
        with pytest.raises(CalibrationError, match=message):
            trace_timings([str(tmp_path / name)])


def test_a_store_sqlite_cannot_keep_is_one_line_and_status_2(tmp_path, monkeypatch):
    """Where SQLite cannot write its temporary file (a full disk), the user is told which
    setting names its folder."""
    def full(self, rows):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(events.Events, "_write", full)
    (tmp_path / "k.json").write_text(TEXT)
    status, out, err = _in_process("report", "k.json", cwd=tmp_path)
    assert status == 2, out
    assert err == ("memcpy-doctor: error: k.json: reading it needs a temporary file, which "
                   "SQLite could not keep (database or disk is full); SQLITE_TMPDIR names "
                   "the folder it uses\n")


def test_a_python_without_sqlite3_says_so_for_a_kineto_trace_only(tmp_path, monkeypatch):
    """A Python built without sqlite3 (pyenv without SQLite's headers) cannot keep the store:
    one line for a torch.profiler trace; a memcpy-doctor trace still reads."""
    monkeypatch.setattr(events, "sqlite3", None)
    monkeypatch.setattr(events, "STORE_ERRORS", ())
    monkeypatch.setattr(stream, "STORE_ERRORS", ())
    monkeypatch.setattr(stream, "sqlite3", None)
    (tmp_path / "k.json").write_text(TEXT)
    status, out, err = _in_process("report", "k.json", cwd=tmp_path)
    assert status == 2, out
    assert err == f"memcpy-doctor: error: k.json: {events.NO_SQLITE}\n"
    make_trace().save(str(tmp_path / "ours.json"))
    assert load_any(str(tmp_path / "ours.json")).copies


def test_copies_of_an_unfamiliar_kind_are_named_in_the_report(tmp_path):
    data = json.loads(TEXT)
    data["traceEvents"] += [  # a ROCm-style name the reader does not know
        _x("cuda_runtime", "hipMemcpyWithStream", 10, 5, correlation=2),
        _x("gpu_memcpy", "CopyHostToDevice", 11, 2, correlation=2, bytes=64)]
    (tmp_path / "rocm.json").write_text(json.dumps(data))
    status, out, err = _in_process("report", "rocm.json", cwd=tmp_path)
    assert status == 0, err
    assert ("1 gpu_memcpy events of a kind this version does not read (such as "
            "'CopyHostToDevice'; HtoH, or another vendor's)") in out
