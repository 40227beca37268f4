"""The text Profiling Report: golden file, sort keys, Place line, paths, no global changes.

Regenerate the golden file after an intended change to the report with
``MEMCPY_DOCTOR_REGEN_GOLDEN=1 python -m pytest tests/test_render_text.py``, then read the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tabulate

from helpers import PROJECT_DIR, make_copies, make_trace
from memcpy_doctor.core.defaults import REPORT_SYNC_SITES, SORT_KEYS
from memcpy_doctor.core.paths import format_site, short_path
from memcpy_doctor.render.text import format_ref, plain_table, render_text
from memcpy_doctor.core.trace import CopyRecord, OpRef, Site

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("MEMCPY_DOCTOR_REGEN_GOLDEN") == "1"

EVENT_NAMES = ("aten::mm", "aten::add", "GpuMemcpySync:CPU->GPU", "GpuMemcpyAsync:GPU->CPU")


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if REGEN:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.skip(f"wrote {path}")
    assert text == path.read_text(encoding="utf-8")


def test_report_matches_golden_file():
    check_golden("report_basic.txt", render_text(make_trace(), cwd=PROJECT_DIR))


def peak_and_pageable_trace():
    """The hand-built trace with a device memory peak, and its host->device copy as one that
    asked non_blocking=True from pageable memory (sync: the host stages it)."""
    trace = make_trace()
    trace.summary.peak_device_memory_bytes = 614_465_536
    trace.copies[0].non_blocking = True
    return trace


def test_report_with_peak_and_pageable_non_blocking_copies_matches_golden_file():
    check_golden("report_peak_pageable.txt",
                 render_text(peak_and_pageable_trace(), cwd=PROJECT_DIR))


def section(report: str, title: str) -> list[str]:
    """The lines of one banner section, without blank lines."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("-") and title in line)
    out = []
    for line in lines[start + 1:]:
        if line.startswith("-" * 25):
            break
        if line.strip():
            out.append(line)
    return out


def event_order(report: str) -> list[str]:
    rows = section(report, "Event Summary")[1:]  # after the header
    return [row.split()[0] for row in rows]


def test_header_lines():
    lines = render_text(make_trace(), cwd=PROJECT_DIR).splitlines()
    assert lines[0] == "-" * 25 + "      Profiling Report       " + "-" * 25
    assert lines[2] == ("Place: CUDA:0 (simulated NVIDIA A100-SXM4-80GB; device, copy and "
                        "host times are modeled, not measured)")
    assert lines[3] == "Time unit: ms"
    assert lines[4] == "Sorted by total time in descending order in the same thread"
    assert lines[5] == ""  # a trace from before wall time was kept: no measured line


def test_measured_wall_time_is_one_labelled_line_outside_the_figures():
    trace = make_trace()
    trace.meta.wall_ns = 123_000_000
    lines = render_text(trace, cwd=PROJECT_DIR).splitlines()
    assert lines[5] == ("Measured on this machine, with tracing: wall time 123 "
                        "(in no figure below)")
    assert [line for line in lines if "123" in line] == [lines[5]]
    trace.meta.simulated = False  # a real GPU's total is the wall time: no second line
    assert "Measured on this machine" not in render_text(trace, cwd=PROJECT_DIR)


def test_summary_lines():
    report = render_text(make_trace(), cwd=PROJECT_DIR)
    assert "Total time: 10\n" in report
    assert "  Computation time       Total: 5           Ratio: 50%\n" in report
    assert "  Framework overhead     Total: 5           Ratio: 50%\n" in report
    assert section(report, "GpuMemCpy Summary") == [
        "GpuMemcpy                Calls: 19          Total: 4           Ratio: 40%",
        "  GpuMemcpyAsync         Calls: 5           Total: 1           Ratio: 10%",
        "  GpuMemcpySync          Calls: 14          Total: 3           Ratio: 30%",
        # (the hand-built copies keep no times, so both repeated sync paths count; 10 steps:
        # the mm's calls, the commonest count of the device ops)
        "  GpuMemcpySync per step Calls: 1.4         Total: 0.3         Steps: 10, estimated "
        "(setup and one-off: 0 calls, 0)",
        # (issue 43) each copy path's rate beside the device profile's figure for it
        "  Copy path      Calls    Sync    Bytes    Device time    GB/s     Profile GB/s",
        "  HtoD pageable  4        4       4.0 KiB  0.5            0.00819  12 (0.068%)",
        "  DtoH pageable  10       10      40 B     0.1            0.0004   10 (0.004%)",
        "  DtoH pinned    5        0       1.9 MiB  0.5            4        25 (16%)",
        "  (GB/s: bytes over the copies' device time; profile: a100-sxm4-80gb, shipped for "
        "NVIDIA A100-SXM4-80GB)",
    ]


