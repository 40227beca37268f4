"""Bad traces given to explain, check and diff: one line on stderr naming the file and the
problem, exit status 2, no traceback; for every kind of bad file, and (hypothesis) for any
bytes and any truncation of a good trace. In this process: `main()` is what the console
script runs (tests/test_cli.py covers the same path through a real subprocess)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import make_trace
from memcpy_doctor.cli import main
from memcpy_doctor.core.defaults import SCHEMA_VERSION

GOOD = make_trace().to_json()


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
    return status, out.getvalue(), err.getvalue()


def commands(bad: str, good: str) -> list[tuple[str, ...]]:
    """Each command with `bad` where a trace goes (for diff: either side)."""
    return [("explain", bad), ("explain", "--format", "json", bad),
            ("check", bad, "--max", "sync_calls=0"), ("diff", bad, good), ("diff", good, bad),
            ("report", bad)]


def assert_one_line(status: int, out: str, err: str, *needles: str) -> None:
    assert status == 2, (status, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("memcpy-doctor: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _future() -> str:
    data = json.loads(GOOD)
    data["schema_version"] = SCHEMA_VERSION + 1
    return json.dumps(data)


def _inner(path: list, value) -> str:
    data = json.loads(GOOD)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(data)


BAD_TEXT = {
    "empty": ("", "empty file"),
    "whitespace": ("  \n\t\n", "empty file"),
    "truncated": (GOOD[: len(GOOD) // 2], "not valid JSON"),
    "not-json": ("memcpy, doctor\n1,2\n", "not valid JSON"),
    "json-list": ("[1, 2, 3]", "not a memcpy-doctor trace"),
    "json-number": ("42", "not a memcpy-doctor trace"),
    "foreign-object": (json.dumps({"name": "pkg", "version": "1.0"}),
                       "not a memcpy-doctor trace"),
    # (a Chrome trace is read as torch.profiler's, which this one cannot be)
    "chrome-trace": (json.dumps({"traceEvents": [{"ph": "X", "ts": 0}]}),
                     "trace with no CUDA activity"),
    "future-schema": (_future(), f"schema_version {SCHEMA_VERSION + 1} is not supported"),
    "schema-as-text": (_inner(["schema_version"], "1"), "schema_version '1'"),
    "schema-zero": (_inner(["schema_version"], 0), "schema_version 0"),
    "bad-field": (_inner(["summary", "total_ns"], "ten"), "malformed trace"),
    "missing-part": (_inner(["copies"], None), "malformed trace"),
}


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
def test_bad_trace_text(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    text, needle = BAD_TEXT[kind]
    (tmp_path / "bad.json").write_text(text)
    (tmp_path / "good.json").write_text(GOOD)
    for args in commands("bad.json", "good.json"):
        assert_one_line(*run(*args), "bad.json", needle)


def test_binary_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    (tmp_path / "good.json").write_text(GOOD)
    for args in commands("bad.json", "good.json"):
        assert_one_line(*run(*args), "bad.json", "not a text file")


def test_missing_directory_and_unreadable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.json").write_text(GOOD)
    for args in commands("missing.json", "good.json"):
        assert_one_line(*run(*args), "missing.json", "cannot read")
    (tmp_path / "adir").mkdir()  # a folder is read as the traces in it: here, none
    for args in commands("adir", "good.json"):
        assert_one_line(*run(*args), "adir", "a folder with no trace file in it")
    os.symlink("nowhere.json", "dangling.json")
    for args in commands("dangling.json", "good.json"):
        assert_one_line(*run(*args), "dangling.json")
    if os.geteuid() != 0:  # root reads any file
        (tmp_path / "locked.json").write_text(GOOD)
        os.chmod(tmp_path / "locked.json", 0)
        for args in commands("locked.json", "good.json"):
            assert_one_line(*run(*args), "locked.json", "cannot read")


def test_a_bad_rank_trace_among_good_ones_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for r in (0, 1):
        make_trace(rank=r, world_size=3).save(f"t.rank{r}.json")
    (tmp_path / "t.rank2.json").write_text(GOOD[:100])
    for args in (("explain", "t.json"), ("check", "t.json", "--max", "sync_calls=0"),
                 ("diff", "t.json", "t.rank0.json"), ("explain", "t.rank*.json")):
        assert_one_line(*run(*args), "t.rank2.json", "not valid JSON")
    assert_one_line(*run("explain", "u.rank*.json"), "u.rank*.json", "no trace file matches")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_any_bytes_give_one_clear_line(data):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        with open(path, "wb") as f:
            f.write(data)
        for args in (("explain", path), ("check", path, "--max", "sync_calls=0"),
                     ("diff", path, path)):
            assert_one_line(*run(*args), path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(min_value=0, max_value=len(GOOD) - 1))
def test_any_truncation_of_a_trace_gives_one_clear_line(cut):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        with open(path, "w") as f:
            f.write(GOOD[:cut])
        for args in (("explain", path), ("check", path, "--max", "sync_calls=0")):
            assert_one_line(*run(*args), path)
