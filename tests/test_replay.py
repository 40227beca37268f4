"""The replay that prices a suggestion (analysis/replay.py): hand-built timelines with round
numbers, played on the two clocks the simulated GPU keeps, and one run of the GPU-bound loop
of issue 40 on the simulated GPU, whose replayed saving `diff` then confirms."""

from __future__ import annotations

import dataclasses
import textwrap

import memcpy_doctor
from memcpy_doctor.analysis.attribution import explain
from memcpy_doctor.analysis.replay import Replay, joint_saving, price
from memcpy_doctor.analysis.rules import suggest
from memcpy_doctor.analysis.suggestion import ASYNC, DROP, ONCE, REPLAYED, UPPER_BOUND, \
    Suggestion
from memcpy_doctor.core.costmodel import load_profile
from memcpy_doctor.core.summary import summarize
from memcpy_doctor.core.timeline import EventTimeline, TimelineEvent
from memcpy_doctor.core.trace import CopyRecord, Meta, OpRecord, Site, Trace

AT = Site("/w/train.py", 7, "<module>")

# One step: 1 us of Python, a kernel (launch 1 us, 10 us on the device), again, then 1 us of
# Python and a sync read (launch 1 us, 1 us on the device, 1 us after it). Three steps.
STEP = [("op", 0), ("op", 0), ("copy", 0)]


def _timeline(steps: int) -> tuple[list[TimelineEvent], int]:
    host = device = 0
    events = []
    for _ in range(steps):
        for kind, ref in STEP:
            host += 1_000  # the gap
            start = host
            host += 1_000  # the launch
            dev_start = max(host, device)
            device = dev_start + (10_000 if kind == "op" else 1_000)
            if kind == "copy":
                host = device + 1_000
            events.append(TimelineEvent(kind, ref, None, 0, start, host, dev_start, device))
    return events, max(host, device)


def _trace(steps: int = 3, recorded: int = 3, pinned: bool = False) -> Trace:
    """A run of `steps` steps whose timeline kept the first `recorded`."""
    events, _ = _timeline(recorded)
    total = _timeline(steps)[1]
    read = CopyRecord("DtoH", True, pinned, "item", steps, 4 * steps, 19_000 * steps,
                      1_000 * steps, AT, [AT], None, None, [], "float32")
    mm = OpRecord("aten::mm", "cuda:0", AT, 2 * steps, 2_000 * steps, 20_000 * steps,
                  run_ns=50_000 * steps)
    profile = {**load_profile().to_dict(), "launch_ns": 1_000}  # (the launches above)
    meta = Meta(device="sim", simulated=True, device_name="GPU", device_profile=profile,
                torch_version="2.13.0", command=["train.py"])
    trace = Trace(meta, summarize(total, [], [read]), [], [mm], [read], [])
    trace.timeline = EventTimeline(10_000, (steps - recorded) * len(STEP), events)
    return trace


