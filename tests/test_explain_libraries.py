"""explain on programs whose copies happen inside libraries: the user's own line is named,
advice goes there (never a patch to site-packages), wording follows the trace, and one edit
is one suggestion. Hand-built traces with round numbers, plus one traced run through a
library deeper than a copy's kept stack."""

from __future__ import annotations

import os
import re
import sys
import textwrap

import torch

import memcpy_doctor
from memcpy_doctor.analysis.attribution import explain, user_site
from memcpy_doctor.analysis.gates import check
from memcpy_doctor.analysis.rules import suggest
from memcpy_doctor.core.defaults import MAX_STACK_FRAMES
from memcpy_doctor.core.summary import summarize
from memcpy_doctor.core.trace import CopyRecord, Meta, OpRef, Site, Trace
from memcpy_doctor.render.check import finding_message
from memcpy_doctor.render.explain import render_explain_text
from memcpy_doctor.render.github import finding_location

TRAIN = textwrap.dedent("""\
    import torch
    from somelib import fit, Scaler

    for step in range(10):
        fit(model, batch)
        scaler.step(opt)
        total += loss.item()
        batch = batch.to("cuda")
""")


def _trace(copies: list[CopyRecord]) -> Trace:
    meta = Meta(device="sim", simulated=True, device_name="GPU", device_profile=None,
                torch_version="2.13.0", command=["train.py"])
    return Trace(meta, summarize(10_000_000, [], copies), [], [], copies, [])


def _copy(direction: str, trigger: str, site: Site, stack: list[Site], pinned: bool = False,
          producer: OpRef | None = None, host_ns: int = 500_000) -> CopyRecord:
    return CopyRecord(direction, True, pinned, trigger, 10, 40_960, host_ns, 100_000, site,
                      stack, producer, None, [10, 1024], "float32")


