"""The expert rules (analysis/expert_rules.py and the modules it names): on hand-built traces
over small source files, each rule's exact suggestion (title, diff, `--apply` entry, saving,
effect) and each condition under which it proposes nothing; and on real programs traced on
the simulated GPU (tests/programs/expert/), that the edit `profile --apply` makes removes
the copies it says and keeps the program's result where it says it does, under the tracer and
in a plain run."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from helpers import concurrently, make_trace
from memcpy_doctor import load_trace
from memcpy_doctor.analysis.attribution import explain
from memcpy_doctor.analysis.expert_accumulate import AccumulateOnDevice
from memcpy_doctor.analysis.expert_factory import MakeOnDevice
from memcpy_doctor.analysis.expert_hoist import HoistInvariantUpload
from memcpy_doctor.analysis.expert_mask import IndexOnce
from memcpy_doctor.analysis.expert_module import BuildOnDevice
from memcpy_doctor.analysis.expert_rules import EXPERT_RULES, FusedGradScaler
from memcpy_doctor.analysis.rules import RULES, register, suggest
from memcpy_doctor.analysis.suggestion import DROP, ONCE
from memcpy_doctor.core.timeline import EventTimeline, TimelineEvent
from memcpy_doctor.core.trace import CopyRecord, OpRecord, OpRef, Site

#: Plain PyTorch programs, apart from tests/programs' real-library ones (which
#: benchmarks/fidelity.py runs, every one of them).
PROGRAMS = pathlib.Path(__file__).resolve().parent / "programs" / "expert"


def write(tmp_path, text: str, name: str = "prog.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def copy_at(path: str, line: int, direction: str = "DtoH", trigger: str = "item",
            calls: int = 10, host_ns: int = 900_000, end_col: int | None = None,
            dtype: str = "float32", shape: list | None = None,
            producer: OpRef | None = None) -> CopyRecord:
    site = Site(path, line, "f")
    return CopyRecord(direction=direction, sync=True, pinned=False, trigger=trigger,
                      calls=calls, bytes=4 * calls, host_ns=host_ns, device_ns=100_000,
                      site=site, stack=[site], producer=producer, consumer=None,
                      shape=[] if shape is None else shape, dtype=dtype, end_col=end_col)


def match(rule, tmp_path, copies, ops=(), **meta):
    trace = make_trace(copies=copies, ops=list(ops), **meta)
    return rule().match(trace, explain(trace), str(tmp_path))


def end_of(path: str, line: int, text: str) -> int:
    """The byte column where `text` ends on line `line` of `path` (a copy's end_col)."""
    source = pathlib.Path(path).read_text().splitlines()[line - 1]
    return source.index(text) + len(text)


def udiff(text: str) -> str:
    lines = textwrap.dedent(text).split("\n")
    return "\n".join(line or " " for line in lines[:-1]) + "\n"


# ----- the registry -----

def test_each_expert_rule_claims_before_the_rule_it_names():
    names = [r.name for r in RULES]
    assert [r.name for r in EXPERT_RULES] == ["fused-grad-scaler", "accumulate-on-device",
                                              "build-on-device", "hoist-invariant-upload",
                                              "make-on-device", "index-once"]
    for rule in EXPERT_RULES:
        assert names.index(rule.name) < names.index(rule.before), names
    assert names.index("accumulate-on-device") < names.index("host-read-in-loop")


def test_register_refuses_to_go_before_a_rule_it_does_not_know():
    class Stray:
        name = "stray"
        before = "no-such-rule"
    with pytest.raises(ValueError, match="'stray' goes before 'no-such-rule'"):
        register(Stray)
    assert Stray not in RULES


# ----- accumulate-on-device -----

SUM = textwrap.dedent("""\
    import torch


    def train(model, loader, opt):
        total = 0.0
        for x, y in loader:
            loss = model(x, y)
            loss.backward()
            opt.step()
            total += loss.item()
        return total
""")


def test_a_summed_read_is_summed_on_the_device_and_read_once(tmp_path):
    path = write(tmp_path, SUM)
    c = copy_at(path, 10, end_col=28)
    [s] = match(AccumulateOnDevice, tmp_path, [c])
    assert s.rule == "accumulate-on-device"
    assert s.title == ("sum `total` on the device and read it once after the loop, not 10 "
                       "times at prog.py:10")
    assert s.detail == ("`item` reads a device value 10 times, the host waiting each time, "
                        "only to add it up; nothing reads `total` inside the loop; summed in "
                        "float64 on the device, as Python sums floats, it is the same number")
    assert s.diff == udiff("""\
        --- a/prog.py
        +++ b/prog.py
        @@ -7,5 +7,6 @@
                 loss = model(x, y)
                 loss.backward()
                 opt.step()
        -        total += loss.item()
        +        total += loss.detach().double()
        +    total = float(total)
             return total
        """)
    assert s.apply == {"kind": "lines", "edits": [
        {"file": path, "line": 10, "old": "        total += loss.item()",
         "new": "        total += loss.detach().double()\n    total = float(total)"}]}
    assert (s.removes, s.effect, s.changes_results) == ([c], ONCE, False)
    assert s.saving_ns == 900_000 * 9 // 10
    assert s.cost_ns == 10 * (2 * (5_000 + 1_000) + 2_000 + 1_000)  # double, add; detach


@pytest.mark.parametrize("old, new, after", [
    ("total += loss.item()", "total += loss.detach().double()", "total = float(total)"),
    ("total += float(loss)", "total += loss.detach().double()", "total = float(total)"),
    ("total += loss.item() * x.size(0)", "total += loss.detach().double() * x.size(0)",
     "total = float(total)"),
    ("total += (a + b).item()", "total += (a + b).detach().double()", "total = float(total)"),
])
def test_the_read_is_replaced_where_it_is(tmp_path, old, new, after):
    path = write(tmp_path, SUM.replace("total += loss.item()", old))
    trigger = "float" if old.startswith("total += float") else "item"
    [s] = match(AccumulateOnDevice, tmp_path, [copy_at(path, 10, trigger=trigger)])
    assert s.apply["edits"][0]["new"] == f"        {new}\n    {after}"


def test_an_int_count_is_summed_as_int64(tmp_path):
    path = write(tmp_path, SUM.replace("total = 0.0", "total = 0")
                 .replace("loss.item()", "(loss > 0).sum().item()"))
    [s] = match(AccumulateOnDevice, tmp_path, [copy_at(path, 10, dtype="int64")])
    assert s.apply["edits"][0]["new"] == ("        total += (loss > 0).sum().detach().long()\n"
                                          "    total = int(total)")
    assert s.cost_ns == 10 * (1 * (5_000 + 1_000) + 2_000 + 1_000)  # (int64 already: an add)


def test_an_int_start_with_floats_added_keeps_the_int_of_a_loop_that_never_ran(tmp_path):
    path = write(tmp_path, SUM.replace("total = 0.0", "total = 0"))
    [s] = match(AccumulateOnDevice, tmp_path, [copy_at(path, 10)])
    assert s.apply["edits"][0]["new"].split("\n")[1] == (
        "    total = float(total) if isinstance(total, torch.Tensor) else total")


def test_a_listed_read_is_kept_on_the_device_and_read_in_one_copy(tmp_path):
    path = write(tmp_path, SUM.replace("total = 0.0", "losses = []")
                 .replace("total += loss.item()", "losses.append(loss.item())")
                 .replace("return total", "return losses"))
    [s] = match(AccumulateOnDevice, tmp_path, [copy_at(path, 10)])
    assert s.title.startswith("keep `losses` on the device and read it once after the loop")
    assert s.apply["edits"] == [{
        "file": path, "line": 10, "old": "        losses.append(loss.item())",
        "new": "        losses.append(loss.detach())\n"
               "    losses = torch.stack(losses).tolist() if losses else losses"}]
    assert s.cost_ns == 10 * (2_000 + 1_000)  # a detach: no kernel


@pytest.mark.parametrize("change", [
    ("opt.step()", "opt.step()\n        print(total)"),  # read in the loop: every value needed
    ("return total", "return 0"),  # never used after the loop
    ("total = 0.0", "total = start"),  # not a number before the loop
    ("total = 0.0", "total = 0.0\n    log = lambda: total"),  # shared with a closure
    ("total = 0.0", "global total\n    total = 0.0"),
    ("total += loss.item()", "total += loss.item(); n = 1"),  # not alone on its line
    ("total += loss.item()", "total -= loss.item()"),
    ("total += loss.item()", "total += loss.item() / n"),  # divided by what may be a tensor
    ("total += loss.item()", "total += loss.item() + loss.item()"),  # (two reads)
    ("total += loss.item()", "if total: total += loss.item()"),
])
def test_no_edit_where_the_source_does_not_prove_it_keeps_the_result(tmp_path, change):
    text = SUM.replace(*change)
    path = write(tmp_path, text)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "loss.item()" in t)
    assert match(AccumulateOnDevice, tmp_path, [copy_at(path, line)]) == []


