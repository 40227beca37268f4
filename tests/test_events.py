"""The run's one event record (tracer/events.py) and the trace's timeline it keeps: every op,
copy and wait in order, with exact modeled spans on a device of round figures, the storages
each read and wrote, a bound past which an op costs the record nothing, its subscribers (the
transfer log, the Chrome log); and each thread's context (tracer/context.py), built fresh for
every thread, sharing only the run's records."""

from __future__ import annotations

import json

import pytest
import torch

import memcpy_doctor
from memcpy_doctor.core.costmodel import DeviceProfile
from memcpy_doctor.core.site import TraceError
from memcpy_doctor.core.trace import Trace
from memcpy_doctor.tracer import Tracer, events as tevents
from memcpy_doctor.tracer.context import UNRESOLVED, RunRecords, ThreadContext
from memcpy_doctor.tracer.events import StorageNumbers
from memcpy_doctor.tracer.sim.device import SimDevice

from helpers import make_trace


def round_profile() -> DeviceProfile:
    """Round figures: 1 us of Python per op, 2 us per host op, 5 us per launch, 2 us per
    kernel at least, 5 us per sync, copies of 1 us setup at 1 GB/s."""
    return DeviceProfile(
        name="Round GPU", peak_flops={"float32": 1e12, "other": 1e12}, memory_bandwidth=1e15,
        copy_bandwidth={k: 1e9 for k in ("HtoD_pinned", "HtoD_pageable", "DtoH_pinned",
                                         "DtoH_pageable", "DtoD")},
        launch_ns=5_000, kernel_min_ns=2_000, copy_setup_ns=1_000, sync_ns=5_000,
        total_memory_bytes=2**30, python_op_ns=1_000, host_op_ns=2_000, host_flops=1e15,
        host_memory_bandwidth=1e15)


def named(trace: Trace) -> list[tuple]:
    """Each timeline event as (kind, what it is, stream, host span, device span)."""
    out = []
    for e in trace.timeline.events:
        if e.kind == "op":
            what = trace.ops[e.ref].op
        elif e.kind == "copy":
            what = trace.copies[e.ref].trigger
        else:
            what = trace.waits[e.ref].kind
        device = None if e.device_start_ns is None else (e.device_start_ns, e.device_end_ns)
        out.append((e.kind, what, e.stream, (e.host_start_ns, e.host_end_ns), device))
    return out


