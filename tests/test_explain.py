"""explain, suggestions, diffs, --apply edits and diff, on hand-built traces with round numbers
and a real source file (so source lines and diffs can be checked exactly)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from helpers import make_trace
from memcpy_doctor.analysis.attribution import explain
from memcpy_doctor.analysis.compare import compare
from memcpy_doctor.analysis.edits import guard_diff
from memcpy_doctor.analysis.rules import suggest
from memcpy_doctor.core.summary import summarize
from memcpy_doctor.run.apply import ApplyError, GuardEdit, LineEdit, apply_edits, load_edits
from memcpy_doctor.render.diff import render_diff
from memcpy_doctor.render.explain import (render_explain_json, render_explain_text,
                                          render_set_aside)
from memcpy_doctor.core.trace import CopyRecord, FlowRecord, Meta, OpRecord, OpRef, Site, Trace

SOURCE = textwrap.dedent("""\
    import torch


    def step(data, device):
        shape = torch.tensor(data.shape)
        shape = move(shape, device)
        shape = shape[0:4]
        sizes = shape.tolist()
        total = data.sum().item()
        return sizes, total
""")
#: The same program, sending the data to the device itself: a device_guard cannot undo that
#: (it runs explicit transfers as written), so explain drops the transfer instead.
EXPLICIT_SOURCE = SOURCE.replace("move(shape, device)", "shape.to(device)")


def udiff(text: str) -> str:
    """A unified diff written indented in a test: blank context lines are a single space."""
    lines = textwrap.dedent(text).split("\n")
    return "\n".join(line or " " for line in lines[:-1]) + "\n"


@pytest.fixture
def prog(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(SOURCE)
    return str(path)


def bounce_trace(prog: str) -> Trace:
    """10 steps: host tensor -> HtoD (line 6) -> slice on the device (line 7) -> DtoH (line 8);
    plus an .item() every step (line 9)."""
    def at(line, fn="step"):
        return Site(prog, line, fn)
    made = OpRef("aten::lift_fresh", "cpu", at(5))
    sliced = OpRef("aten::slice", "cuda:0", at(7))
    summed = OpRef("aten::sum", "cuda:0", at(9))
    copies = [
        CopyRecord("HtoD", True, False, "to", 10, 320, 200_000, 100_000, at(6), [at(6)], made,
                   sliced, [4], "int64"),
        CopyRecord("DtoH", True, False, "tolist", 10, 320, 150_000, 50_000, at(8), [at(8)],
                   sliced, None, [4], "int64"),
        CopyRecord("DtoH", True, False, "item", 10, 40, 100_000, 0, at(9), [at(9)], summed,
                   None, [], "float32"),
    ]
    ops = [OpRecord("aten::lift_fresh", "cpu", at(5), 10, 50_000, 0, 50_000),
           OpRecord("aten::slice", "cuda:0", at(7), 10, 30_000, 0, 30_000),
           OpRecord("aten::sum", "cuda:0", at(9), 10, 50_000, 40_000, 90_000)]
    meta = Meta(device="sim", simulated=True, device_name="GPU", device_profile=None,
                torch_version="2.13.0", command=["prog.py"])
    return Trace(meta, summarize(10_000_000, [], copies), [], ops, copies, [])


def test_bounce_is_one_chain_with_lines_and_text(prog):
    exp = explain(bounce_trace(prog))
    assert exp.sync_calls == 30 and exp.sync_time_ns == 600_000
    first, second = exp.chains
    assert [s.copy.trigger for s in first.steps] == ["to", "tolist"]
    assert first.time_ns == 500_000 and first.share == 0.05
    assert (first.producer.op, first.producer.site.line, first.producer.text) == (
        "aten::lift_fresh", 5, "shape = torch.tensor(data.shape)")
    assert [(m.op, m.site.line, m.text) for m in first.middle] == [
        ("aten::slice", 7, "shape = shape[0:4]")]
    assert [s.text for s in first.steps] == ["shape = move(shape, device)",
                                             "sizes = shape.tolist()"]
    assert first.consumer is None and first.bounces
    assert [s.copy.trigger for s in second.steps] == ["item"] and not second.bounces


def test_suggestions_rank_by_saving_with_a_guard_diff(prog, tmp_path):
    trace = bounce_trace(prog)
    found = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert [s.rule for s in found] == ["host-round-trip", "host-read-in-loop"]
    guard, loop = found
    # both copies' host time back (350 us); the slice costs no more on the host; the guard
    # block, entered 10 times, handles 10 calls (12 us and 10 us each)
    assert guard.saving_ns == 350_000 - 10 * 12_000 - 10 * 10_000
    assert guard.apply == {"kind": "device_guard", "device": "cpu",
                           "sites": [{"file": prog, "line": 7}]}
    assert guard.diff == udiff("""\
        --- a/prog.py
        +++ b/prog.py
        @@ -1,10 +1,12 @@
         import torch
        +import memcpy_doctor
         
         
         def step(data, device):
             shape = torch.tensor(data.shape)
             shape = move(shape, device)
        -    shape = shape[0:4]
        +    with memcpy_doctor.device_guard("cpu"):
        +        shape = shape[0:4]
             sizes = shape.tolist()
             total = data.sum().item()
             return sizes, total
        """)
    assert loop.saving_ns == 90_000  # 9 of the 10 reads
    text = render_explain_text(explain(trace), found, cwd=str(tmp_path))
    assert "made by   aten::lift_fresh [cpu]  prog.py:5   shape = torch.tensor(data.shape)" in text
    assert 'run aten::slice on the host with device_guard("cpu") at prog.py:7' in text
    data = json.loads(render_explain_json(explain(trace), found))
    assert data["suggestions"][0]["apply"]["sites"] == [{"file": prog, "line": 7}]


def test_an_explicit_transfer_is_dropped_in_plain_pytorch(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(EXPLICIT_SOURCE)
    trace = bounce_trace(str(path))
    plain = suggest(trace, explain(trace), cwd=str(tmp_path))[0]
    assert plain.rule == "host-round-trip"
    assert plain.title == "keep the data for aten::slice on the host: drop the `to` at prog.py:6"
    assert plain.saving_ns == 350_000  # no guard to pay for
    assert plain.sites == [Site(str(path), 6, "step")]
    assert plain.apply == {"kind": "line", "file": str(path), "line": 6,  # --apply makes it
                           "old": "    shape = shape.to(device)", "new": "    shape = shape"}
    assert plain.diff == udiff("""\
        --- a/prog.py
        +++ b/prog.py
        @@ -3,7 +3,7 @@
         
         def step(data, device):
             shape = torch.tensor(data.shape)
        -    shape = shape.to(device)
        +    shape = shape
             shape = shape[0:4]
             sizes = shape.tolist()
             total = data.sum().item()
        """)


def test_no_transfer_is_dropped_for_an_op_that_also_reads_device_data(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(EXPLICIT_SOURCE)
    trace = bounce_trace(str(path))
    weight = OpRef("aten::randn", "cuda:0", Site(str(path), 2, "<module>"))
    trace.flows = [FlowRecord(weight, OpRef("aten::slice", "cuda:0", Site(str(path), 7, "step")),
                              10, 40)]  # the slice would mix devices with the .to dropped
    found = suggest(trace, explain(trace), cwd=str(tmp_path))
    # the guard moves every input of the slice; its saving, 350 us less the guard's 220 us
    assert [(s.apply["kind"], s.saving_ns) for s in found if s.rule == "host-round-trip"] == [
        ("device_guard", 130_000)]


@pytest.mark.parametrize("line", ["x = y.to(device, torch.float16)", "x = y.to(torch.half)",
                                  "x = y.to(device).to(other)", "x = y.to(device, copy=True)"])
def test_a_transfer_that_also_converts_is_not_dropped(tmp_path, line):
    path = tmp_path / "prog.py"
    path.write_text(EXPLICIT_SOURCE.replace("shape = shape.to(device)", line))
    trace = bounce_trace(str(path))
    assert [s.apply for s in suggest(trace, explain(trace)) if s.rule == "host-round-trip"] == [
        {"kind": "device_guard", "device": "cpu", "sites": [{"file": str(path), "line": 7}]}]


def test_a_guard_that_costs_more_than_it_saves_is_not_offered(prog):
    trace = bounce_trace(prog)
    for op in trace.ops:  # 100 calls at the guarded line: 100 blocks and calls to pay for
        if op.op == "aten::slice":
            op.calls = 100
    aside: list = []
    found = suggest(trace, explain(trace), not_worth_it=aside)
    assert "host-round-trip" not in [s.rule for s in found]
    assert all(s.saving_ns > 0 for s in found)
    # 350 us of copies; the guard: entered 100 times (12 us), handling 100 calls (10 us)
    assert [(s.rule, s.saving_ns) for s in aside] == [
        ("host-round-trip", 350_000 - 100 * 12_000 - 100 * 10_000)]
    text = render_explain_text(explain(trace), found) + render_set_aside(aside, [])
    assert "\nConsidered, not worth it (estimated to save nothing):\n- run aten::slice" in text


def test_diff_headers_name_a_file_elsewhere_relative_to_the_cwd(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "lib").mkdir()
    path = tmp_path / "lib" / "m.py"
    path.write_text("import memcpy_doctor\ny = 3\n")
    diff = guard_diff(str(path), [2], "cpu", str(tmp_path / "work"))
    assert diff.splitlines()[:2] == ["--- a/../lib/m.py", "+++ b/../lib/m.py"]


def test_guard_diff_wraps_a_whole_multiline_statement(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import memcpy_doctor\nx = f(1,\n      2)\ny = 3\n")
    assert guard_diff(str(path), [3], "cpu", str(tmp_path)) == udiff("""\
        --- a/m.py
        +++ b/m.py
        @@ -1,4 +1,5 @@
         import memcpy_doctor
        -x = f(1,
        -      2)
        +with memcpy_doctor.device_guard("cpu"):
        +    x = f(1,
        +          2)
         y = 3
        """)
    assert guard_diff(str(tmp_path / "missing.py"), [1], "cpu") is None


def test_apply_edits_keep_line_numbers(prog):
    with open(prog, "rb") as f:
        source = f.read()
    edits = [GuardEdit(prog, 7, "cpu"), GuardEdit("/elsewhere.py", 3, "cpu")]
    code, missed = apply_edits(source, prog, edits)
    assert missed == [GuardEdit("/elsewhere.py", 3, "cpu")]
    step = next(c for c in code.co_consts if hasattr(c, "co_name") and c.co_name == "step")
    assert {ln for _, _, ln in step.co_lines() if ln} == {4, 5, 6, 7, 8, 9, 10}


def test_load_edits_reads_explain_json_and_rejects_others(prog, tmp_path):
    trace = bounce_trace(prog)
    good = tmp_path / "s.json"
    good.write_text(render_explain_json(explain(trace), suggest(trace, explain(trace))))
    assert load_edits(str(good)) == [GuardEdit(prog, 7, "cpu")]
    bad = tmp_path / "b.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ApplyError, match="no device_guard or line edit"):
        load_edits(str(bad))
    with pytest.raises(ApplyError, match="cannot read"):
        load_edits(str(tmp_path / "none.json"))


def test_a_line_edit_is_made_only_where_the_line_still_reads_the_same(prog):
    with open(prog, "rb") as f:
        source = f.read()
    edits = [LineEdit(prog, 6, "    shape = move(shape, device)", "    shape = shape"),
             LineEdit(prog, 7, "    shape = shape[0:2]", "    shape = shape[0:1]")]
    code, missed = apply_edits(source, prog, edits)
    assert missed == edits[1:]  # line 7 reads shape[0:4]
    step = next(c for c in code.co_consts if hasattr(c, "co_name") and c.co_name == "step")
    assert "move" not in step.co_names  # the call is gone
    assert {ln for _, _, ln in step.co_lines() if ln} == {4, 5, 6, 7, 8, 9, 10}


def test_a_line_edit_may_add_lines_and_keeps_every_other_line_number(tmp_path):
    path = str(tmp_path / "p.py")
    with open(path, "w") as f:
        f.write("import torch\nfor i in range(2):\n    c = torch.ones(3)\n    y = c + i\n")
    edits = [LineEdit(path, 2, "for i in range(2):", "c = torch.ones(3)\nfor i in range(2):"),
             LineEdit(path, 3, "    c = torch.ones(3)", "    pass")]
    code, missed = apply_edits(open(path, "rb").read(), path, edits)
    assert missed == []
    lines = {ln for _, _, ln in code.co_lines() if ln}
    assert lines == {1, 2, 3, 4}  # the added statement runs as line 2, the loop's body as 3, 4
    scope: dict = {}
    exec(code, scope)
    assert scope["y"].tolist() == [2.0, 2.0, 2.0]


def test_load_edits_reads_a_suggestion_of_several_line_edits(tmp_path):
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"suggestions": [{"apply": {"kind": "lines", "edits": [
        {"file": "/a.py", "line": 3, "old": "x", "new": "y"},
        {"file": "/a.py", "line": 9, "old": "u", "new": "v\nw"}]}}]}))
    assert load_edits(str(good)) == [LineEdit("/a.py", 3, "x", "y"),
                                     LineEdit("/a.py", 9, "u", "v\nw")]


def test_compare_shows_the_removed_paths(prog, tmp_path):
    before = bounce_trace(prog)
    after = bounce_trace(prog)
    after.copies = after.copies[2:]
    after.summary = summarize(9_000_000, [], after.copies)
    c = compare(before, after)
    assert [(f.name, f.before_ns, f.after_ns, f.before_calls, f.after_calls)
            for f in c.figures if f.name == "GpuMemcpySync"] == [
        ("GpuMemcpySync", 600_000, 100_000, 30, 10)]
    assert [(p.trigger, p.site.line, p.before_calls, p.after_calls) for p in c.sync_paths] == [
        ("to", 6, 10, 0), ("tolist", 8, 10, 0)]
    text = render_diff(c, "before.json", "after.json", cwd=str(tmp_path))
    assert "Total time          10             9             -10.0%" in text
    assert "HtoD to      prog.py:6  10 -> 0" in text


def test_diff_says_when_a_trace_is_light_mode():
    """A light trace's syncs are `sync_debug` copies by line, with no ops: against a full
    trace every path differs in kind, and diff says so rather than call them all new."""
    full, light = make_trace(), make_trace(light=True)
    mixed = render_diff(compare(full, light), "full.json", "light.json")
    assert ("Warning: one trace is light mode (syncs by line as `sync_debug`, no ops), the "
            "other full: their sync paths differ in kind, compare them by line") in mixed
    assert "Times are modeled" not in mixed
    both = render_diff(compare(light, light), "a.json", "b.json")
    assert "Both light mode: syncs by line, no ops" in both
    assert "light mode" not in render_diff(compare(full, full), "a.json", "b.json")


EMB_SOURCE = textwrap.dedent("""\
    import torch


    class Net(torch.nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, 150)

        def forward(self, ids):
            return self.emb(ids).sum()