def test_no_edit_where_a_handler_around_the_loop_would_see_the_device_value(tmp_path):
    path = write(tmp_path, textwrap.dedent("""\
        def train(model, loader):
            total = 0.0
            try:
                for x in loader:
                    total += model(x).item()
            except KeyError:
                print(total)
            return total
    """))
    assert match(AccumulateOnDevice, tmp_path, [copy_at(path, 5)]) == []


def test_an_int_read_of_a_float_value_is_not_summed(tmp_path):
    path = write(tmp_path, SUM.replace("loss.item()", "int(loss)").replace("0.0", "0"))
    assert match(AccumulateOnDevice, tmp_path, [copy_at(path, 10, trigger="int")]) == []


def test_it_claims_the_read_before_host_read_in_loop(tmp_path):
    path = write(tmp_path, SUM)
    trace = make_trace(copies=[copy_at(path, 10, end_col=28)], ops=[])
    assert [s.rule for s in suggest(trace, explain(trace), str(tmp_path))] == [
        "accumulate-on-device"]


# ----- hoist-invariant-upload -----

HOIST = textwrap.dedent("""\
    import torch


    def train(model, xs, dev):
        h = torch.ones(3)
        for x in xs:
            w = torch.tensor([0.2, 0.3, 0.5]).to(dev)
            v = h.to(dev)
            y = model(x.to(dev), w, v)
        return y
""")


