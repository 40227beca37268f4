"""Paddle's report figures (`summarize`) on hand-built events and copies."""

from __future__ import annotations

import dataclasses

from helpers import make_copies, make_events, make_trace
from memcpy_doctor.core.summary import summarize
from memcpy_doctor.core.trace import CopyRecord, EventRow, MemcpyFigure, Summary


def copy_record(*, sync: bool, calls: int, host_ns: int, device_ns: int,
                direction: str = "HtoD") -> CopyRecord:
    return CopyRecord(direction=direction, sync=sync, pinned=False, trigger="to", calls=calls,
                      bytes=calls * 1_000, host_ns=host_ns, device_ns=device_ns, site=None,
                      stack=[], producer=None, consumer=None)


def test_summary_of_the_default_trace():
    s = summarize(total_ns=10_000_000, events=make_events(), copies=make_copies())
    assert s == Summary(
        total_ns=10_000_000, computation_ns=5_000_000, overhead_ns=5_000_000,
        memcpy_all=MemcpyFigure(calls=19, time_ns=4_000_000),
        memcpy_async=MemcpyFigure(calls=5, time_ns=1_000_000),
        memcpy_sync=MemcpyFigure(calls=14, time_ns=3_000_000),
        peak_device_memory_bytes=None)


def test_computation_is_the_sum_of_event_cpu_times():
    events = [EventRow("a", 1, 1_000_000, 9_000_000, 0, 0),
              EventRow("b", 2, 2_000_000, 0, 0, 0),
              EventRow("HostWait:synchronize", 3, 3_000_000, 0, 0, 0)]
    s = summarize(total_ns=8_000_000, events=events, copies=[])
    assert s.computation_ns == 6_000_000  # GPU times do not count
    assert s.overhead_ns == 2_000_000


def test_computation_is_capped_at_total_time():
    events = [EventRow("a", 1, 7_000_000, 0, 0, 0), EventRow("b", 1, 5_000_000, 0, 0, 0)]
    s = summarize(total_ns=10_000_000, events=events, copies=[])
    assert s.computation_ns == 10_000_000
    assert s.overhead_ns == 0


def test_computation_equal_to_total():
    s = summarize(total_ns=3_000_000, events=[EventRow("a", 1, 3_000_000, 0, 0, 0)],
                  copies=[])
    assert (s.computation_ns, s.overhead_ns) == (3_000_000, 0)


def test_overhead_is_total_minus_computation():
    for total in (5_000_000, 6_000_000, 10_000_000, 20_000_000):
        s = summarize(total_ns=total, events=make_events(), copies=[])
        assert s.computation_ns + s.overhead_ns == total
        assert s.computation_ns == min(5_000_000, total)


def test_copy_time_is_host_plus_device_time():
    c = copy_record(sync=True, calls=3, host_ns=1_200_000, device_ns=300_000)
    assert c.time_ns == 1_500_000
    s = summarize(total_ns=10_000_000, events=[], copies=[c])
    assert s.memcpy_sync == MemcpyFigure(3, 1_500_000)
    assert s.memcpy_all == MemcpyFigure(3, 1_500_000)
    assert s.memcpy_async == MemcpyFigure(0, 0)


def test_memcpy_all_async_sync_split():
    copies = [copy_record(sync=True, calls=2, host_ns=1_000_000, device_ns=1_000_000),
              copy_record(sync=False, calls=5, host_ns=100_000, device_ns=400_000),
              copy_record(sync=True, calls=1, host_ns=500_000, device_ns=0, direction="DtoH"),
              copy_record(sync=False, calls=10, host_ns=0, device_ns=2_000_000,
                          direction="DtoH")]
    s = summarize(total_ns=20_000_000, events=[], copies=copies)
    assert s.memcpy_sync == MemcpyFigure(calls=3, time_ns=2_500_000)
    assert s.memcpy_async == MemcpyFigure(calls=15, time_ns=2_500_000)
    assert s.memcpy_all == MemcpyFigure(calls=18, time_ns=5_000_000)


def test_memcpy_figures_do_not_depend_on_events():
    """The copy rows come from copy records, not from the GpuMemcpy* event rows."""
    s = summarize(total_ns=10_000_000, events=[], copies=make_copies())
    assert s.memcpy_all == MemcpyFigure(19, 4_000_000)
    assert s.computation_ns == 0
    assert s.overhead_ns == 10_000_000


def test_empty_run():
    s = summarize(total_ns=0, events=[], copies=[])
    assert s == Summary(0, 0, 0, MemcpyFigure(0, 0), MemcpyFigure(0, 0), MemcpyFigure(0, 0))
    assert s.ratio(s.memcpy_all.time_ns) == 0.0


def test_peak_device_memory_passes_through():
    s = summarize(total_ns=1_000_000, events=[], copies=[],
                  peak_device_memory_bytes=2 * 2**30)
    assert s.peak_device_memory_bytes == 2_147_483_648


def test_summarize_does_not_modify_its_inputs():
    events, copies = make_events(), make_copies()
    before = ([dataclasses.replace(e) for e in events], [dataclasses.replace(c) for c in copies])
    summarize(total_ns=10_000_000, events=events, copies=copies)
    assert (events, copies) == before


def test_ratio_is_a_share_of_total_time():
    s = make_trace().summary
    assert s.ratio(2_500_000) == 0.25
    assert s.ratio(s.memcpy_all.time_ns) == 0.4
    assert s.ratio(s.memcpy_async.time_ns) == 0.1
    assert s.ratio(s.memcpy_sync.time_ns) == 0.3
    assert s.ratio(s.computation_ns) + s.ratio(s.overhead_ns) == 1.0
    assert s.ratio(0) == 0.0


def test_ratio_with_zero_total_time_is_zero():
    s = summarize(total_ns=0, events=[], copies=make_copies())
    assert s.memcpy_all == MemcpyFigure(19, 4_000_000)
    assert s.ratio(4_000_000) == 0.0
