"""Soak: a sample model for many steps under the tracer against a short run of it. The
tracer's own memory stays flat (its records are aggregated, not kept per op) and the trace is
the same in content: the same ops, copies, call sites, waits and flows, only with larger
counts and times."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from memcpy_doctor.core.trace import Trace
from memcpy_doctor.tracer import Tracer

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
SHORT, LONG = 20, 80

#: The Python version of the table of live tensors' producers sweeps dead tensors' entries
#: when it doubles, from PRODUCER_SWEEP_MIN entries on (4096: a hundred steps of this model).
#: A small threshold reaches that steady state in a few steps, so a short run shows it too.
#: (The compiled one sweeps whenever it fills, from 64 slots.)
SWEEP_MIN = 256

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
    """The trace of `steps` training steps, and the peak of Python memory allocated while
    they ran under the tracer (tensors' storage is not Python memory: what is measured is
    the tracer's bookkeeping and the Python objects of the run)."""
    tracer = Tracer(device="sim")
    tracemalloc.start()
    try:
        with contextlib.redirect_stdout(io.StringIO()), tracer:
            model.main(["--steps", str(steps)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return tracer.trace, peak


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
    _, (short, short_peak), (long, long_peak) = [profile(model, n) for n in (2, SHORT, LONG)]
    assert long_peak <= short_peak * 1.1 + 64 * 1024, (short_peak, long_peak)
    assert content(long) == content(short)
    # each copy path is made once (model.to) or the same number of times every step
    for s, lg in zip(short.copies, long.copies):
        assert (s.site, s.trigger, s.direction) == (lg.site, lg.trigger, lg.direction)
        assert (s.calls, s.bytes) == (lg.calls, lg.bytes) or (
            (s.calls * LONG, s.bytes * LONG) == (lg.calls * SHORT, lg.bytes * SHORT))
    # x, y to the device and loss.item() every step; the 4 parameters once (model.to)
    assert long.summary.memcpy_sync.calls == 3 * LONG + 4
    assert len(long.to_json()) < len(short.to_json()) * 1.2