def test_event_rows_figures():
    rows = section(render_text(make_trace(), cwd=PROJECT_DIR), "Event Summary")
    assert rows[0].split() == ["Event", "Calls", "Total", "CPU", "Time", "(Ratio)", "GPU",
                               "Time", "(Ratio)", "Min.", "Max.", "Ave.", "Ratio."]
    assert rows[1].split() == ["aten::mm", "10", "4", "1.000000", "(0.250000)", "3.000000",
                               "(0.750000)", "0.3", "0.8", "0.4", "0.4"]
    assert rows[4].split() == ["GpuMemcpyAsync:GPU->CPU", "5", "1", "0.500000", "(0.500000)",
                               "0.500000", "(0.500000)", "0.05", "0.35", "0.2", "0.1"]


@pytest.mark.parametrize("sort, order, words", [
    ("total", ["aten::mm", "aten::add", "GpuMemcpySync:CPU->GPU", "GpuMemcpyAsync:GPU->CPU"],
     "total time"),
    ("calls", ["aten::add", "aten::mm", "GpuMemcpyAsync:GPU->CPU", "GpuMemcpySync:CPU->GPU"],
     "number of calls"),
    ("max", ["aten::mm", "GpuMemcpySync:CPU->GPU", "GpuMemcpyAsync:GPU->CPU", "aten::add"],
     "maximum time"),
    ("min", ["GpuMemcpySync:CPU->GPU", "aten::mm", "aten::add", "GpuMemcpyAsync:GPU->CPU"],
     "minimum time"),
    ("ave", ["GpuMemcpySync:CPU->GPU", "aten::mm", "GpuMemcpyAsync:GPU->CPU", "aten::add"],
     "average time"),
])
def test_sort_keys(sort, order, words):
    report = render_text(make_trace(), sort=sort, cwd=PROJECT_DIR)
    assert event_order(report) == order
    assert f"Sorted by {words} in descending order in the same thread" in report


def test_every_sort_key_is_tested_and_gives_a_different_order():
    orders = {tuple(event_order(render_text(make_trace(), sort=s, cwd=PROJECT_DIR)))
              for s in SORT_KEYS}
    assert len(orders) == len(SORT_KEYS) == 5
    assert all(sorted(o) == sorted(EVENT_NAMES) for o in orders)


def test_ties_are_broken_by_name():
    trace = make_trace()
    for e in trace.events:
        e.calls = 7
    report = render_text(trace, sort="calls", cwd=PROJECT_DIR)
    assert event_order(report) == sorted(EVENT_NAMES)


def test_bad_sort_key_raises_value_error():
    with pytest.raises(ValueError, match="sort must be one of calls, total, max, min, ave"):
        render_text(make_trace(), sort="name", cwd=PROJECT_DIR)


def test_completed_run_has_no_cut_short_line():
    assert "Run cut short" not in render_text(make_trace(), cwd=PROJECT_DIR)


def test_interrupted_run_says_so():
    report = render_text(make_trace(ended_by="interrupt", exit_status=130), cwd=PROJECT_DIR)
    lines = report.splitlines()
    assert lines[5] == "Run cut short: interrupt (exit status 130)"


def test_untraced_line():
    report = render_text(make_trace(untraced=["torch.compile regions", "C extensions"]),
                         cwd=PROJECT_DIR)
    assert "\nNot traced: torch.compile regions; C extensions\n" in report


def test_real_gpu_place_line_is_not_simulated():
    trace = make_trace(device="cuda", simulated=False, device_name="NVIDIA H100 80GB HBM3")
    report = render_text(trace, cwd=PROJECT_DIR)
    place = next(line for line in report.splitlines() if line.startswith("Place:"))
    assert place == "Place: CUDA:0 (NVIDIA H100 80GB HBM3)"
    assert "simulated" not in report
    assert "modeled" not in report


def test_sync_copies_table():
    rows = section(render_text(make_trace(), cwd=PROJECT_DIR), "Sync copies")
    assert [r.split() for r in rows] == [
        ["Copy", "Site", "Calls", "Bytes", "Total", "Producer", "->", "Consumer"],
        ["HtoD", "to", "train.py:42", "4", "4096", "2", "aten::arange", "[cpu]", "at",
         "data.py:10", "->", "aten::mm", "[cuda:0]", "at", "model.py:20"],
        ["DtoH", "item", "train.py:50", "10", "40", "1", "aten::add", "[cuda:0]", "at",
         "model.py:25", "->", "-"],
    ]


