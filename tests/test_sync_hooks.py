"""Hooks below the dispatcher (tracer/cuda.py SyncHooks): CUDA's own synchronization callbacks
report waits inside C++ ops at the user's line, skip the waits the tracer records anyway, and
are removed when the tracer stops. The callbacks are driven by hand here (as CUDA would fire
them); the real GPU end to end is cuda-marked."""

from __future__ import annotations

import threading
import types

import pytest
import torch

import memcpy_doctor
from memcpy_doctor.core.torch_private import gpu_trace
from memcpy_doctor.core.costmodel import load_profile
from memcpy_doctor.tracer import cuda as tcuda
from memcpy_doctor.tracer.cuda import SyncHooks, waiting_op
from memcpy_doctor.tracer.state import TraceState

aten = torch.ops.aten
REGISTRIES = ("StreamSynchronizationCallbacks", "DeviceSynchronizationCallbacks",
              "EventSynchronizationCallbacks")


class FakeState:
    def __init__(self) -> None:
        self.suspended = False
        self.waits: list[tuple[str, int]] = []

    def host_wait(self, kind: str, measured_ns: int = 0) -> None:
        self.waits.append((kind, measured_ns))


def hooks_with(state, drained: list) -> SyncHooks:
    return SyncHooks(state, drain_stream=lambda s: drained.append(("stream", s)),
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
    hooks = SyncHooks(state, drain_stream=lambda s: _spin(2_000_000), drain_device=lambda: None)
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


def test_only_the_tracing_threads_waits():
    state, drained = FakeState(), []
    hooks = hooks_with(state, drained)
    worker = threading.Thread(target=hooks.on_device_sync)
    worker.start()
    worker.join()
    assert state.waits == [] and drained == []


def test_the_drain_firing_the_callback_again_is_one_wait():
    state = FakeState()
    hooks = SyncHooks(state, drain_stream=lambda s: hooks.on_stream_sync(s),
                      drain_device=lambda: hooks.on_device_sync())
    hooks.on_stream_sync(5)
    hooks.on_device_sync()
    assert [kind for kind, _ in state.waits] == ["stream_synchronize", "synchronize"]


# ----- which waits the tracer already records -----

def frame(file: str, name: str, back=None, **local_vars):
    """A stand-in for a Python frame: waiting_op reads only these attributes."""
    code = types.SimpleNamespace(co_filename=file, co_name=name)
    return types.SimpleNamespace(f_code=code, f_back=back, f_locals=local_vars)


def tracer_file(name: str) -> str:
    return f"{tcuda._TRACER_DIR}/{name}"


USER = frame("/work/proj/train.py", "train_step")
FUNCTION_MODE = frame(tracer_file("modes.py"), "__torch_function__", USER)


def dispatch_of(func, back=FUNCTION_MODE):
    mode = frame(tracer_file("modes.py"), "__torch_dispatch__", back)
    return frame(tracer_file("state.py"), "dispatch", mode, self=None, func=func)


@pytest.mark.parametrize("func, recorded, op", [
    (aten.nonzero.default, True, "aten::nonzero"),  # a copy the tracer records (DtoH count)
    (aten._local_scalar_dense.default, True, "aten::_local_scalar_dense"),  # item()
    (aten._to_copy.default, True, "aten::_to_copy"),  # .cpu(), .to("cuda")
    (aten.index.Tensor, True, "aten::index"),  # a mask or a host index tensor
    (aten.mm.default, False, "aten::mm"),  # no copy: a wait inside it is the hook's
])
def test_a_wait_inside_an_op(func, recorded, op):
    torch_internals = frame("/site-packages/torch/_ops.py", "__call__", dispatch_of(func))
    assert waiting_op(torch_internals) == (recorded, op)


@pytest.mark.parametrize("file, name", [
    ("cuda.py", "wrapper"),  # torch.cuda.synchronize(), Stream/Event.synchronize, patched
    ("state.py", "_real_copy"),
    ("state.py", "sync_copy"),
    ("modes.py", "read_back"),  # print(t) on a real GPU
])
def test_a_wait_the_tracer_records_itself(file, name):
    inner = frame("/site-packages/torch/cuda/__init__.py", "synchronize",
                  frame(tracer_file(file), name, dispatch_of(aten.mm.default)))
    assert waiting_op(inner) == (True, None)


def test_a_wait_outside_any_op():
    # torch._C._cuda_synchronize() called by a library: no tracer frame at all
    assert waiting_op(frame("/site-packages/lib.py", "flush", USER)) == (False, None)
    assert waiting_op(FUNCTION_MODE) == (False, None)


def test_the_innermost_tracer_frame_decides():
    # an op without a copy, run inside a recorded copy (a copy's own kernels): recorded
    inner_mm = dispatch_of(aten.mm.default,
                           back=frame(tracer_file("state.py"), "_real_copy", FUNCTION_MODE))
    assert waiting_op(inner_mm) == (False, "aten::mm")
    assert waiting_op(dispatch_of(aten.nonzero.default, back=inner_mm)) == (True,
                                                                          "aten::nonzero")


def test_a_wait_inside_an_unlisted_op_is_named_after_it():
    state, drained = FakeState(), []
    hooks = hooks_with(state, drained)

    def dispatch(self, func, args, kwargs):  # the shape of TraceState.dispatch
        hooks.on_stream_sync(3)

    # Run a function whose code object claims to be state.py's dispatch, as the real one is.
    code = dispatch.__code__.replace(co_filename=tracer_file("state.py"), co_name="dispatch")
    types.FunctionType(code, globals(), None, None, dispatch.__closure__)(
        None, aten.mm.default, (), {})
    assert state.waits[0][0] == "stream_synchronize in aten::mm"


# ----- on a real TraceState: the user's line -----

def test_the_wait_is_recorded_at_the_users_line():
    state = TraceState(load_profile(), None, None)
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