""")


def embedding_trace(path: str, weight_bytes: int) -> Trace:
    """A weight made at line 7 copied once to the device for the lookup at line 10."""
    from memcpy_doctor.core.costmodel import load_profile

    def at(line):
        return Site(path, line, "f")
    init = OpRef("aten::normal_", "cpu", at(7))
    lookup = OpRef("aten::embedding", "cuda:0", at(10))
    summed = OpRef("aten::sum", "cuda:0", at(10))
    copies = [CopyRecord("HtoD", True, False, "to", 1, weight_bytes, 1_000_000, 1_000_000,
                         at(7), [at(7)], init, lookup, [weight_bytes // 600, 150], "float32"),
              CopyRecord("DtoH", True, False, "item", 10, 40, 100_000, 0, at(12), [at(12)],
                         summed, None, [], "float32")]
    ops = [OpRecord("aten::normal_", "cpu", at(7), 1, 5_000_000, 0, 5_000_000),
           OpRecord("aten::embedding", "cuda:0", at(10), 10, 50_000, 20_000, 200_000),
           OpRecord("aten::sum", "cuda:0", at(10), 10, 50_000, 20_000, 100_000)]
    meta = Meta(device="sim", simulated=True, device_name="GPU",
                device_profile=load_profile().to_dict(), torch_version="2.13.0",
                command=["prog.py"])
    return Trace(meta, summarize(50_000_000, [], copies), [], ops, copies, [])


def test_memory_budget_pins_the_weights_where_they_are_made(tmp_path):
    from memcpy_doctor.analysis.placement_graph import placement_suggestions

    path = tmp_path / "emb.py"
    path.write_text(EMB_SOURCE)
    trace = embedding_trace(str(path), 6_000_000_000)
    free, none = placement_suggestions(trace, None, str(tmp_path))
    assert free.exact and (str(path), 10) in free.on_device and none == []
    best, (s,) = placement_suggestions(trace, 4 * 2**30, str(tmp_path))
    assert best.exact and best.device_bytes <= 4 * 2**30
    assert (str(path), 10) in best.on_host
    assert s.rule == "placement" and s.apply["sites"] == [{"file": str(path), "line": 7}]
    assert "within 4 GiB of device memory" in s.title
    assert '+        with memcpy_doctor.device_guard("cpu"):' in s.diff
    assert "+            self.emb = torch.nn.Embedding(vocab, 150)" in s.diff
    # with room for the weights, nothing needs to move
    assert placement_suggestions(trace, 80 * 2**30, str(tmp_path))[1] == []


BRANCHES = textwrap.dedent("""\
    import torch
    while x.abs().max() > tol:
        x = x * 0.5
    for step in range(20):
        if torch.isnan(loss).any():
            break
        y = 1 if flag.item() else 0
        total += loss.item()