def test_sync_copies_sorted_by_time_then_calls():
    trace = make_trace()
    trace.copies[0].host_ns = 500_000  # HtoD now 1 ms, like the item copy; fewer calls
    rows = section(render_text(trace, cwd=PROJECT_DIR), "Sync copies")
    assert rows[1].startswith("DtoH item")
    assert rows[2].startswith("HtoD to")


def test_no_sync_copies():
    trace = make_trace(copies=[c for c in make_copies() if not c.sync])
    report = render_text(trace, cwd=PROJECT_DIR)
    assert section(report, "Sync copies") == ["No copies the host waited for."]
    assert "  GpuMemcpySync          Calls: 0           Total: 0           Ratio: 0%" in report


def test_sync_copies_are_cut_at_the_report_limit():
    copies = [CopyRecord("DtoH", True, False, "item", 1, 4, 1_000 * (i + 1), 0,
                         Site("/work/proj/train.py", i + 1, "f"), [], None, None)
              for i in range(REPORT_SYNC_SITES + 3)]
    rows = section(render_text(make_trace(copies=copies), cwd=PROJECT_DIR), "Sync copies")
    assert len(rows) == 1 + REPORT_SYNC_SITES + 1
    assert rows[1].split()[2] == f"train.py:{REPORT_SYNC_SITES + 3}"  # the longest first
    assert rows[-1] == "... and 3 more sync copy paths in the trace"


def test_paths_outside_cwd_stay_absolute():
    trace = make_trace()
    trace.copies[0].site = Site("/opt/lib/util.py", 5, "load")
    trace.copies[0].producer = OpRef("aten::arange", "cpu", Site("/work/project/x.py", 3, "f"))
    trace.copies[0].consumer = OpRef("aten::mm", "cuda:0", None)
    rows = section(render_text(trace, cwd=PROJECT_DIR), "Sync copies")
    assert rows[1].split() == ["HtoD", "to", "/opt/lib/util.py:5", "4", "4096", "2",
                               "aten::arange", "[cpu]", "at", "/work/project/x.py:3", "->",
                               "aten::mm", "[cuda:0]", "at", "?"]


def test_default_cwd_is_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = make_trace()
    trace.copies[0].site = Site(str(tmp_path / "sub" / "train.py"), 42, "train_step")
    rows = section(render_text(trace), "Sync copies")
    assert rows[1].split()[2] == "sub/train.py:42"
    assert rows[2].split()[2] == "/work/proj/train.py:50"


def test_short_path_and_format_helpers():
    assert short_path("/work/proj/train.py", "/work/proj") == "train.py"
    assert short_path("/work/proj/a/b.py", "/work/proj/") == "a/b.py"
    assert short_path("/work/project/x.py", "/work/proj") == "/work/project/x.py"
    assert short_path("/elsewhere/x.py", "/work/proj") == "/elsewhere/x.py"
    assert short_path("<stdin>", "/work/proj") == "<stdin>"
    assert format_site(None, "/work/proj") == "?"
    assert format_site(Site("/work/proj/m.py", 7, "f"), "/work/proj") == "m.py:7"
    assert format_ref(None, "/work/proj") == "-"
    assert format_ref(OpRef("aten::mm", "cuda:0", None), "/work/proj") == "aten::mm [cuda:0] at ?"


def test_short_path_dotdot_named_directory_inside_cwd():
    assert short_path("/work/proj/..cache/gen.py", "/work/proj") == "..cache/gen.py"


def test_zero_total_time_does_not_divide_by_zero():
    trace = make_trace(total_ns=0, events=[], copies=[], ops=[], waits=[])
    report = render_text(trace, cwd=PROJECT_DIR)
    assert "Total time: 0\n" in report
    assert "  Computation time       Total: 0           Ratio: 0%" in report


def test_event_with_zero_calls_and_time():
    trace = make_trace()
    trace.events[0].calls = 0
    trace.events[0].cpu_ns = trace.events[0].gpu_ns = 0
    for sort in SORT_KEYS:
        render_text(trace, sort=sort, cwd=PROJECT_DIR)


def _tabulate_state() -> dict:
    state = {}
    for name, value in vars(tabulate).items():
        if isinstance(value, (bool, int, float, str, bytes, tuple, type(None))):
            state[name] = value
        elif isinstance(value, (dict, list, set)):
            state[name] = repr(value)
    return state