def test_a_small_program_in_order_with_its_modeled_spans():
    tracer = Tracer(device="sim", profile=round_profile())
    with tracer:
        h = torch.arange(4.0)      # host op: 1 us Python, then 2 us
        d = h.to("cuda")           # sync HtoD: 1 us Python, 5 us launch, 1.016 us copy, 5 us sync
        s = (d * 2).sum()          # two kernels: 1 us Python and 5 us launch each, 2 us each
        torch.cuda.synchronize()   # 1 us Python, then the device drains, 5 us sync
        s.item()                   # 1 us Python, a 4-byte DtoH read (1.004 us), 5 us sync
    trace = tracer.trace
    assert named(trace) == [
        ("op", "aten::arange", None, (1_000, 3_000), None),
        ("copy", "to", 0, (4_000, 15_016), (9_000, 10_016)),
        ("op", "aten::mul", 0, (16_016, 21_016), (21_016, 23_016)),
        ("op", "aten::sum", 0, (22_016, 27_016), (27_016, 29_016)),
        ("wait", "synchronize", None, (28_016, 34_016), None),
        ("copy", "item", 0, (35_016, 41_020), (35_016, 36_020)),
    ]
    # the storages: arange writes 1, the copy reads it and writes 2, which mul reads, ...
    assert [(e.reads, e.writes) for e in trace.timeline.events] == [
        ([], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([], []), ([4], [])]
    assert (trace.timeline.limit, trace.timeline.dropped) == (10_000, 0)
    assert trace.summary.total_ns == 41_020 + 1_000  # the program's own time after its last op


def test_the_bound_keeps_the_first_events_and_counts_the_rest(monkeypatch):
    with memcpy_doctor.profiler(device="sim", timeline_events=3) as prof:
        x = torch.ones(4, device="cuda")
        for _ in range(5):
            x = x + 1
        x.sum().item()
    timeline = prof.trace.timeline
    assert [e.kind for e in timeline.events] == ["op", "op", "op"]
    recorded = (sum(o.calls for o in prof.trace.ops) + sum(c.calls for c in prof.trace.copies)
                + sum(w.calls for w in prof.trace.waits))
    assert (timeline.limit, timeline.dropped) == (3, recorded - 3) and recorded == 8


def test_past_the_bound_an_op_makes_no_event(monkeypatch):
    def refuse(*args):
        raise AssertionError("an op event past the bound")

    monkeypatch.setattr(tevents.EventRecord, "op", refuse)
    monkeypatch.setattr(StorageNumbers, "of", refuse)
    with memcpy_doctor.profiler(device="sim", timeline_events=0) as prof:
        x = torch.ones(4, device="cuda")
        for _ in range(5):
            x = x * 2
        torch.cuda.synchronize()
    assert prof.trace.timeline.events == [] and prof.trace.timeline.dropped == 7


def test_storage_numbers_follow_a_storage_not_its_address():
    numbers = StorageNumbers()
    a = torch.ones(8)
    assert numbers.of([a, a[2:], a.view(2, 4)]) == ((1,), ())  # one storage, named once
    b = a + 1
    assert numbers.of([a], [b]) == ((1,), (2,))  # a new output: a new number
    assert numbers.of([b], [b.view(2, 4)]) == ((2,), (2,))  # a view of its input: the same
    assert numbers.of([b, a], [b]) == ((2, 1), (2,))  # written in place (b.add_(a))
    c = torch.zeros(8)
    assert numbers.of([a], [c], written_in_place=True) == ((1,), (3,))  # c.copy_(a): c is new
    assert numbers.of([a], [c], written_in_place=True) == ((1,), (3,))  # and the same again
    address = torch._C._storage_id(b)
    assert numbers.of([], [_at(address)]) == ((), (4,))  # a new storage at a freed address


class _at:
    """A stand-in for a tensor whose storage is at `address` (a freed one's)."""

    def __init__(self, address: int) -> None:
        self.address = address


@pytest.fixture(autouse=True)
def _addresses_of_stand_ins(monkeypatch):
    real = tevents.storage_id
    monkeypatch.setattr(tevents, "storage_id",
                        lambda t: t.address if isinstance(t, _at) else real(t))


def test_threads_are_named_on_their_events():
    import threading

    with memcpy_doctor.profiler(device="sim") as prof:
        t = threading.Thread(target=lambda: torch.ones(2, device="cuda").sum(), name="w")
        t.start()
        t.join()
    threads = {(trace_op.op, e.thread) for e in prof.trace.timeline.events
               for trace_op in [prof.trace.ops[e.ref]] if e.kind == "op"}
    assert ("aten::sum", "w") in threads


# ----- the timeline in a saved trace -----

def test_the_timeline_round_trips_one_event_to_a_line(tmp_path):
    tracer = Tracer(device="sim", profile=round_profile())
    with tracer:
        torch.ones(3, device="cuda").sum().item()
    trace = tracer.trace
    path = tmp_path / "t.json"
    trace.save(path)
    text = path.read_text()
    assert Trace.load(path) == trace
    lines = [line for line in text.splitlines() if line.startswith('  ["')]
    assert len(lines) == len(trace.timeline.events) == 3
    assert json.loads(lines[0].rstrip(",")) == ["op", 0, None, 0, 1_000, 6_000, 6_000, 8_000,
                                                [], [1]]


def test_the_timeline_as_a_dataframe():
    tracer = Tracer(device="sim", profile=round_profile())
    with tracer:
        torch.ones(3, device="cuda").sum().item()
    frame = tracer.trace.dataframes()["timeline"]
    assert list(frame["name"]) == ["aten::ones", "aten::sum", "DtoH item"]
    assert list(frame["host_start_ns"]) == [e.host_start_ns for e in tracer.trace.timeline.events]
    assert make_trace().dataframes()["timeline"].empty  # (a trace without one)


def test_a_trace_of_schema_1_loads_without_a_timeline():
    data = make_trace().to_dict()
    data["schema_version"] = 1
    assert Trace.from_dict(data).timeline is None


def _set(field: str, value):
    def change(timeline: dict) -> None:
        timeline["events"][0][timeline["fields"].index(field)] = value
    return change


@pytest.mark.parametrize("change, needle", [
    (_set("kind", "kernel"), "kind"),
    (_set("ref", 99), "ref"),
    (_set("host_end_ns", "1"), "host end"),
    (_set("device_end_ns", None), "device span"),
    (_set("reads", ["a"]), "storage"),
    (lambda t: t["events"][0].pop(), "a timeline event"),
    (lambda t: t["fields"].remove("stream"), "timeline.fields"),
])
def test_a_bad_timeline_event_is_a_trace_error(change, needle):
    tracer = Tracer(device="sim", profile=round_profile())
    with tracer:
        torch.ones(3, device="cuda").sum()
    data = json.loads(tracer.trace.to_json())
    change(data["timeline"])
    with pytest.raises(TraceError) as info:
        Trace.from_dict(data)
    assert needle in str(info.value)


def test_a_later_version_may_add_fields_to_an_event():
    tracer = Tracer(device="sim", profile=round_profile())
    with tracer:
        torch.ones(3, device="cuda").sum()
    data = json.loads(tracer.trace.to_json())
    timeline = data["timeline"]
    timeline["fields"].insert(0, "colour")
    for event in timeline["events"]:
        event.insert(0, "blue")
    assert Trace.from_dict(data).timeline == tracer.trace.timeline


# ----- subscribers -----

def test_chrome_flows_follow_the_copys_storages():
    tracer = Tracer(device="sim", chrome_events=100)
    with tracer:
        h = torch.arange(4.0)   # 0: the copy's producer
        torch.ones(2)           # 1: another op between
        d = h.to("cuda")        # 2: the copy
        torch.ones(2)           # 3
        (d * 2).sum()           # 4: its first reader
    names = [e[1] for e in tracer.chrome.events]
    assert names[:5] == ["aten::arange", "aten::ones", "GpuMemcpySync:CPU->GPU", "aten::ones",
                         "aten::mul"]
    assert tracer.chrome.flows == [(0, 2), (2, 4)]


def test_the_transfer_log_is_a_subscriber_with_its_own_bound():
    tracer = Tracer(device="sim", log_transfers=2, timeline_events=0)
    with tracer:
        x = torch.ones(2)
        (x.to("cuda") * 1).sum()  # read by mul
        y = x.to("cuda")  # never read
        for _ in range(2):
            x.to("cuda")  # freed unread
        del y
    log = tracer.trace.transfers
    assert [(t.seq, t.direction, t.trigger) for t in log] == [(0, "HtoD", "to"), (1, "HtoD", "to")]
    assert log[0].consumer.op == "aten::mul" and log[1].consumer is None
    assert any("2 transfers after the first 2" in u for u in tracer.trace.meta.untraced)


# ----- each thread's context -----

def _set_every_own_field(ctx: ThreadContext) -> None:
    ctx.suspended, ctx.trigger, ctx.forced = 3, "item", True
    ctx.call_args, ctx.call_site, ctx.call_frame = ((), {}), "site", object()
    ctx.backward_site, ctx.cpu_only_checks, ctx.region = "b", 2, object()
    ctx.backward_pending.append("pending")
    ctx.sites.calls.append(["frame", "site"])


@pytest.mark.parametrize("device", ["sim", "cuda"])
def test_a_new_threads_context_shares_only_the_runs_records(device):
    profile = round_profile()
    if device == "sim":
        main = SimDevice(lambda s: RunRecords(profile, s, None).context()).main_state
    else:
        main = RunRecords(profile, None, None).context()
    _set_every_own_field(main)
    other = main.run.context("worker")
    fresh = RunRecords(profile, main.sim, None).context("worker")
    own = [name for name in ThreadContext.__slots__ if name not in ThreadContext.SHARED]
    assert set(own) >= {"suspended", "trigger", "call_site", "backward_pending", "sites",
                        "timeline", "region", "gpu"}
    for name in own:
        mine, theirs = getattr(main, name), getattr(other, name)
        if name == "timeline" and mine is None:
            continue  # a real GPU keeps no modeled clock
        assert mine is not theirs or mine is None or isinstance(mine, (int, bool, str)), name
    for name in ("suspended", "trigger", "forced", "call_args", "call_frame",
                 "cpu_only_checks", "backward_pending", "region", "thread"):
        assert getattr(other, name) == getattr(fresh, name), name
    assert other.call_site is UNRESOLVED and other.backward_site is UNRESOLVED
    assert other.sites.calls == [] and other.sites.codes is main.sites.codes  # shared caches
    for name in ThreadContext.SHARED:
        assert getattr(other, name) is getattr(main, name), name
    if device == "sim":
        assert other.timeline.main is main.timeline  # its own host clock, the same device


def test_suspending_nests_and_is_undone_on_error():
    ctx = RunRecords(round_profile(), None, None).context()
    with ctx.suspend():
        with pytest.raises(ZeroDivisionError), ctx.suspend():
            assert ctx.suspended == 2
            1 / 0
        assert ctx.suspended == 1
    assert ctx.suspended == 0
    ctx.halt()
    with ctx.suspend():
        pass
    assert ctx.suspended == 1


# ----- on a real GPU -----

@pytest.mark.cuda
def test_a_real_gpus_kernels_are_placed_on_the_hosts_clock():
    with memcpy_doctor.profiler(device="cuda") as prof:
        a = torch.randn(2048, 2048, device="cuda")
        b = a @ a
        b.sum().item()
    trace = prof.trace
    events = {trace.ops[e.ref].op: e for e in trace.timeline.events if e.kind == "op"}
    mm = events["aten::mm"]
    assert mm.stream == torch.cuda.current_stream().stream_id
    assert mm.device_start_ns is not None and 0 <= mm.device_start_ns < mm.device_end_ns
    # a 2048^3 matmul runs for some microseconds, after the host launched it
    assert mm.device_end_ns - mm.device_start_ns > 1_000
    assert mm.device_end_ns > mm.host_start_ns
    (read,) = [e for e in trace.timeline.events if e.kind == "copy"]
    assert trace.copies[read.ref].trigger == "item" and read.host_end_ns > mm.device_end_ns
