"""Soak: a sample model for many steps under the tracer against a short run of it. The
tracer's own memory stays flat (its records are aggregated, not kept per op; the ordered
timeline is a bounded prefix of the run, which both runs fill) and the trace is the same in
content: the same ops, copies, call sites, waits and flows, only with larger counts and
times.

The tracer's memory is what memcpy-doctor's own lines allocated and still hold at the end of
the run (tracemalloc, filtered to this package's files), not the process's peak: torch under
any dispatch mode, even one that only calls the op, holds some tens of KiB more after 200
steps than after 20 (freelists and caches that fill up, then stay), enough to fail a bound on
the peak on a CI machine while measuring nothing of ours."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import memcpy_doctor
from memcpy_doctor.core.trace import Trace
from memcpy_doctor.tracer import Tracer

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
SHORT, LONG = 20, 80
OURS = tracemalloc.Filter(True, str(Path(memcpy_doctor.__file__).resolve().parent / "*"))

#: The Python version of the table of live tensors' producers sweeps dead tensors' entries
#: when it doubles, from PRODUCER_SWEEP_MIN entries on (4096: a hundred steps of this model).
#: A small threshold reaches that steady state in a few steps, so a short run shows it too.
#: (The compiled one sweeps whenever it fills, from 64 slots.)
SWEEP_MIN = 256

#: The timeline's bound here: the short run's first steps fill it.
TIMELINE_EVENTS = 200

#: Fields that grow with the run; everything else must be equal.
_COUNTED = ("calls", "bytes", "flops")


@pytest.fixture(scope="module")
def model():
    sys.path.insert(0, str(SAMPLES))
    try:
        import item_every_step
    finally:
        sys.path.remove(str(SAMPLES))
    return item_every_step


def profile(model: Any, steps: int) -> tuple[Trace, int]:
    """The trace of `steps` training steps, and the Python memory that this package's code
    allocated while they ran under the tracer and still held at their end, garbage
    collected (its aggregates, the producers' table, the storage marks; tensors' storage is
    not Python memory)."""
    tracer = Tracer(device="sim", timeline_events=TIMELINE_EVENTS)
    tracemalloc.start()
    try:
        with contextlib.redirect_stdout(io.StringIO()), tracer:
            model.main(["--steps", str(steps)])
            gc.collect()
            held = tracemalloc.take_snapshot().filter_traces([OURS])
        ours = sum(stat.size for stat in held.statistics("filename"))
    finally:
        tracemalloc.stop()
    return tracer.trace, ours


def content(trace: Trace) -> dict[str, list[str]]:
    """The trace without what grows with the run (counts, bytes, times; the summary and the
    command): each table as a sorted list of records."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if k not in _COUNTED and not k.endswith(("_ns", "_ms"))}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    data = trace.to_dict()
    return {table: sorted(json.dumps(strip(r), sort_keys=True) for r in data[table])
            for table in ("events", "ops", "copies", "waits", "flows")}


@pytest.mark.parametrize("table", ["compiled", "python"])
def test_long_run_flat_memory_and_same_trace(model, monkeypatch, table):
    from memcpy_doctor.tracer import collector, producers
    if table == "python":
        monkeypatch.setattr(collector, "ProducerTable",
                            lambda: producers.PyProducerTable(SWEEP_MIN))
    elif not producers.COMPILED:
        pytest.skip("the C extension is not built")
    # the first run warms up (torch's lazy imports and caches are not the tracer's); all
    # from one line, as the copies' stacks reach up into this test
    _, (short, short_held), (long, long_held) = [profile(model, n) for n in (2, SHORT, LONG)]
    # 60 more steps are 2,400 more ops: 20 bytes kept per op would break this bound, which
    # leaves room for the Python table, whose sweeps make what it holds swing by up to some
    # 32 KiB with the step count at which a run ends
    assert 0 < long_held <= short_held + 48 * 1024, (short_held, long_held)
    assert content(long) == content(short)
    # each copy path is made once (model.to) or the same number of times every step
    for s, lg in zip(short.copies, long.copies):
        assert (s.site, s.trigger, s.direction) == (lg.site, lg.trigger, lg.direction)
        assert (s.calls, s.bytes) == (lg.calls, lg.bytes) or (
            (s.calls * LONG, s.bytes * LONG) == (lg.calls * SHORT, lg.bytes * SHORT))
    # x, y to the device and loss.item() every step; the 4 parameters once (model.to)
    assert long.summary.memcpy_sync.calls == 3 * LONG + 4
    assert len(long.to_json()) < len(short.to_json()) * 1.2