""")


@pytest.mark.parametrize("line, trigger, kind", [
    (2, "bool", "loop condition `while x.abs().max() > tol:`"),
    (5, "bool", "branch `if torch.isnan(loss).any():`"),
    (7, "item", "branch `y = 1 if flag.item() else 0`")])
def test_a_branch_on_a_device_value_in_a_loop(tmp_path, line, trigger, kind):
    path = tmp_path / "b.py"
    path.write_text(BRANCHES)
    at = Site(str(path), line, "<module>")
    copy = CopyRecord("DtoH", True, False, trigger, 8, 8, 80_000, 16_000, at, [at], None, None,
                      [], "bool")
    trace = Trace(Meta(device="sim", simulated=True, device_name="GPU", device_profile=None,
                       torch_version="2.13.0", command=["b.py"]),
                  summarize(10_000_000, [], [copy]), [], [], [copy], [])
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert (s.rule, s.title) == ("device-value-branch",
                                 f"test the device value less often at b.py:{line} "
                                 "(changes when the branch is taken)")
    assert s.changes_results  # (testing every k steps can run k - 1 steps more)
    assert s.detail.startswith(f"the {kind} waits for the device 8 times")
    assert s.saving_ns == 70_000  # all but one of the 8 waits
    copy.calls = 1  # a branch taken once is not in a loop
    assert [x.rule for x in suggest(trace, explain(trace))] == []


def test_a_placement_the_budget_needs_comes_first_whatever_it_costs(tmp_path):
    """Paddle's device_guard article, first problem: an embedding that does not fit the
    device. The placement that fits is required, so it is listed first with its cost and
    the peak it reaches, never set aside as "not worth it"."""
    import runpy
    import sys

    import memcpy_doctor
    from memcpy_doctor.analysis.replay import Replay
    from memcpy_doctor.render.explain import render_explain_text

    sample = os.path.join(os.path.dirname(__file__), "..", "sample_models", "embedding_l2.py")
    argv = sys.argv
    sys.argv = [sample, "--vocab", "200000", "--steps", "2"]
    try:
        with memcpy_doctor.profiler(device="sim") as prof:
            runpy.run_path(sample, run_name="__main__")
    finally:
        sys.argv = argv
    trace = prof.trace
    peak = trace.summary.peak_device_memory_bytes
    budget = 64 << 20
    assert peak > budget
    exp = explain(trace)
    aside: list = []
    found = suggest(trace, exp, str(tmp_path), budget, aside, Replay(trace))
    first = found[0]
    assert first.rule == "placement" and first.required
    assert first.title.startswith("required to fit within 64 MiB of device memory: ")
    assert "the device memory peak goes from" in first.detail
    assert all(s.rule != "placement" for s in aside)
    exp.device_memory_budget = budget
    text = render_explain_text(exp, found, str(tmp_path))
    assert "budget 64 MiB -- the run does not fit" in text.splitlines()[2]
    after = text.split("Suggestions (", 1)[1].splitlines()
    assert next(ln for ln in after[1:] if ln.strip()).startswith("1. required to fit")


@pytest.mark.parametrize("body, title", [
    ("    if step % 10 == 0:\n        print(loss.item())\n", None),  # every k steps already
    ("    print(loss.item())\n",
     "print the device value every k steps, not 8 times, at p.py:3 (changes what is printed)"),
])
def test_a_printed_read_is_not_told_to_wait_for_the_loop_to_end(tmp_path, body, title):
    """Reading once after the loop would change what a print shows each step (explain
    --verify on a PyG and a peft program: the advice would have changed their output)."""
    path = tmp_path / "p.py"
    path.write_text("for step in range(8):\n    loss = model(x)\n" + body)
    line = 4 if "if" in body else 3
    at = Site(str(path), line, "<module>")
    copy = CopyRecord("DtoH", True, False, "item", 8, 32, 80_000, 16_000, at, [at], None, None,
                      [], "float32", end_col=len(body.splitlines()[-1].rstrip()) - 1)
    trace = Trace(Meta(device="sim", simulated=True, device_name="GPU", device_profile=None,
                       torch_version="2.13.0", command=["p.py"]),
                  summarize(10_000_000, [], [copy]), [], [], [copy], [])
    found = [s for s in suggest(trace, explain(trace), cwd=str(tmp_path))]
    if title is None:
        assert found == []
    else:
        (s,) = found
        assert (s.rule, s.title, s.changes_results, s.diff) == (
            "host-read-in-loop", title, True, None)