def _read_once(trace: Trace, effect: str = ONCE) -> Suggestion:
    c = trace.copies[0]
    return Suggestion("host-read-in-loop", "read once", "", [AT], [c],
                      c.host_ns * (c.calls - 1) // c.calls, effect=effect)


def test_the_replay_of_the_run_as_it_was_ends_where_the_run_ended():
    trace = _trace()
    assert Replay(trace).base_ns == trace.summary.total_ns == 72_000


def test_a_read_moved_after_a_gpu_bound_loop_saves_the_bubbles_not_the_wait():
    trace = _trace()
    s = _read_once(trace)
    assert s.saving_ns == 38_000  # the rule's bound: two reads' host time, waits included
    price(trace, [s])
    # without the reads the host runs ahead; the device's 60 us of kernels end at 62 us, and
    # the one read left after the loop takes 3 us: 72 - 65
    assert (s.saving_ns, s.estimate) == (7_000, REPLAYED)


def test_past_the_timeline_the_saving_is_scaled_by_the_calls_changed():
    trace = _trace(steps=6, recorded=3)
    s = _read_once(trace)
    price(trace, [s])
    # the window's three reads save 10 us (no read is left in it: it comes after the loop);
    # the whole run changes 5 of its 6 calls
    assert s.saving_ns == 10_000 * 5 // 3


def test_a_copy_made_async_costs_its_launch_and_the_pinned_copy_on_the_device():
    trace = _trace()
    s = _read_once(trace, ASYNC)
    price(trace, [s])
    replay = Replay(trace)
    pinned = replay.profile.copy_ns("DtoH", 4, True)
    # each step: 1 + 1 + 1 + 1 + 1 + 1 us of host; the device's kernels and the copies
    # queue back to back: 3 * (20 us + the copy) after the first launch at 2 us
    assert s.saving_ns == 72_000 - (2_000 + 3 * (20_000 + pinned))


def test_without_a_timeline_the_saving_is_the_rules_upper_bound_and_says_so():
    trace = _trace()
    trace.timeline = None
    s = _read_once(trace)
    price(trace, [s])
    assert (s.saving_ns, s.estimate) == (38_000, UPPER_BOUND)
    assert joint_saving(trace, [s]) is None


def test_edits_made_together_are_replayed_together_not_summed():
    trace = _trace()
    one, again = _read_once(trace), _read_once(trace, DROP)
    price(trace, [one, again])
    assert (one.saving_ns, again.saving_ns) == (7_000, 10_000)
    # the same read dropped by one and kept once by the other: dropped, once
    assert joint_saving(trace, [one, again]) == (10_000, REPLAYED)


def test_an_ops_move_to_the_host_costs_its_host_time():
    trace = _trace()
    s = Suggestion("host-round-trip", "guard", "", [AT], [trace.copies[0]], 1,
                   moved=[trace.ops[0]], cost_ns=500)
    price(trace, [s])
    # no kernels and no reads: each step is 3 us of gaps, 2 x 25 us of the op on the host
    assert s.saving_ns == 72_000 - 3 * (3_000 + 50_000) - 500


def test_the_gpu_bound_loop_of_issue_40_is_priced_within_2x_of_the_change(tmp_path):
    """The loop whose `.item()` explain once promised ~17 ms for; making the change gives
    what the bubbles were. On the simulated GPU (modeled times do not vary)."""
    loop = textwrap.dedent("""\
        import torch
        a = torch.randn(512, 512, device="cuda")
        for i in range(3):
            b = a
            for _ in range(10):
                b = b @ a
            s = b.sum(){read}
        {after}
    """)
    before = tmp_path / "before.py"
    before.write_text(loop.format(read=".item()", after="print(s)"))
    after = tmp_path / "after.py"
    after.write_text(loop.format(read="", after="print(s.item())"))
    traces = []
    for path in (before, after):
        with memcpy_doctor.profiler(device="sim") as prof:
            exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__"})
        traces.append(prof.trace)
    (s,) = [s for s in suggest(traces[0], explain(traces[0]))
            if s.rule == "host-read-in-loop"]
    made = traces[0].summary.total_ns - traces[1].summary.total_ns
    assert s.estimate == REPLAYED
    assert made > 0 and made / 2 <= s.saving_ns <= made * 2
    upper = dataclasses.replace(traces[0], timeline=None)
    (bound,) = [s for s in suggest(upper, explain(upper)) if s.rule == "host-read-in-loop"]
    assert bound.saving_ns > 4 * made  # what the rule alone would have promised


def test_an_edit_may_drop_some_copies_and_make_others_async():
    """A library setting that stops a read and makes an upload non_blocking: each copy is
    replayed as the edit changes it (Suggestion.effects)."""
    trace = _trace()
    c = trace.copies[0]
    both = Suggestion("library-setting", "settings", "", [AT], [c], 1, effects={id(c): ASYNC})
    alone = _read_once(trace, ASYNC)
    price(trace, [both, alone])
    assert both.effect_on(c) == ASYNC and both.saving_ns == alone.saving_ns


def test_explain_on_a_schema_1_trace_gives_the_upper_bound_and_says_so(tmp_path):
    """A trace written before the timeline existed still gets its suggestions, each marked as
    the rule's upper bound, through the CLI as a user runs it."""
    import json
    import subprocess
    import sys

    loop = tmp_path / "loop.py"
    loop.write_text("import torch\nx = torch.ones(4, device='cuda')\nt = 0.0\n"
                    "for i in range(8):\n    t += (x * i).sum().item()\nprint(t)\n")
    with memcpy_doctor.profiler(device="sim") as prof:
        exec(compile(loop.read_text(), str(loop), "exec"), {"__name__": "__main__"})
    data = prof.trace.to_dict()
    data["schema_version"] = 1
    del data["timeline"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    done = subprocess.run([sys.executable, "-m", "memcpy_doctor", "explain", str(path),
                           "--format", "json"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["suggestions"]
    assert found and {s["estimate"] for s in found} == {UPPER_BOUND}
    text = subprocess.run([sys.executable, "-m", "memcpy_doctor", "explain", str(path)],
                          capture_output=True, text=True, cwd=tmp_path).stdout
    assert "(estimated, upper bound (no timeline in this trace);" in text