def hoist_copies(path: str) -> list[CopyRecord]:
    return [copy_at(path, 7, "HtoD", "to", calls=6, host_ns=600_000,
                    end_col=end_of(path, 7, ".to(dev)")),
            copy_at(path, 8, "HtoD", "to", calls=6, host_ns=300_000,
                    end_col=end_of(path, 8, ".to(dev)")),
            copy_at(path, 9, "HtoD", "to", calls=6, host_ns=300_000,
                    end_col=end_of(path, 9, "x.to(dev)"))]


def event(kind: str, ref: int, reads: list[int], writes: list[int], at: int) -> TimelineEvent:
    return TimelineEvent(kind, ref, None, 0, at, at + 10, at, at + 10, reads, writes)


#: Three steps of HOIST's loop: `w`'s upload reads a new host tensor each time (storages
#: 10, 11, 12), `v`'s reads `h` (storage 7) each time.
STEPS = [event("copy", 0, [10 + i], [20 + i], 100 * i) for i in range(3)] + \
    [event("copy", 1, [7], [30 + i], 100 * i + 50) for i in range(3)]


def hoist_trace(copies: list[CopyRecord], events: list[TimelineEvent] | None = STEPS):
    trace = make_trace(copies=copies, ops=[OpRecord("aten::add", "cpu", None, 1, 1, 0)])
    if events is not None:
        trace.timeline = EventTimeline(10_000, 0, sorted(events, key=lambda e: e.host_start_ns))
    return trace


def hoisted(trace, tmp_path) -> list[list[str]]:
    """The names each suggestion hoists."""
    return [s.title.split("`")[1::2] for s in
            HoistInvariantUpload().match(trace, explain(trace), str(tmp_path))]


def test_uploads_of_what_the_loop_never_changes_move_before_it(tmp_path):
    path = write(tmp_path, HOIST)
    copies = hoist_copies(path)
    trace = hoist_trace(copies)
    [s] = HoistInvariantUpload().match(trace, explain(trace), str(tmp_path))
    assert s.title == "upload `w`, `v` once, before the loop at prog.py:6"
    assert s.detail == ("12 host->device copies (2 paths) of data the loop never changes: `w`, "
                        "`v` reads only constants and names the loop neither binds nor "
                        "changes in place; made once before the loop, every step reads the "
                        "one copy (results unchanged)")
    assert s.diff == udiff("""\
        --- a/prog.py
        +++ b/prog.py
        @@ -3,8 +3,8 @@
         
         def train(model, xs, dev):
             h = torch.ones(3)
        +    w = torch.tensor([0.2, 0.3, 0.5]).to(dev)
        +    v = h.to(dev)
             for x in xs:
        -        w = torch.tensor([0.2, 0.3, 0.5]).to(dev)
        -        v = h.to(dev)
                 y = model(x.to(dev), w, v)
             return y
        """)
    assert [(e["line"], e["new"]) for e in s.apply["edits"]] == [
        (6, "    w = torch.tensor([0.2, 0.3, 0.5]).to(dev)\n    v = h.to(dev)\n"
            "    for x in xs:"), (7, ""), (8, "")]
    assert (s.removes, s.effect) == (copies[:2], ONCE)
    assert s.saving_ns == 600_000 * 5 // 6 + 300_000 * 5 // 6


def test_a_tensor_made_before_the_loop_is_hoisted_only_on_the_timelines_word(tmp_path):
    path = write(tmp_path, HOIST)
    copies = hoist_copies(path)[:2]
    for events, names in [
        (STEPS, ["w", "v"]),
        (None, ["w"]),  # no timeline: h might change through another name
        (STEPS + [event("op", 0, [7], [7], 160)], ["w"]),  # h written between two uploads
        (STEPS + [event("op", 0, [20], [20], 170)], ["v"]),  # an upload of w written after it
        ([e for e in STEPS if e.host_start_ns != 150]
         + [event("copy", 1, [8], [31], 150)], ["w"]),  # v's second upload reads another
    ]:
        assert hoisted(hoist_trace(copies, events), tmp_path) == [names]


def test_a_loop_left_empty_keeps_a_pass(tmp_path):
    path = write(tmp_path, "import torch\nfor i in range(3):\n    w = torch.ones(2).cuda()\n")
    [s] = match(HoistInvariantUpload, tmp_path,
                [copy_at(path, 3, "HtoD", "cuda", calls=3, shape=[2])])
    assert [(e["line"], e["new"]) for e in s.apply["edits"]] == [
        (2, "w = torch.ones(2).cuda()\nfor i in range(3):"), (3, "    pass")]


def test_a_statement_of_several_lines_and_a_factory_on_the_device(tmp_path):
    path = write(tmp_path, textwrap.dedent("""\
        import torch

        WEIGHTS = [0.2, 0.8]
        dev = "cuda"
        step = 0
        while step < 3:
            w = torch.tensor(
                WEIGHTS, device=dev, dtype=torch.float32)
            step += 1
    """))
    [s] = match(HoistInvariantUpload, tmp_path,
                [copy_at(path, 7, "HtoD", "factory", calls=3, shape=[2])])
    assert [(e["line"], e["new"]) for e in s.apply["edits"]] == [
        (6, "w = torch.tensor(\n    WEIGHTS, device=dev, dtype=torch.float32)\n"
            "while step < 3:"), (7, ""), (8, "")]


