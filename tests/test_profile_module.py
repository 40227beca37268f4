"""`memcpy-doctor profile -m MODULE [ARGS]...` runs the module as `python -m MODULE ARGS`
does (issue 44), in every mode, and a module that does not exist is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli_in_process
from memcpy_doctor.cli import cli
from memcpy_doctor.run.modules import module_argv
from memcpy_doctor.core.trace import Trace

#: What the module reports of how it runs, then a loop of three reads from the device.
TRAIN = """\
import json, sys
import torch
from .helper import scale
print(json.dumps({"argv": sys.argv, "name": __name__, "package": __package__,
                  "path0": sys.path[0], "spec": __spec__.name}))
x = torch.ones(4, device="cuda")
for _ in range(3):
    s = scale(x).sum().item()
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("def scale(x):\n    return x * 2\n")
    (pkg / "train.py").write_text(TRAIN)
    (pkg / "__main__.py").write_text("from pkg import train  # noqa: F401\n")
    return tmp_path


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memcpy_doctor", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_the_module_runs_as_python_dash_m_runs_it(project):
    r = _run("profile", "--device", "sim", "-o", "t.json", "-m", "pkg.train", "--epochs", "3",
             "-x", cwd=project)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.splitlines()[0])
    assert seen == {"argv": [str(project / "pkg" / "train.py"), "--epochs", "3", "-x"],
                    "name": "__main__", "package": "pkg", "path0": str(project),
                    "spec": "pkg.train"}
    trace = Trace.load(project / "t.json")
    [copy] = [c for c in trace.copies if c.sync]
    assert (copy.trigger, copy.calls, copy.site.file, copy.site.line) == (
        "item", 3, str(project / "pkg" / "train.py"), 8)
    assert trace.meta.command == ["memcpy-doctor", "profile", "-m", "pkg.train", "--epochs",
                                  "3", "-x"]
    assert "DtoH item  pkg/train.py:8" in r.stderr  # the site, relative to where it ran


def test_a_package_runs_its_main(project):
    r = _run("profile", "--device", "sim", "-o", "t.json", "-m", "pkg", cwd=project)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["name"] == "pkg.train"  # imported by __main__
    assert [c.calls for c in Trace.load(project / "t.json").copies if c.sync] == [3]


@pytest.mark.parametrize("name, why", [
    ("nope.mod", "-m nope.mod: error while finding module specification for 'nope.mod' "
                 "(ModuleNotFoundError: No module named 'nope')"),
    ("pkg.nope", "-m pkg.nope: no module named pkg.nope"),
    (".pkg", "-m .pkg: '.pkg': relative module names are not supported"),
])
def test_a_module_that_does_not_exist_is_one_line(project, name, why):
    r = cli_in_process("profile", "--device", "sim", "-m", name, cwd=project)
    assert (r.status, r.err) == (2, f"memcpy-doctor: error: {why}\n")
    (project / "nomain").mkdir()
    (project / "nomain" / "__init__.py").write_text("")
    r = cli_in_process("profile", "-m", "nomain", cwd=project)
    assert r.status == 2 and "'nomain' is a package and cannot be directly executed" in r.err
    r = cli_in_process("profile", cwd=project)
    assert r.status == 2 and "missing SCRIPT (or -m MODULE)" in r.err


def test_light_ranks_apply_and_verify_take_the_module(project):
    r = _run("profile", "--light", "--device", "sim", "-o", "l.json", "-m", "pkg.train",
             cwd=project)
    assert r.returncode == 0, r.stderr
    assert [c.calls for c in Trace.load(project / "l.json").copies if c.sync] == [3]
    r = _run("profile", "--ranks", "2", "--device", "sim", "-o", "r.json", "-m", "pkg.train",
             cwd=project)
    assert r.returncode == 0, r.stderr
    assert sorted(Trace.load(project / f"r.rank{k}.json").meta.rank for k in (0, 1)) == [0, 1]
    edits = {"suggestions": [{"apply": {
        "kind": "device_guard", "device": "cpu",
        "sites": [{"file": str(project / "pkg" / "train.py"), "line": 8}]}}]}
    (project / "edits.json").write_text(json.dumps(edits))
    r = _run("profile", "--device", "sim", "-o", "a.json", "--apply", "edits.json", "-m",
             "pkg.train", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "not applied" not in r.stderr  # the module's own file takes the edit
    # the line ran on the host: its input goes there, no `item` waits on the device
    assert {c.trigger for c in Trace.load(project / "a.json").copies if c.sync} == {"to"}
    r = _run("explain", "--verify", "-m", "pkg.train", "--device", "sim", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "pkg/train.py:8" in r.stdout
    r = cli_in_process("explain", "--verify", "-m", "pkg.nope", cwd=project)
    assert (r.status, r.err) == (2, "memcpy-doctor: error: -m pkg.nope: no module named "
                                    "pkg.nope\n")


@pytest.mark.parametrize("argv, expected", [
    (["profile", "-m", "pkg.train", "--epochs", "3"],
     ["profile", "-m", "pkg.train", "--", "--epochs", "3"]),
    (["profile", "-o", "-m", "x.py"], ["profile", "-o", "-m", "x.py"]),  # -o's value
    (["profile", "--device", "sim", "--module=pkg", "-x"],
     ["profile", "--device", "sim", "--module=pkg", "--", "-x"]),
    (["profile", "train.py", "-m", "x"], ["profile", "train.py", "-m", "x"]),  # the script's
    (["explain", "--verify", "-m", "pkg.train", "--", "-x"],
     ["explain", "--verify-module", "pkg.train", "--", "-x"]),
    (["report", "-m"], ["report", "-m"]),
])
def test_the_command_line_stops_at_the_module_as_python_does(argv, expected):
    assert module_argv(argv, cli.commands) == expected
