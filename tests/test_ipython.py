"""The IPython extension (issue 44): `%load_ext memcpy_doctor`, `%%memcpy_doctor` profiles a
cell and `%memcpy_doctor` a line; the cell's outputs, names and errors are its own; the trace
displays itself as HTML in a notebook and as the text report in a terminal."""

from __future__ import annotations

import re
import pytest

IPython = pytest.importorskip("IPython")

from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from memcpy_doctor.core.trace import Trace  # noqa: E402
from memcpy_doctor.run.ipython import TRACE_NAME, parse_options  # noqa: E402

CELL = """\
import torch
x = torch.ones(4, device="cuda")
total = 0.0
for _ in range(3):
    total += x.sum().item()
print("printed by the cell", total)
total
"""


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "memcpy_doctor")
    yield ip
    InteractiveShell.clear_instance()


def test_a_cell_is_profiled_with_its_output_and_names_its_own(shell):
    with capture_output() as out:
        result = shell.run_cell("%%memcpy_doctor --device sim\n" + CELL)
    assert result.success and result.result == 12.0  # the cell's value, as the cell's Out
    assert "printed by the cell 12.0" in out.stdout
    assert shell.user_ns["total"] == 12.0
    trace = shell.user_ns[TRACE_NAME]
    assert isinstance(trace, Trace) and trace.meta.simulated
    [copy] = [c for c in trace.copies if c.sync]
    assert (copy.trigger, copy.calls, copy.site.line) == ("item", 3, 5)
    shown = [o.data for o in out.outputs]
    html = [d["text/html"] for d in shown if "text/html" in d]
    assert len(html) == 1 and "3 sync copies" in html[0] and "Sync copies" in html[0]
    # the report page in an iframe of its own: its styles cannot reach the notebook
    assert html[0].count("<iframe srcdoc=") == 1 and "<style" not in html[0]


def test_a_line_is_profiled_and_saved(shell, tmp_path):
    shell.run_cell("import torch")  # (the simulated GPU exists while the line is profiled)
    path = tmp_path / "t.json"
    with capture_output():
        shell.run_line_magic("memcpy_doctor", f"--device sim -o {path} "
                             "v = torch.arange(3.0, device='cuda').tolist()")
    assert shell.user_ns["v"] == [0.0, 1.0, 2.0]
    assert [c.trigger for c in Trace.load(path).copies if c.sync] == ["tolist"]


def test_an_error_in_the_cell_is_the_cells_and_the_tracer_stops(shell):
    """The cell fails as it would without the magic (Run All stops there), its traceback
    shown once; the trace of what ran is displayed all the same."""
    with capture_output() as out:
        result = shell.run_cell("%%memcpy_doctor --device sim\nimport torch\n"
                                "z = torch.ones(2, device='cuda').sum().item()\n"
                                "raise ValueError('from the cell')\n")
    assert isinstance(result.error_in_exec, ValueError)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout)  # (IPython colours its tracebacks)
    assert plain.count("ValueError: from the cell") == 1
    assert shell.user_ns["z"] == 2.0
    assert [c.calls for c in shell.user_ns[TRACE_NAME].copies if c.sync] == [1]
    assert any("text/html" in o.data for o in out.outputs)
    # (the conftest fixture fails the test if a tracer is still active)


def test_light_mode_on_the_simulated_gpu(shell):
    with capture_output():
        shell.run_cell_magic("memcpy_doctor", "--light --device sim",
                             "import torch\nw = torch.ones(2, device='cuda').sum().item()\n")
    trace = shell.user_ns[TRACE_NAME]
    assert trace.meta.light and [c.trigger for c in trace.copies if c.sync] == ["item"]


@pytest.mark.parametrize("line, why", [
    ("--frobnicate", "unknown option '--frobnicate'"),
    ("--device", "unknown option '--device' \\(or no value\\)"),
    ("--device tpu", "--device 'tpu': one of auto, cuda, sim"),
    ("--sort fastest", "--sort 'fastest': one of calls, total, max, min, ave"),
])
def test_bad_options_are_one_usage_line_and_nothing_runs(shell, line, why):
    with pytest.raises(UsageError, match=why):
        shell.run_cell_magic("memcpy_doctor", line, "ran = True\n")
    assert "ran" not in shell.user_ns
    with pytest.raises(UsageError, match="no statement"):
        shell.run_line_magic("memcpy_doctor", "--device sim")


def test_options_and_the_statement_after_them():
    assert parse_options("--device sim --light -o 'a b.json' x = f('--light')") == (
        {"device": "sim", "light": True, "output": "a b.json", "sort": "total"},
        "x = f('--light')")


def test_a_trace_shows_its_report_as_text_in_a_terminal(shell):
    """IPython's plain-text display (what a terminal shows) is the report, once loaded;
    elsewhere a trace's repr is one line."""
    from helpers import make_trace
    data, _ = shell.display_formatter.format(make_trace())
    assert data["text/plain"].splitlines()[0] == (
        "-------------------------      Profiling Report       -------------------------")
    assert "Sync copies" in data["text/html"]
    assert repr(make_trace()) == ("<Trace of simulated NVIDIA A100-SXM4-80GB: 10 ms, 19 "
                                  "copies, 14 waited for>")