@pytest.mark.parametrize("change, names", [
    (("y = model", "h.add_(1)\n        y = model"), ["w"]),  # h changed in place
    (("y = model", "w.mul_(2)\n        y = model"), ["v"]),  # w changed in place
    (("y = model", "w = w * 2\n        y = model"), ["v"]),  # w bound again
    (("        w = torch", "        z = w\n        w = torch"), ["v"]),  # read before it
    (("return y", "return w"), ["v"]),  # read after the loop (a loop that never ran)
    (("[0.2, 0.3, 0.5]", "[0.2, 0.3, x]"), ["v"]),  # reads the loop's variable
    (("torch.tensor([0.2, 0.3, 0.5])", "torch.randn(3)"), ["v"]),  # not the same each time
    (("h = torch.ones(3)", "h = make()"), ["w", "v"]),  # made somehow, never changed
    (("for x in xs:", "for h in xs:"), ["w"]),  # h is the loop's variable
    (("v = h.to(dev)", "v = h.to(dev, non_blocking=True)"), ["w", "v"]),
    (("v = h.to(dev)", "v = h.to(dev, requires_grad=True)"), ["w"]),  # (not a pure call)
    (("v = h.to(dev)", "v = (h * 2).to(dev)"), ["w"]),  # h not uploaded itself: unproven
    (("        w = torch", "        if x:\n            w = torch"), ["v"]),  # not every step
    (("[0.2, 0.3, 0.5]", "ws"), ["w", "v"]),  # a list bound once, read only
    (("[0.2, 0.3, 0.5]", "ws", "return y", "keep(ws)\n    return y"), ["v"]),  # handed on
    (("[0.2, 0.3, 0.5]", "ws", "h = torch", "ws.append(1)\n    h = torch"), ["v"]),
])
def test_only_what_the_loop_provably_never_changes_is_hoisted(tmp_path, change, names):
    text = HOIST
    for old, new in zip(change[::2], change[1::2]):
        text = text.replace(old, new)
    if "ws" in text:
        text = text.replace("import torch\n", "import torch\n\nws = [0.2, 0.3, 0.5]\n")
    path = write(tmp_path, text)
    lines = text.splitlines()
    copies = []
    for name in ("w", "v"):
        line = next(n for n, t in enumerate(lines, 1) if t.strip().startswith(f"{name} = ")
                    and ".to(" in t)
        copies.append(copy_at(path, line, "HtoD", "to", calls=6))
    assert hoisted(hoist_trace(copies), tmp_path) == [names]


# ----- fused-grad-scaler -----

SCALER = textwrap.dedent("""\
    import torch

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    for step in range(3):
        scaler.scale(model(torch.ones(4)).sum()).backward()
        scaler.step(opt)
        scaler.update()
""")


def test_a_fused_optimizer_lets_grad_scaler_read_nothing_back(tmp_path):
    path = write(tmp_path, SCALER)
    c = copy_at(path, 8, calls=3, host_ns=300_000, end_col=20)
    [s] = match(FusedGradScaler, tmp_path, [c])
    assert s.title == ("build the AdamW at prog.py:4 with fused=True, so that GradScaler.step "
                       "reads nothing back (the fused update rounds otherwise)")
    assert s.detail == (
        "`scaler.step` at prog.py:8 reads found_inf back to the host 3 times, to decide on the "
        "host whether to step; a fused AdamW takes the scale and found_inf on the device and "
        "skips the update itself. fused=torch.cuda.is_available() leaves a run without a GPU "
        "as it was. The fused kernel computes the same update in one kernel, rounded "
        "otherwise: results may differ in the last bits. The saving counts the reads it "
        "removes only: one kernel instead of the optimizer's foreach kernels saves more, not "
        "estimated here (explain --verify measures it)")
    assert s.diff == udiff("""\
        --- a/prog.py
        +++ b/prog.py
        @@ -1,7 +1,7 @@
         import torch
         
         model = torch.nn.Linear(4, 4)
        -opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        +opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=torch.cuda.is_available())
         scaler = torch.amp.GradScaler("cuda")
         for step in range(3):
             scaler.scale(model(torch.ones(4)).sum()).backward()
        """)
    assert s.apply == {"kind": "lines", "edits": [{
        "file": path, "line": 4, "old": "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)",
        "new": "opt = torch.optim.AdamW(model.parameters(), lr=1e-3, "
               "fused=torch.cuda.is_available())"}]}
    assert (s.removes, s.effect, s.changes_results, s.saving_ns) == ([c], DROP, True, 300_000)