def _files(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    lib = tmp_path / "env" / "lib" / "python3.11" / "site-packages" / "somelib" / "move.py"
    lib.parent.mkdir(parents=True)
    lib.write_text("def move(x, device):\n    return x.to(device)\n")
    return str(train), str(lib)


def test_a_copy_inside_a_library_is_advised_at_the_users_call(tmp_path):
    train, lib = _files(tmp_path)
    in_lib, call = Site(lib, 2, "move"), Site(train, 5, "<module>")
    c = _copy("HtoD", "to", in_lib, [in_lib, call])
    assert user_site(c) is call
    trace = _trace([c])
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert s.rule == "pinned-non-blocking"
    assert s.title == "copies to the device inside the call at train.py:5"
    assert s.sites == [call] and s.diff is None and not s.exact
    assert "made inside env/lib/python3.11/site-packages/somelib/move.py:2" in s.detail
    assert "knows no setting of that library" in s.detail  # (no setting is made up)
    text = render_explain_text(explain(trace), [s], cwd=str(tmp_path))
    assert "    from      your code  train.py:5   fit(model, batch)" in text


def test_one_edit_is_one_suggestion_with_its_paths_merged(tmp_path):
    train, _ = _files(tmp_path)
    at = Site(train, 8, "<module>")
    copies = [_copy("HtoD", "to", at, [at], producer=OpRef(f"aten::op{i}", "cpu", None))
              for i in range(3)]
    trace = _trace(copies)
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert s.title == "pin the source and copy with non_blocking=True at train.py:8"
    launch = 10 * 5_000  # each path gives back its host time less the launches left
    assert s.saving_ns == 3 * (500_000 - launch) and len(s.removes) == 3
    assert s.estimate == "upper bound (no timeline in this trace)"
    # `batch` is made nowhere in the file: no edit pins it, and non_blocking alone would
    # still block on pageable memory, so no diff
    assert s.diff is None and s.apply is None and not s.exact
    assert "non_blocking alone on pageable memory still blocks" in s.detail


def test_a_pinned_copy_is_not_told_to_pin(tmp_path):
    train, _ = _files(tmp_path)
    at = Site(train, 8, "<module>")
    trace = _trace([_copy("HtoD", "to", at, [at], pinned=True)])
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert s.title == "copy with non_blocking=True at train.py:8"
    assert "from pinned memory" in s.detail and "the source is pinned already" in s.detail
    assert "pin_memory()" not in s.detail


def test_a_read_inside_a_call_is_not_told_to_accumulate(tmp_path):
    train, _ = _files(tmp_path)
    scaler, item = Site(train, 6, "<module>"), Site(train, 7, "<module>")
    trace = _trace([_copy("DtoH", "item", scaler, [scaler], host_ns=400_000),
                    _copy("DtoH", "item", item, [item], host_ns=300_000)])
    found = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert [(s.rule, s.sites) for s in found] == [("host-read-in-loop", [item])]


def test_nothing_is_suggested_inside_a_library(tmp_path):
    train, lib = _files(tmp_path)
    in_lib, call = Site(lib, 2, "move"), Site(train, 5, "<module>")
    trace = _trace([_copy("DtoH", "nonzero", in_lib, [in_lib, call]),
                    _copy("DtoH", "item", in_lib, [in_lib, call])])
    assert suggest(trace, explain(trace), cwd=str(tmp_path)) == []


def test_a_copy_deep_in_a_library_still_names_the_users_line(tmp_path, monkeypatch):
    lib_dir = tmp_path / "site-packages"
    lib_dir.mkdir()
    depth = MAX_STACK_FRAMES + 5
    (lib_dir / "deeplib.py").write_text(textwrap.dedent(f"""\
        def read(t, n={depth}):
            if n:
                return read(t, n - 1)
            return t.item()
    """))
    monkeypatch.syspath_prepend(str(lib_dir))
    sys.modules.pop("deeplib", None)
    import deeplib

    with memcpy_doctor.profiler(device="sim") as prof:
        value = deeplib.read(torch.ones(1, device="cuda"))  # the user's line
    line = sys._getframe().f_lineno - 1
    assert value == 1.0
    (c,) = [c for c in prof.trace.copies if c.trigger == "item"]
    assert c.site.file == str(lib_dir / "deeplib.py")
    assert len(c.stack) == MAX_STACK_FRAMES + 1
    assert user_site(c) == Site(__file__, line, user_site(c).function)


def test_no_diff_where_the_line_has_two_transfers(tmp_path):
    train, _ = _files(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN.replace('batch = batch.to("cuda")',
                                                     'a, b = x.to("cuda"), y.to("cuda")'))
    at = Site(train, 8, "<module>")
    trace = _trace([_copy("HtoD", "to", at, [at])])
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert s.rule == "pinned-non-blocking" and s.diff is None and s.apply is None


def test_a_gate_names_the_users_line_for_a_copy_inside_a_library(tmp_path):
    train, lib = _files(tmp_path)
    in_lib, call = Site(lib, 2, "move"), Site(train, 5, "<module>")
    trace = _trace([_copy("HtoD", "to", in_lib, [in_lib, call])])
    result = check(trace, {"sync_calls": 0})
    (finding,) = result.findings
    assert finding_location(finding, str(tmp_path)) == ("train.py", 5)  # the annotation's line
    assert finding_message(finding, str(tmp_path)).endswith("; from your code at train.py:5")


def test_the_diff_edits_the_call_that_made_the_copy(tmp_path):
    """Two transfers on one line: the trace keeps where the copying call ends, and the diff
    edits that call, not the first one on the line."""
    src = tmp_path / "two.py"
    src.write_text(textwrap.dedent("""\
        import torch
        a, b = torch.ones(2).pin_memory(), torch.ones(1).pin_memory()
        for _ in range(4):
            y = a.to("cuda", non_blocking=True)[:1] + b.to("cuda")
        print(y.sum().item())
    """))
    code = compile(src.read_text(), str(src), "exec")
    with memcpy_doctor.profiler(device="sim") as prof:
        exec(code, {"__name__": "two"})
    line = src.read_text().splitlines()[3]
    (sync,) = [c for c in prof.trace.copies if c.direction == "HtoD" and c.sync]
    assert sync.end_col == len(line)  # `.to("cuda")` ends the line
    (s,) = [s for s in suggest(prof.trace, explain(prof.trace), cwd=str(tmp_path))
            if s.rule == "pinned-non-blocking"]
    (edit,) = s.apply["edits"]
    assert edit["new"] == line.replace('b.to("cuda")', 'b.to("cuda", non_blocking=True)')


def test_a_library_line_reached_from_two_lines_names_each_caller(tmp_path, monkeypatch):
    """Two lines of the user's code call one library function that copies: each copy path
    names its own caller (the stack of the first call was kept for both before)."""
    lib_dir = tmp_path / "site-packages"
    lib_dir.mkdir()
    (lib_dir / "movelib.py").write_text("def send(t, device):\n    return t.to(device)\n")
    monkeypatch.syspath_prepend(str(lib_dir))
    sys.modules.pop("movelib", None)
    import movelib

    a, b = torch.ones(4), torch.ones(8)
    with memcpy_doctor.profiler(device="sim") as prof:
        for _ in range(3):
            x = movelib.send(a, "cuda") + 1  # caller A
            y = movelib.send(b, "cuda") * 2  # caller B
        assert x.sum().item() == 8 and y.sum().item() == 16
    first = sys._getframe().f_lineno - 3
    copies = sorted((c for c in prof.trace.copies if c.trigger == "to"),
                    key=lambda c: user_site(c).line)
    assert [(c.site.line, user_site(c).line, c.calls, c.bytes) for c in copies] == [
        (2, first, 3, 48), (2, first + 1, 3, 96)]
    # each caller is a finding of its own, and the report names it
    findings = check(prof.trace, {"sync_calls": 0}).findings
    assert sorted(f.copy.calls for f in findings if f.copy.trigger == "to") == [3, 3]
    from memcpy_doctor.render.text import render_text
    report = render_text(prof.trace)
    me = os.path.basename(__file__)
    for line in (first, first + 1):
        assert re.search(rf"movelib\.py:2 from \S*{me}:{line}\b", report), report
