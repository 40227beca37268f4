"""The steady step the HTML report draws (analysis/step.py)."""

from __future__ import annotations

import dataclasses

from memcpy_doctor.analysis.step import pick_step
from memcpy_doctor.core.timeline import EventTimeline, TimelineEvent
from test_html import STEP_NS, _step_events, timeline_trace


def test_a_setup_record_called_once_a_step_by_count_does_not_mark_the_step():
    """An HF Trainer's run: 16 weight initialisations in a run of 16 steps, all before the
    loop. Their "steps" hold none of the loop's sync copies; the loop's own op marks it."""
    trace = timeline_trace()
    marker = pick_step(trace).marker
    calls = trace.ops[marker[1]].calls
    trace.ops.append(dataclasses.replace(trace.ops[marker[1]], op="aten::normal_"))
    init = len(trace.ops) - 1
    setup = [TimelineEvent("op", init, None, 0, k * 1_000, k * 1_000 + 500, None, None)
             for k in range(calls)]
    shift = calls * 1_000
    loop = [dataclasses.replace(e, host_start_ns=e.host_start_ns + shift,
                                host_end_ns=e.host_end_ns + shift,
                                device_start_ns=e.device_start_ns + shift,
                                device_end_ns=e.device_end_ns + shift)
            for k in range(4) for e in _step_events(k * STEP_NS)]
    trace.timeline = EventTimeline(10_000, 0, setup + loop)
    win = pick_step(trace)
    assert win.marker == marker  # not ("op", init)
    assert any(e.kind == "copy" for e in trace.timeline.events[win.first:win.end])