@pytest.mark.parametrize("head, built, line, new", [
    ("import torch as th\nfrom torch.optim import AdamW as W\n",
     "opt = W(model.parameters(), lr=1e-3)\n",
     4, "opt = W(model.parameters(), lr=1e-3, fused=th.cuda.is_available())"),
    ("import torch\nfrom torch import optim\n",
     "opt = optim.SGD(model.parameters(), lr=1e-3)\n",
     4, "opt = optim.SGD(model.parameters(), lr=1e-3, fused=torch.cuda.is_available())"),
    ("import torch\nimport torch.optim as o\n",
     "opt = o.Adam(\n    model.parameters(),\n    lr=1e-3,\n)\n",
     6, "    lr=1e-3, fused=torch.cuda.is_available(),"),
])
def test_the_optimizer_is_found_however_it_is_imported(tmp_path, head, built, line, new):
    path = write(tmp_path, head + "model = make()\n" + built +
                 "scaler = GradScaler('cuda')\nfor i in range(3):\n    scaler.step(opt)\n")
    step = len((head + built).splitlines()) + 4
    [s] = match(FusedGradScaler, tmp_path, [copy_at(path, step, calls=3)])
    assert [(e["line"], e["new"]) for e in s.apply["edits"]] == [(line, new)]


@pytest.mark.parametrize("change, version", [
    (("lr=1e-3)", "lr=1e-3, foreach=True)"), "2.13.0"),  # fused and foreach refuse each other
    (("lr=1e-3)", "lr=1e-3, fused=False)"), "2.13.0"),  # the user's own choice
    (("lr=1e-3)", "lr=1e-3, **extra)"), "2.13.0"),  # may hold either
    (("torch.optim.AdamW", "torch.optim.RMSprop"), "2.13.0"),  # no fused kernel
    (("torch.optim.AdamW", "torch.optim.SGD"), "2.2.1"),  # before SGD had one
    (("scaler = torch.amp.GradScaler", "scaler = Scaler"), "2.13.0"),  # not a GradScaler
    (("opt = torch", "opt = make(model)\nother = torch"), "2.13.0"),  # built elsewhere
])
def test_no_fused_edit_where_it_would_not_run_or_not_help(tmp_path, change, version):
    path = write(tmp_path, SCALER.replace(*change))
    step = next(n for n, t in enumerate(pathlib.Path(path).read_text().splitlines(), 1)
                if "scaler.step(opt)" in t)
    assert match(FusedGradScaler, tmp_path, [copy_at(path, step, calls=3)],
                 torch_version=version) == []


# ----- build-on-device -----

BUILD = textwrap.dedent("""\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)


    def main(dev):
        model = Net().to(dev)
        return model
""")


def build_copies(path: str) -> list[CopyRecord]:
    made = OpRef("aten::uniform_", "cpu", Site(path, 8, "Net.__init__"))
    return [copy_at(path, 15, "HtoD", "to", calls=1, host_ns=50_000, shape=[4, 4],
                    producer=made),
            copy_at(path, 15, "HtoD", "to", calls=1, host_ns=20_000, shape=[4],
                    producer=made)]


def test_a_module_moved_after_it_is_built_is_built_on_the_device(tmp_path):
    path = write(tmp_path, BUILD)
    copies = build_copies(path)
    ops = [OpRecord("aten::uniform_", "cpu", Site(path, 8, "Net.__init__"), 2, 4_000, 0)]
    [s] = match(BuildOnDevice, tmp_path, copies, ops)
    assert s.title == ("build `model` on the device at prog.py:15 instead of copying its "
                       "parameters there (initial weights drawn on the device)")
    assert s.detail == (
        "2 host->device copies, 8 bytes, each waited for, once: the constructor makes every "
        "parameter on the host and `.to` moves it. Under `with torch.device(dev):` the "
        "constructor makes them on the device (the `.to` stays, moving nothing, for what a "
        "constructor makes outside torch's factories); its random initial weights are drawn "
        "from the device's generator, not the host's: other numbers (loading the weights "
        "afterwards would make them the same)")
    assert s.diff == udiff("""\
        --- a/prog.py
        +++ b/prog.py
        @@ -12,5 +12,6 @@
         
         
         def main(dev):
        -    model = Net().to(dev)
        +    with torch.device(dev):
        +        model = Net().to(dev)
             return model
        """)
    assert s.apply == {"kind": "lines", "edits": [{
        "file": path, "line": 15, "old": "    model = Net().to(dev)",
        "new": "    with torch.device(dev):\n        model = Net().to(dev)"}]}
    assert (s.removes, s.effect, s.changes_results, s.saving_ns) == (copies, DROP, True, 70_000)


@pytest.mark.parametrize("loaded, elsewhere, changes", [
    (True, False, False), (True, True, True), (False, False, True)])
def test_it_changes_the_numbers_unless_the_weights_are_loaded_and_nothing_else_draws(
        tmp_path, loaded, elsewhere, changes):
    text = BUILD.replace("return model", "model.load_state_dict(sd)\n    return model"
                         if loaded else "return model").replace("main(dev)", "main(dev, sd)")
    path = write(tmp_path, text)
    ops = [OpRecord("aten::uniform_", "cpu", Site(path, 8, "Net.__init__"), 2, 4_000, 0)]
    if elsewhere:
        ops.append(OpRecord("aten::randn", "cpu", Site(path, 11, "forward"), 9, 4_000, 0))
    [s] = match(BuildOnDevice, tmp_path, build_copies(path), ops)
    assert s.changes_results is changes
    assert s.title.endswith("(initial weights drawn on the device)") is changes