def test_render_does_not_change_tabulate_globals():
    before = _tabulate_state()
    for sort in SORT_KEYS:
        render_text(make_trace(), sort=sort, cwd=PROJECT_DIR)
    assert _tabulate_state() == before


def test_render_does_not_depend_on_tabulate_globals(monkeypatch):
    """Another library (torch's profiler) may set tabulate.PRESERVE_WHITESPACE; the report
    stays the same."""
    expected = render_text(make_trace(), cwd=PROJECT_DIR)
    monkeypatch.setattr(tabulate, "PRESERVE_WHITESPACE", not tabulate.PRESERVE_WHITESPACE)
    assert render_text(make_trace(), cwd=PROJECT_DIR) == expected


def test_render_does_not_modify_the_trace():
    trace = make_trace()
    render_text(trace, sort="calls", cwd=PROJECT_DIR)
    assert trace == make_trace()


@pytest.mark.parametrize("rows", [
    [],
    [["aten::mm", "3", "0.5"]],
    [["a", "12345678901", "x"], [" padded ", "", "a longer cell than its header"]],
    [["GpuMemcpySync:GPU->CPU", "1", "/a path/with spaces.py:12"], ["b", "22", ""]],
])
def test_plain_table_lays_columns_out_as_tabulate_plain_does(rows):
    headers = ["Event", "Calls", "Where"]
    assert plain_table(rows, headers) == tabulate.tabulate(
        rows, headers=headers, tablefmt="plain", disable_numparse=True)


def test_device_memory_peak_line_under_the_figures():
    lines = render_text(peak_and_pageable_trace(), cwd=PROJECT_DIR).splitlines()
    at = lines.index("Device memory peak: 586.0 MiB")
    assert lines[at - 1].startswith("  Framework overhead ")
    assert lines[at + 1] == ""


@pytest.mark.parametrize("nbytes, shown", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (5_000, "4.9 KiB"),
    (614_465_536, "586.0 MiB"), (3 * 2**30 // 2, "1.5 GiB"), (80 * 2**30, "80.0 GiB"),
])
def test_device_memory_peak_units(nbytes, shown):
    trace = make_trace()
    trace.summary.peak_device_memory_bytes = nbytes
    assert f"\nDevice memory peak: {shown}\n" in render_text(trace, cwd=PROJECT_DIR)


def test_no_peak_line_where_the_peak_is_not_known():
    assert "Device memory peak" not in render_text(make_trace(), cwd=PROJECT_DIR)


def test_pageable_non_blocking_line_in_the_memcpy_summary():
    assert section(render_text(peak_and_pageable_trace(), cwd=PROJECT_DIR),
                   "GpuMemCpy Summary")[4:5] == [
        "  4 sync CPU->GPU copies asked non_blocking=True from pageable memory: the host "
        "stages pageable memory, so they block; pin the source"]
    trace = peak_and_pageable_trace()
    trace.copies[0].calls = 1
    assert section(render_text(trace, cwd=PROJECT_DIR), "GpuMemCpy Summary")[4] == (
        "  1 sync CPU->GPU copy asked non_blocking=True from pageable memory: the host "
        "stages pageable memory, so it blocks; pin the source")


def test_pageable_non_blocking_line_counts_only_sync_host_to_device_from_pageable():
    """Not counted: a copy that did not ask (or whose asking is not known, older traces), an
    async one from pinned memory, one to the host."""
    def copy(direction, sync, pinned, non_blocking, calls):
        return CopyRecord(direction, sync, pinned, "to", calls, 4 * calls, 1_000, 1_000,
                          None, [], None, None, non_blocking=non_blocking)

    copies = [copy("HtoD", True, False, True, 2), copy("HtoD", True, False, True, 3),
              copy("HtoD", True, False, False, 10), copy("HtoD", True, False, None, 20),
              copy("HtoD", False, True, True, 40), copy("DtoH", True, False, True, 80)]
    summary = section(render_text(make_trace(copies=copies), cwd=PROJECT_DIR),
                      "GpuMemCpy Summary")
    assert summary[4:5] == [
        "  5 sync CPU->GPU copies asked non_blocking=True from pageable memory: the host "
        "stages pageable memory, so they block; pin the source"]
    no_line = section(render_text(make_trace(copies=copies[2:]), cwd=PROJECT_DIR),
                      "GpuMemCpy Summary")
    assert no_line[4].split()[:2] == ["Copy", "path"]
    assert not any("non_blocking" in line for line in no_line)
