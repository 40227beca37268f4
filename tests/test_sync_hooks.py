"""Hooks below the dispatcher (tracer/cuda_hooks.py SyncHooks): CUDA's own synchronization
callbacks report waits inside C++ ops at the user's line, skip the waits the tracer records
anyway, and are removed when the tracer stops. The callbacks are driven by hand here (as CUDA
would fire them); the real GPU end to end is cuda-marked."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import torch

import memcpy_doctor
from memcpy_doctor.core.torch_private import gpu_trace
from memcpy_doctor.core.costmodel import load_profile
from memcpy_doctor.tracer import cuda as tcuda
from memcpy_doctor.tracer.context import RunRecords
from memcpy_doctor.tracer.cuda_hooks import GpuWaits, SyncHooks, records_waits
from memcpy_doctor.tracer.cuda_timer import CudaTimer
from memcpy_doctor.tracer.optable import op_info
from memcpy_doctor.tracer.perop import dispatcher

aten = torch.ops.aten
REGISTRIES = ("StreamSynchronizationCallbacks", "DeviceSynchronizationCallbacks",
              "EventSynchronizationCallbacks")


class FakeState:
    def __init__(self) -> None:
        self.suspended = 0
        self.gpu = GpuWaits()
        self.waits: list[tuple[str, int]] = []

    @contextmanager
    def suspend(self):
        self.suspended += 1
        try:
            yield
        finally:
            self.suspended -= 1

    def host_wait(self, kind: str, measured_ns: int = 0) -> None:
        self.waits.append((kind, measured_ns))


def real_gpu_state(timer=None):
    """The tracing thread's context of a real GPU's run (here without one)."""
    return RunRecords(load_profile(), None, timer).context()


def hooks_with(state, drained: list) -> SyncHooks:
    return SyncHooks(lambda: state, drain_stream=lambda s: drained.append(("stream", s)),
                     drain_device=lambda: drained.append(("device",)))


def test_stream_device_and_event_waits_are_reported():
    state, drained = FakeState(), []
    hooks = hooks_with(state, drained)
    hooks.on_stream_sync(1234)
    hooks.on_device_sync()
    hooks.on_event_sync(99)
    assert [kind for kind, _ in state.waits] == ["stream_synchronize", "synchronize",
                                                  "event_synchronize"]
    assert drained == [("stream", 1234), ("device",)]  # what was about to be waited on
    assert state.waits[2][1] == 0  # an event cannot be drained from its handle: no time
    assert not state.suspended


def test_waits_are_timed_by_the_drain():
    state = FakeState()
    hooks = SyncHooks(lambda: state, drain_stream=lambda s: _spin(2_000_000),
                      drain_device=lambda: None)
    hooks.on_stream_sync(1)
    assert state.waits[0][1] >= 2_000_000


def _spin(ns: int) -> None:
    from time import perf_counter_ns
    end = perf_counter_ns() + ns
    while perf_counter_ns() < end:
        pass


def test_nothing_while_suspended():
    state, drained = FakeState(), []
    state.suspended = True
    hooks_with(state, drained).on_stream_sync(1)
    assert state.waits == [] and drained == []


def test_a_thread_without_a_state_waits_unrecorded():
    # the tracer's answer for a thread it does not trace (tracer.Tracer._waiting_state)
    state, drained = FakeState(), []
    main = threading.get_ident()
    hooks = SyncHooks(lambda: state if threading.get_ident() == main else None,
                      drain_stream=lambda s: drained.append(s), drain_device=lambda: None)
    worker = threading.Thread(target=hooks.on_stream_sync, args=(1,))
    worker.start()
    worker.join()
    assert state.waits == [] and drained == []
    hooks.on_stream_sync(2)
    assert [kind for kind, _ in state.waits] == ["stream_synchronize"] and drained == [2]


def test_the_drain_firing_the_callback_again_is_one_wait():
    state = FakeState()
    hooks = SyncHooks(lambda: state, drain_stream=lambda s: hooks.on_stream_sync(s),
                      drain_device=lambda: hooks.on_device_sync())
    hooks.on_stream_sync(5)
    hooks.on_device_sync()
    assert [kind for kind, _ in state.waits] == ["stream_synchronize", "synchronize"]


# ----- which waits the tracer already records -----
# The tracer says so itself: GpuWaits.recording while it runs a copy or wait it records,
# GpuWaits.running_op while the real GPU's per-op path runs an op. No frame names.

@pytest.mark.parametrize("func, recorded, op", [
    (aten.nonzero.default, True, "aten::nonzero"),  # a copy the tracer records (DtoH count)
    (aten._local_scalar_dense.default, True, "aten::_local_scalar_dense"),  # item()
    (aten._to_copy.default, True, "aten::_to_copy"),  # .cpu(), .to("cuda")
    (aten.index.Tensor, True, "aten::index"),  # a mask or a host index tensor
    (aten.mm.default, False, "aten::mm"),  # no copy: a wait inside it is the hook's
])
def test_a_wait_inside_an_op(func, recorded, op):
    # marked, not drained: the per-op path times it to the op's return and records it, as
    # the op's copy or as a wait named after the op (test_a_wait_inside_an_unlisted_op...)
    state, drained = FakeState(), []
    state.gpu.running_op = op_info(func)
    hooks = hooks_with(state, drained)
    hooks.on_stream_sync(1)
    first = state.gpu.sync_at_ns
    hooks.on_device_sync()  # a second wait in the same op: timed from the first
    assert records_waits(op_info(func)) is recorded and op_info(func).name == op
    assert state.waits == [] and drained == []
    assert first > 0 and state.gpu.sync_at_ns == first and (
        state.gpu.sync_kind == "stream_synchronize")


def test_a_wait_the_tracer_records_itself():
    # the patched waits, a real GPU's copies and print(t) run their call through
    # cuda.run_recorded: a CUDA sync inside it is theirs
    state = real_gpu_state()
    hooks = hooks_with(state, [])
    assert tcuda.run_recorded(state, lambda x: hooks.on_stream_sync(x) or "done", (4,),
                              {}) == "done"
    assert state.collector.wait_records() == [] and state.gpu.recording == 0
    hooks.on_stream_sync(4)  # and after it, a wait is the hook's again
    assert [w.kind for w in state.collector.wait_records()] == ["stream_synchronize"]


def test_run_recorded_is_undone_on_error():
    state = real_gpu_state()
    with pytest.raises(ZeroDivisionError):
        tcuda.run_recorded(state, lambda: 1 / 0, (), {})
    assert state.gpu.recording == 0


def test_a_patched_wait_is_one_wait(monkeypatch):
    # torch.cuda.synchronize(), patched by the tracer, fires CUDA's callback inside: one wait
    state = real_gpu_state()
    hooks = hooks_with(state, [])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: hooks.on_device_sync())
    (wrapper,) = [w for owner, name, w in tcuda.wait_patches(lambda: state)
                  if owner is torch.cuda and name == "synchronize"]
    wrapper()
    assert [w.kind for w in state.collector.wait_records()] == ["synchronize"]


def test_a_wait_outside_any_op():
    # torch._C._cuda_synchronize() called by a library: no op running, nothing recording
    state, drained = FakeState(), []
    hooks_with(state, drained).on_device_sync()
    assert [kind for kind, _ in state.waits] == ["synchronize"] and drained == [("device",)]


def test_a_wait_inside_a_recorded_copy_is_not_reported_by_an_op_inside_it():
    state, drained = FakeState(), []
    state.gpu.recording = 1
    state.gpu.running_op = op_info(aten.mm.default)
    hooks_with(state, drained).on_stream_sync(1)
    assert state.waits == [] and drained == []


def test_a_wait_inside_an_unlisted_op_is_named_after_it():
    # The real GPU's per-op path (tracer/perop.py, cuda.GpuSteps) runs a custom op whose kernel
    # synchronizes, as a C++ op nobody listed would; run here on host tensors.
    # Its wait is timed from CUDA's callback to the op's return (memcpy_and_sync fires the
    # callback before its copy and its wait): the 2 ms the kernel spins after it, here.
    state = real_gpu_state(CudaTimer())
    hooks = hooks_with(state, [])
    lib = torch.library.Library("mdsynctest", "FRAGMENT")
    lib.define("waits(Tensor x) -> Tensor")
    lib.impl("waits", lambda x: hooks.on_stream_sync(3) or _spin(2_000_000) or x.clone(),
             "CompositeExplicitAutograd")
    dispatch = dispatcher(state)  # (what the dispatch mode calls)
    out = dispatch(None, torch.ops.mdsynctest.waits.default, (), (torch.ones(2),), {})
    assert out.tolist() == [1.0, 1.0] and state.gpu.running_op is None and (
        state.gpu.sync_at_ns == 0)
    (wait,) = state.collector.wait_records()
    assert wait.kind == "stream_synchronize in mdsynctest::waits" and wait.calls == 1
    assert wait.wait_ns >= 2_000_000
    assert (wait.site.file, wait.site.function) == (
        __file__, "test_a_wait_inside_an_unlisted_op_is_named_after_it")


# ----- on a real ThreadContext: the user's line -----

def test_the_wait_is_recorded_at_the_users_line():
    state = real_gpu_state()
    hooks = hooks_with(state, [])
    line = _line_of_next_call()
    hooks.on_stream_sync(8)
    (wait,) = state.collector.wait_records()
    assert wait.kind == "stream_synchronize"
    assert (wait.site.file, wait.site.line) == (__file__, line + 1)
    assert wait.site.function == "test_the_wait_is_recorded_at_the_users_line"


def _line_of_next_call() -> int:
    import sys
    return sys._getframe(1).f_lineno


# ----- registration -----

def registered() -> list:
    return [cb for name in REGISTRIES for cb in getattr(gpu_trace, name).callback_list]


def test_callbacks_are_registered_while_entered_and_fire_as_cuda_fires_them():
    state, drained = FakeState(), []
    before = registered()
    with hooks_with(state, drained) as hooks:
        assert len(registered()) == len(before) + 3
        gpu_trace.StreamSynchronizationCallbacks.fire_callbacks(77)  # what CUDA's C++ calls
        gpu_trace.DeviceSynchronizationCallbacks.fire_callbacks()
        gpu_trace.EventSynchronizationCallbacks.fire_callbacks(5)
    assert registered() == before
    assert hooks._registered == []
    assert [kind for kind, _ in state.waits] == ["stream_synchronize", "synchronize",
                                                  "event_synchronize"]
    assert drained == [("stream", 77), ("device",)]


def test_callbacks_are_removed_on_error():
    before = registered()
    with pytest.raises(ZeroDivisionError):
        with hooks_with(FakeState(), []):
            1 / 0
    assert registered() == before


def test_a_simulated_run_leaves_no_callbacks():
    before = registered()
    with memcpy_doctor.profiler(device="sim"):
        torch.ones(2, device="cuda").sum().item()
    assert registered() == before


# ----- on a real GPU -----

@pytest.mark.cuda
def test_waits_below_the_dispatcher_at_the_users_line(tmp_path):
    """Waits no op and no patched Python call shows: the C++ calls themselves."""
    before = registered()
    with memcpy_doctor.profiler(device="cuda") as prof:
        x = torch.ones(1 << 20, device="cuda") * 2
        torch._C._cuda_synchronize()  # line A
        torch._C._CudaStreamBase.synchronize(torch.cuda.current_stream())  # line B
        x.sum().item()  # a copy, recorded as one: no extra wait
        torch.cuda.synchronize()  # patched: one wait, not two
    import inspect
    src = inspect.getsource(test_waits_below_the_dispatcher_at_the_users_line).splitlines()
    first = inspect.getsourcelines(test_waits_below_the_dispatcher_at_the_users_line)[1]
    line_a = first + next(i for i, s in enumerate(src) if "# line A" in s)
    waits = sorted((w.kind, w.site.line, w.calls) for w in prof.trace.waits)
    assert waits == sorted([("synchronize", line_a, 1),
                            ("stream_synchronize", line_a + 1, 1),
                            ("synchronize", line_a + 3, 1)])
    assert all(w.site.file == __file__ for w in prof.trace.waits)
    assert [c.trigger for c in prof.trace.copies] == ["item"]
    assert registered() == before