@pytest.mark.parametrize("old, new, line", [
    ("model = Net().to(dev)", "model = nn.Linear(4, 4).cuda()",
     '    with torch.device("cuda"):\n        model = nn.Linear(4, 4).cuda()'),
    ("model = Net().to(dev)", "model = torch.nn.Linear(4, 4).to(device=dev)",
     "    with torch.device(dev):\n        model = torch.nn.Linear(4, 4).to(device=dev)"),
])
def test_torch_nn_modules_and_either_spelling_of_the_move(tmp_path, old, new, line):
    path = write(tmp_path, BUILD.replace(old, new))
    copies = [copy_at(path, 15, "HtoD", "cuda" if "cuda" in new else "to", calls=1)]
    [s] = match(BuildOnDevice, tmp_path, copies)
    assert s.apply["edits"][0]["new"] == line


@pytest.mark.parametrize("change", [
    ("return self.fc(x)", "return self.fc(x).cpu()"),  # the class needs the host
    ("Net().to(dev)", "Net().to(dev, torch.float16)"),  # converts too
    ("Net().to(dev)", "Net().to(torch.float16)"),
    ("Net().to(dev)", "make_net().to(dev)"),  # not a class of this file's or torch.nn's
    ("Net().to(dev)", "Other().to(dev)"),
    ("model = Net().to(dev)", "if dev: model = Net().to(dev)"),
    ("nn.Linear(4, 4)", "nn.Linear(width(), 4)"),  # a function of the file's reads back
    ("Net().to(dev)", "Net(torch.ones(2).tolist()).to(dev)"),  # so does an argument
])
def test_no_edit_for_a_construction_it_cannot_read(tmp_path, change):
    text = BUILD.replace(*change) + "\n\ndef width():\n    return int(torch.ones(4).sum().item())\n"
    path = write(tmp_path, text)
    assert match(BuildOnDevice, tmp_path, build_copies(path)) == []


def test_no_device_context_before_torch_2(tmp_path):
    path = write(tmp_path, BUILD)
    assert match(BuildOnDevice, tmp_path, build_copies(path), torch_version="1.13.1") == []


def test_a_move_every_step_is_not_a_construction(tmp_path):
    path = write(tmp_path, BUILD)
    copies = [copy_at(path, 15, "HtoD", "to", calls=6)]  # (per step: not set-up)
    assert match(BuildOnDevice, tmp_path, copies) == []


# ----- real programs on the simulated GPU -----

def _result_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 1, text[-2000:]
    return lines[0]


def profile(tmp_path, name: str, *args: str, apply: dict | None = None, tag: str = ""):
    """`memcpy-doctor profile PROGRAM ARGS` (with `--apply` of one suggestion's edit): its
    RESULT line and its trace."""
    out = tmp_path / f"trace{tag}.json"
    command = [sys.executable, "-m", "memcpy_doctor", "profile", "--no-report", "-o", str(out)]
    if apply is not None:
        edits = tmp_path / f"edit{tag}.json"
        edits.write_text(json.dumps({"suggestions": [{"apply": apply}]}))
        command += ["--apply", str(edits)]
    done = subprocess.run(command + [str(PROGRAMS / name), *args], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return _result_line(done.stdout), load_trace(str(out))


def plain(tmp_path, name: str, *args: str, apply: dict | None = None, tag: str = "") -> str:
    """The RESULT line of `python PROGRAM ARGS` (here, no GPU), with the edit made in a copy
    of the program where `apply` is given."""
    program = PROGRAMS / name
    if apply is not None:
        lines = program.read_text().splitlines()
        for e in apply["edits"]:
            assert lines[e["line"] - 1] == e["old"]
            lines[e["line"] - 1] = e["new"]
        program = tmp_path / f"edited{tag}_{name}"
        program.write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, str(program), *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return _result_line(done.stdout)


def one(rule, trace) -> object:
    [s] = rule().match(trace, explain(trace), str(PROGRAMS))
    return s


def paths(trace, line: int, trigger: str) -> list[int]:
    """The calls of each copy path at `line` of a program with `trigger`."""
    return [c.calls for c in trace.copies if c.site is not None and c.site.line == line
            and c.trigger == trigger and c.site.file.startswith(str(PROGRAMS))]


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory):
    """expert_loop.py traced (its RESULT line and trace), and its RESULT line in a plain run."""
    tmp = tmp_path_factory.mktemp("expert_loop")
    (result, trace), plain_result = concurrently(lambda: profile(tmp, "expert_loop.py"),
                                                 lambda: plain(tmp, "expert_loop.py"))
    return tmp, result, trace, plain_result


