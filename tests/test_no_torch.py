"""The commands that read traces import neither torch nor the tracer, and neither does
`import memcpy_doctor` (issue 33): importing torch takes a second and hundreds of MB, which a
CI gate would pay on every call.

Each command runs in a fresh interpreter whose import system refuses torch: a meta path
finder gives torch a loader that raises when `import torch` runs it (an error no `except
ImportError` swallows, whose traceback shows the chain of imports that asked for it), while
looking torch up without importing it still works. After the command, the child
prints which of torch and the tracer are loaded, and the test requires neither. The traces
are small and saved here: the hand-built trace of helpers.py and the hand-written
torch.profiler traces of test_kineto.py and test_kineto_calibrate.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import make_trace
from test_kineto import kineto_trace
from test_kineto_calibrate import calibration_trace

#: Run in the child: refuse torch, run what follows, then print what got loaded. `{code}`
#: is the code to run; `SystemExit` is the command's ordinary end.
CHILD = """
import json
import sys

class RefuseTorch:
    # finds torch as the other finders do (so that looking it up, as core/paths.py does,
    # still works), with a loader that refuses to run it

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = self
                return spec
        return None

    def create_module(self, spec):
        raise RuntimeError(f"torch imported: {{spec.name}}")

    def exec_module(self, module):  # not reached: create_module refuses first
        raise RuntimeError(f"torch imported: {{module.__name__}}")

sys.meta_path.insert(0, RefuseTorch())
try:
{code}
except SystemExit as e:
    print("exit status", e.code, file=sys.stderr)
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(
    ("torch.", "memcpy_doctor.tracer", "memcpy_doctor.guards", "memcpy_doctor.api")))
print("LOADED", json.dumps(loaded))
"""


def run_refusing_torch(code: str, cwd: Path) -> tuple[list[str], str]:
    """Run `code` in a fresh interpreter that refuses to import torch; the modules of torch,
    the tracer, the guards and the API loaded at its end, and its stderr. Fails the test
    when the child failed (a refused torch import among the reasons)."""
    body = "\n".join("    " + line for line in code.strip().splitlines())
    done = subprocess.run([sys.executable, "-c", CHILD.format(code=body)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("LOADED "), done.stdout
    return json.loads(last[len("LOADED "):]), done.stderr  # the names the child printed


def run_command_refusing_torch(args: list[str], cwd: Path) -> tuple[list[str], str]:
    """`memcpy-doctor ARGS` through the CLI's main(), as the command runs it."""
    return run_refusing_torch(f"from memcpy_doctor.cli import main\nmain({args!r})", cwd)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """A folder with a memcpy-doctor trace (t.json), a torch.profiler trace (k.json, and
    gzip-compressed as k.json.gz) and one with copies of every kind to fit (fit.json)."""
    import gzip
    folder = tmp_path_factory.mktemp("traces")
    make_trace().save(str(folder / "t.json"))
    (folder / "k.json").write_text(json.dumps(kineto_trace()))
    (folder / "k.json.gz").write_bytes(gzip.compress(json.dumps(kineto_trace()).encode()))
    (folder / "fit.json").write_text(json.dumps(calibration_trace()))
    return folder


COMMANDS = {
    "report": ["report", "t.json"],
    "check": ["check", "t.json", "--max", "sync_calls=100"],
    "check failing": ["check", "t.json", "--max", "sync_calls=0", "--format", "sarif"],
    "explain": ["explain", "t.json"],
    "explain json": ["explain", "t.json", "--format", "json"],
    "explain log": ["explain", "t.json", "--log"],
    "diff": ["diff", "t.json", "t.json"],
    "report of a torch.profiler trace": ["report", "k.json"],
    "report of a .json.gz": ["report", "k.json.gz"],
    "explain of a torch.profiler trace": ["explain", "k.json"],
    "import": ["import", "k.json", "-o", "imported.json"],
    "calibrate --from-trace": ["calibrate", "--from-trace", "fit.json", "-o", "fit_out.json"],
    "a usage error": ["report", "missing.json"],
}
#: The commands above that end with another status than 0.
EXIT_STATUS = {"check failing": 1, "a usage error": 2}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_trace_command_imports_neither_torch_nor_the_tracer(traces, name):
    loaded, stderr = run_command_refusing_torch(COMMANDS[name], traces)
    assert loaded == [], f"{name} loaded {loaded}"
    status = re.search(r"exit status (\d+)", stderr)  # none: main() returned
    assert (int(status.group(1)) if status else 0) == EXIT_STATUS.get(name, 0), stderr


def test_import_memcpy_doctor_imports_no_torch_and_its_trace_names_need_none(tmp_path):
    loaded, _ = run_refusing_torch("""
import memcpy_doctor
from memcpy_doctor import Trace, TraceError, load_trace, render_text
assert memcpy_doctor.__version__
""", tmp_path)
    assert loaded == []


def test_the_child_does_catch_an_import_of_torch(tmp_path):
    """The check itself: the profile of a script does import torch, and the child says so."""
    (tmp_path / "s.py").write_text("x = 1\n")
    done = subprocess.run([sys.executable, "-c", CHILD.format(
        code="    from memcpy_doctor.cli import main\n    main(['profile', 's.py'])")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "RuntimeError: torch imported: torch" in done.stderr


def test_the_public_names_load_on_first_use_as_before():
    """The names that need torch resolve to the same objects as their modules' (PEP 562),
    and are then kept on the package."""
    import memcpy_doctor
    from memcpy_doctor.api import profiler
    from memcpy_doctor.guards.device import device_guard
    from memcpy_doctor.guards.transfer import TransferGuardError, transfer_guard
    from memcpy_doctor.tracer import Tracer
    from memcpy_doctor.tracer.optable import register_sync_op
    expected = {"profiler": profiler, "device_guard": device_guard,
                "transfer_guard": transfer_guard, "TransferGuardError": TransferGuardError,
                "Tracer": Tracer, "register_sync_op": register_sync_op}
    for name, value in expected.items():
        assert getattr(memcpy_doctor, name) is value
        assert vars(memcpy_doctor)[name] is value
    assert set(expected) < set(memcpy_doctor.__all__) and set(expected) < set(dir(memcpy_doctor))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        memcpy_doctor.not_a_name  # noqa: B018