def test_hoisting_the_constant_upload_of_a_real_loop(loop_run):
    tmp, result, trace, plain_before = loop_run
    s = one(HoistInvariantUpload, trace)
    assert s.title == "upload `w` once, before the loop at expert_loop.py:26"
    assert [(c.site.line, c.calls) for c in s.removes] == [(28, 6)]
    assert s.saving_ns == sum(c.host_ns * 5 // 6 for c in s.removes)
    (after, edited), plain_after = concurrently(
        lambda: profile(tmp, "expert_loop.py", apply=s.apply, tag="hoist"),
        lambda: plain(tmp, "expert_loop.py", apply=s.apply, tag="hoist"))
    assert after == result and plain_after == plain_before  # the same numbers
    assert paths(edited, 28, "to") == [] and paths(edited, 26, "to") == [1]  # (renumbered)


def test_building_a_real_model_on_the_device(loop_run):
    tmp, result, trace, plain_before = loop_run
    s = one(BuildOnDevice, trace)
    assert s.title == ("build `model` on the device at expert_loop.py:20 instead of copying "
                       "its parameters there (initial weights drawn on the device)")
    assert sorted(c.calls for c in s.removes) == [1, 1, 1, 1] and s.changes_results
    assert s.saving_ns == sum(c.host_ns for c in s.removes)
    (after, edited), plain_after = concurrently(
        lambda: profile(tmp, "expert_loop.py", apply=s.apply, tag="build"),
        lambda: plain(tmp, "expert_loop.py", apply=s.apply, tag="build"))
    assert paths(trace, 20, "to") == [1, 1, 1, 1] and paths(edited, 20, "to") == []
    # the simulated GPU draws "device" random numbers on the host: the same numbers here
    # (a real GPU draws others, as the title says); without a GPU, the run is as it was
    assert after == result and plain_after == plain_before


@pytest.mark.parametrize("mode, line, trigger", [("sum", 36, "item"), ("list", 34, "item")])
def test_summing_or_listing_a_real_loss_on_the_device(tmp_path, mode, line, trigger):
    args = ["list"] if mode == "list" else []
    result, trace = profile(tmp_path, "expert_sum.py", *args)
    s = one(AccumulateOnDevice, trace)
    assert [(c.site.line, c.calls) for c in s.removes] == [(line, 6)]
    assert s.saving_ns == s.removes[0].host_ns * 5 // 6
    (after, edited), plain_after, plain_before = concurrently(
        lambda: profile(tmp_path, "expert_sum.py", *args, apply=s.apply, tag="acc"),
        lambda: plain(tmp_path, "expert_sum.py", *args, apply=s.apply),
        lambda: plain(tmp_path, "expert_sum.py", *args))
    assert after == result and plain_after == plain_before  # the same numbers, to the bit
    assert paths(edited, line, trigger) == []
    read_after = "float" if mode == "sum" else "tolist"
    assert paths(edited, 36, read_after) == [1]  # one read, after the loop (its last line)
    assert edited.summary.total_ns < trace.summary.total_ns


def test_fusing_a_real_optimizer_under_grad_scaler(tmp_path):
    result, trace = profile(tmp_path, "expert_amp.py")
    s = one(FusedGradScaler, trace)
    assert s.title == ("build the AdamW at expert_amp.py:13 with fused=True, so that "
                       "GradScaler.step reads nothing back (the fused update rounds otherwise)")
    assert [(c.site.line, c.calls, c.shape, c.dtype) for c in s.removes] == [
        (23, 5, [], "float32")]
    (after, edited), plain_after, plain_before = concurrently(
        lambda: profile(tmp_path, "expert_amp.py", apply=s.apply, tag="fused"),
        lambda: plain(tmp_path, "expert_amp.py", apply=s.apply),
        lambda: plain(tmp_path, "expert_amp.py"))
    assert paths(trace, 23, "item") == [5] and paths(edited, 23, "item") == []
    assert {(o.op, o.calls) for o in edited.ops if "fused" in o.op} == {
        ("aten::_fused_adamw_", 5)}  # the step the scaler no longer guards on the host
    assert plain_after == plain_before  # no GPU: fused=False, the run as it was
    assert after.startswith("RESULT expert_amp losses=")


def test_no_list_edit_for_an_inner_loop_whose_list_the_outer_loop_appends_to_again(tmp_path):
    """A diffusers DDPM training script (seen by explain --verify: the edit raised): the list
    made numbers after the inner loop would get device tensors again in the next epoch."""
    text = textwrap.dedent("""\
        import torch
        losses = []
        for epoch in range(2):
            for x in loader:
                loss = model(x)
                losses.append(loss.item())
            print(sum(losses[-4:]) / 4)
    """)
    path = write(tmp_path, text)
    assert match(AccumulateOnDevice, tmp_path, [copy_at(path, 6)]) == []



# ----- make-on-device -----

FACTORY = textwrap.dedent("""\
    import torch
    device = "cuda"
    for step in range(10):
        x = {made}
""")


@pytest.mark.parametrize("made, new, random", [
    ("torch.randn(4, 8).to(device)", "torch.randn(4, 8, device=device)", True),
    ("torch.zeros(4).cuda()", 'torch.zeros(4, device="cuda")', False),
    ("torch.arange(8).to(device=device, non_blocking=True)",
     "torch.arange(8, device=device)", False),
    ("torch.randint(0, 9, (4,), dtype=torch.long).to(device)",
     "torch.randint(0, 9, (4,), dtype=torch.long, device=device)", True),
])
def test_a_factory_copied_at_once_is_made_on_the_device(tmp_path, made, new, random):
    path = write(tmp_path, FACTORY.format(made=made))
    c = copy_at(path, 4, "HtoD", "to", end_col=end_of(path, 4, made))
    [s] = match(MakeOnDevice, tmp_path, [c])
    assert s.apply["edits"] == [{"file": path, "line": 4, "old": f"    x = {made}",
                                 "new": f"    x = {new}"}]
    assert (s.effect, s.changes_results) == (DROP, random)
    assert ("other numbers" in s.title) == random
    assert s.cost_ns == 10 * 5_000  # (the device fills it: a launch each time)


@pytest.mark.parametrize("made", [
    "torch.randn(4, generator=g).to(device)",  # a host generator cannot draw on the device
    "torch.zeros(4).to(device, torch.float16)",  # converts too
    "torch.zeros(4).to(torch.float16)",  # (a dtype: no copy at all, but not this shape)
    "torch.tensor([1.0, 2.0]).to(device)",  # from Python data: a copy either way
    "torch.zeros(4, device='cpu').to(device)",
])
def test_no_factory_edit_where_it_would_not_be_the_same_call(tmp_path, made):
    path = write(tmp_path, FACTORY.format(made=made))
    c = copy_at(path, 4, "HtoD", "to", end_col=end_of(path, 4, made))
    assert match(MakeOnDevice, tmp_path, [c]) == []


# ----- index-once -----

MASKED = textwrap.dedent("""\
    import torch
    for epoch in range(10):
        out = model(data.x)
        loss = loss_fn(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
""")


def _mask_copy(path: str, line: int, text: str, calls: int = 10, ref_reads=None):
    return copy_at(path, line, trigger="mask", calls=calls, end_col=end_of(path, line, text))


def test_a_mask_that_never_changes_becomes_positions_before_the_loop(tmp_path):
    path = write(tmp_path, MASKED)
    forward = _mask_copy(path, 4, "out[data.train_mask]", calls=20)
    backward = copy_at(path, 5, trigger="mask", calls=10, end_col=17)
    events = [TimelineEvent("copy", i, None, 0, 0, 1, 0, 1, [7], []) for i in (0, 1, 0)]
    trace = make_trace(copies=[forward, backward])
    trace.timeline = EventTimeline(10_000, 0, events)
    [s] = IndexOnce().match(trace, explain(trace), str(tmp_path))
    assert s.title == "turn `data.train_mask` into positions once, before the loop at prog.py:4"
    assert s.removes == [forward, backward]  # (the backward's copy reads the same mask)
    assert s.apply["edits"] == [
        {"file": path, "line": 2, "old": "for epoch in range(10):",
         "new": "train_mask_idx = data.train_mask.nonzero(as_tuple=True)\n"
                "for epoch in range(10):"},
        {"file": path, "line": 4,
         "old": "    loss = loss_fn(out[data.train_mask], data.y[data.train_mask])",
         "new": "    loss = loss_fn(out[train_mask_idx], data.y[train_mask_idx])"}]
    assert (s.effect, s.changes_results) == (DROP, False)
    assert s.saving_ns == 2 * 900_000 - 900_000 // 20  # (less the one count before the loop)


@pytest.mark.parametrize("change", [
    ("    out = model(data.x)\n", "    out = model(data.x)\n    data = step(data)\n"),
    ("    out = model(data.x)\n", "    out = model(data.x)\n    data.train_mask = m\n"),
    ("    out = model(data.x)\n", "    out = model(data.x)\n    data.train_mask[0] = True\n"),
])
def test_no_positions_where_the_mask_may_change_in_the_loop(tmp_path, change):
    text = MASKED.replace(*change)
    path = write(tmp_path, text)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "loss_fn" in t)
    assert match(IndexOnce, tmp_path, [_mask_copy(path, line, "out[data.train_mask]")]) == []


def test_no_positions_where_the_timeline_saw_the_mask_change(tmp_path):
    path = write(tmp_path, MASKED)
    c = _mask_copy(path, 4, "out[data.train_mask]")
    trace = make_trace(copies=[c])
    trace.timeline = EventTimeline(10_000, 0, [
        TimelineEvent("copy", 0, None, 0, 0, 1, 0, 1, [n], []) for n in (7, 8)])
    assert IndexOnce().match(trace, explain(trace), str(tmp_path)) == []


def test_positions_index_the_same_elements_with_the_same_gradient():
    """What the edit relies on: x[mask] and x[mask.nonzero(as_tuple=True)] are the same
    tensor, and so are their gradients."""
    import torch
    torch.manual_seed(0)
    for shape, mask_shape in (((6, 3), (6,)), ((4, 5), (4, 5))):
        x = torch.randn(*shape, requires_grad=True)
        mask = torch.rand(*mask_shape) > 0.5
        a = x[mask]
        b = x[mask.nonzero(as_tuple=True)]
        assert torch.equal(a, b)
        ga, = torch.autograd.grad(a.sum() * 3, x)
        gb, = torch.autograd.grad(b.sum() * 3, x)
        assert torch.equal(ga, gb)
