"""The real GPU path where PyTorch's source says it would break (issue 23), on the CPU: the
per-op path driven from a thread with no Python frames, as autograd's device threads run it,
and fakes of the CUDA calls that answer as PyTorch's source does. The same facts on a GPU are
cuda-marked, at the end."""

from __future__ import annotations

import _thread
import collections
import functools
import operator
import sys
import threading

import pytest
import torch
from torch.autograd import Variable
from torch.utils._python_dispatch import _get_current_dispatch_mode

import memcpy_doctor
from memcpy_doctor.core.costmodel import load_profile
from memcpy_doctor.tracer import Tracer
from memcpy_doctor.tracer import cuda as tcuda
from memcpy_doctor.tracer import cuda_hooks
from memcpy_doctor.tracer.cuda_hooks import stream_of
from memcpy_doctor.tracer.cuda_timer import CudaTimer
from memcpy_doctor.tracer.modes import DispatchMode, FunctionMode, real_gpu_handlers
from memcpy_doctor.tracer.context import UNRESOLVED, RunRecords, ThreadContext
from memcpy_doctor.tracer.opreads import after_op
from memcpy_doctor.tracer.optable import op_info


# ----- 1. backward on autograd's device thread -----

def frameless(*calls) -> None:
    """Run `calls` in turn on a new thread that runs no Python frame of its own (C code
    calls each: a deque consuming a map of operator.call), as the autograd engine's device
    threads do; re-raise what one raised."""
    errors: list[BaseException] = []
    done = _thread.allocate_lock()
    done.acquire()
    prior = sys.unraisablehook

    def unraisable(u):  # how an exception leaves a thread started by _thread
        errors.append(u.exc_value)
        done.release()

    sys.unraisablehook = unraisable
    try:
        _thread.start_new_thread(collections.deque,
                                 (map(operator.call, calls + (done.release,)), 0))
        assert done.acquire(timeout=60), "the frameless thread did not finish"
    finally:
        sys.unraisablehook = prior
    if errors:
        raise errors[0]


def engine_on_a_device_thread(t_outputs, *args, **kwargs):
    """torch.autograd's `_engine_run_backward` as the engine runs a GPU's nodes: on a thread
    of its own, under the dispatch modes of the thread that called backward, which waits."""
    mode = _get_current_dispatch_mode()
    frameless(functools.partial(torch._C._push_on_torch_dispatch_stack, mode),
              functools.partial(Variable._execution_engine.run_backward, t_outputs, *args,
                                **kwargs),
              functools.partial(torch._C._pop_torch_dispatch_stack, None))


def real_gpu_state() -> ThreadContext:
    return RunRecords(load_profile(), None, CudaTimer(FakeCuda())).context()


def records(state: ThreadContext, kind: str) -> list:
    """The state's records of `kind` ("op", "copy"), as a finished run has them."""
    state.collector.finish()
    return getattr(state.collector, f"{kind}_records")()


def test_backward_through_the_real_gpu_path_on_a_frameless_thread(monkeypatch):
    monkeypatch.setattr(torch.autograd, "_engine_run_backward", engine_on_a_device_thread)
    state = real_gpu_state()
    w = torch.full((3,), 2.0, requires_grad=True)
    with FunctionMode(state, real_gpu_handlers(state)), DispatchMode(state):
        loss = (w * w).sum()
        line = sys._getframe().f_lineno + 1
        loss.backward()
    assert w.grad.tolist() == [4.0, 4.0, 4.0]
    ops = {(o.op, o.site.line if o.site else None) for o in records(state, 'op')}
    assert ("aten::mul", line - 2) in ops  # forward, at its own line
    backward = {op for op, at in ops if at == line}
    assert "aten::mul" in backward and "aten::ones_like" in backward  # run on the thread
    assert state.backward_site is UNRESOLVED  # reset when backward() returned


def test_a_backward_pass_torch_starts_itself_has_no_site():
    state = real_gpu_state()
    w = torch.full((2,), 3.0, requires_grad=True)
    with DispatchMode(state):
        loss = (w * w).sum()
        mode = _get_current_dispatch_mode()
    frameless(functools.partial(torch._C._push_on_torch_dispatch_stack, mode),
              functools.partial(Variable._execution_engine.run_backward, (loss,),
                                (torch.ones(()),), False, False, (), True, True),
              functools.partial(torch._C._pop_torch_dispatch_stack, None))
    assert w.grad.tolist() == [6.0, 6.0]
    assert any(o.site is None for o in records(state, 'op'))


def test_a_copy_on_the_device_thread_has_the_backward_site():
    # a copy remembered at a site through a deep stack, then made again at that site with
    # no stack at all: the remembered depth must not be looked up
    state = real_gpu_state()
    state.backward_site = site = state.here()
    src = torch.ones(4)
    state.record_copy("DtoH", True, False, "to", 16, 1, 0, site, src, None, src)
    frameless(functools.partial(state.record_copy, "DtoH", True, False, "to", 16, 1, 0, site,
                                src, None, src))
    (copy,) = records(state, 'copy')
    assert (copy.calls, copy.site) == (2, site)


def test_waits_on_a_thread_the_tracer_does_not_trace():
    tracer = Tracer(device="sim")
    main = tracer._state = real_gpu_state()
    tracer._thread = threading.get_ident()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(tracer._waiting_state()))
    worker.start()
    worker.join()
    main.backward_site = None  # the tracing thread is inside backward(): a device thread's
    worker = threading.Thread(target=lambda: seen.append(tracer._waiting_state()))
    worker.start()
    worker.join()
    assert seen == [None, main] and tracer._waiting_state() is main


# ----- 2. the default stream -----

class FakeStreams:
    """torch.cuda's stream calls: ExternalStream(0) is a fresh pool stream (Stream.cpp)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def default_stream(self):
        self.calls.append(("default_stream",))
        return "default"

    def ExternalStream(self, handle):  # noqa: N802 (torch's name)
        self.calls.append(("ExternalStream", handle))
        return f"external {handle}"


def test_stream_zero_is_the_default_stream():
    cuda = FakeStreams()
    assert stream_of(0, cuda) == "default" and stream_of(0x7f00, cuda) == "external 32512"
    assert cuda.calls == [("default_stream",), ("ExternalStream", 0x7f00)]


# ----- 3. the data factories -----

def test_a_factory_to_the_gpu_is_an_htod_sync_copy_at_the_users_line():
    state = real_gpu_state()
    factory = tcuda.factory_handler(state)
    seen = []

    def tensor(data, device=None):  # torch.tensor, as far as the handler can tell
        seen.append(state.suspended)  # its own ops and waits are the copy's
        return torch.tensor(data)

    line = sys._getframe().f_lineno + 1
    out = factory(tensor, ([1.0, 2.0, 3.0],), {"device": "cuda"})
    assert out.tolist() == [1.0, 2.0, 3.0] and seen == [True] and not state.suspended
    (copy,) = records(state, 'copy')
    assert (copy.direction, copy.sync, copy.pinned, copy.trigger, copy.bytes, copy.calls) == (
        "HtoD", True, False, "factory", 12, 1)
    assert (copy.site.file, copy.site.line) == (__file__, line)


def test_a_factory_on_the_host_records_nothing(monkeypatch):
    state = real_gpu_state()
    factory = tcuda.factory_handler(state)
    assert factory(lambda data: torch.tensor(data), ([1, 2],), {}).tolist() == [1, 2]
    assert factory(lambda data, device: torch.tensor(data), ([1, 2],),
                   {"device": "cpu"}).tolist() == [1, 2]
    assert records(state, 'copy') == []
    monkeypatch.setattr(tcuda, "default_device_type", lambda: "cuda")  # set_default_device
    factory(lambda data: torch.tensor(data), ([1, 2],), {})
    assert [(c.direction, c.bytes) for c in records(state, 'copy')] == [("HtoD", 16)]


# ----- 4, 5, 9. the events -----

class FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.device = cuda, None

    def record(self, stream=None) -> None:
        if self.cuda.capture:
            raise AssertionError("an event recorded during a capture is a node of the graph")
        device = self.cuda.current if stream is None else stream[1]
        if self.device is not None and self.device != device:  # CUDAEvent.h
            raise RuntimeError("Event device does not match recording stream's device.")
        self.device = device
        self.cuda.calls.append(("record", device))

    def query(self) -> bool:
        if self.cuda.capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        return True

    def elapsed_time(self, other: FakeEvent) -> float:
        return 0.5  # ms


class FakeCuda:
    """The CUDA calls CudaTimer makes, answered as PyTorch's source does."""

    def __init__(self, devices: int = 1) -> None:
        self.devices, self.current, self.capture = devices, 0, False
        self.calls: list[tuple] = []

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)

    def capturing(self) -> bool:
        return self.capture

    def device_count(self) -> int:
        return self.devices

    def current_stream(self, device: int) -> tuple:
        return ("stream", device)

    def synchronize(self, device: int) -> None:
        self.calls.append(("synchronize", device))


class Target:
    def __init__(self) -> None:
        self.device: list[tuple[int, int]] = []

    def add_device(self, ns: int, host_ns: int) -> None:
        self.device.append((ns, host_ns))


def test_events_on_each_device_of_several():
    cuda = FakeCuda(devices=2)
    timer = CudaTimer(cuda)
    first, second = Target(), Target()
    timer.end(timer.begin(0), first, 10)
    timer.end(timer.begin(1), second, 20)  # with cuda:0 current: recorded on cuda:1
    timer.poll()
    for device in (1, 0, 1):  # pooled events go back to their own device's work
        timer.end(timer.begin(device), Target(), 1)
    timer.finish()
    assert first.device == [(500_000, 10)] and second.device == [(500_000, 20)]
    assert cuda.calls[:4] == [("record", 0), ("record", 0), ("record", 1), ("record", 1)]
    assert cuda.calls[-2:] == [("synchronize", 0), ("synchronize", 1)]


def test_no_event_recorded_or_queried_during_a_graph_capture():
    cuda = FakeCuda()
    timer = CudaTimer(cuda)
    before = Target()
    timer.end(timer.begin(), before, 5)
    cuda.capture = True
    mark = timer.begin()
    timer.end(mark, Target(), 6)
    timer.cancel(mark)
    timer.poll()  # would query the event recorded before the capture
    assert mark is None and before.device == []
    cuda.capture = False
    timer.finish()
    assert before.device == [(500_000, 5)]
    assert [c for c in cuda.calls if c[0] == "record"] == [("record", 0)] * 2


def test_the_peak_of_a_run():
    assert tcuda.run_peak([0, 0], [100, 300]) == 300
    assert tcuda.run_peak([500, 0], [500, 200]) == 200  # cuda:0's old peak is not this run's
    assert tcuda.run_peak([0], [0]) == 0
    assert tcuda.run_peak([500], [500]) is None  # below an older peak: not known


# ----- 7. waits timed to the op's return -----

def test_a_masked_index_copy_gets_the_wait_timed_inside_the_op(monkeypatch):
    state = real_gpu_state()
    # the tensors below stand for device tensors
    monkeypatch.setattr(ThreadContext, "on_device", lambda self, t: True)
    waited = 7_000  # what GpuSteps measured from CUDA's callback to the op's return
    x, mask = torch.arange(4.0), torch.tensor([True, False, True, True])
    after_op(state, op_info(torch.ops.aten.index.Tensor), (x, [mask]), {}, x[mask],
             None, waited)
    (copy,) = records(state, 'copy')
    assert (copy.direction, copy.trigger, copy.sync, copy.host_ns) == ("DtoH", "mask", True,
                                                                       7_000)


# ----- 8. what a copy is -----

@pytest.mark.parametrize("op, src_cuda, dst_cuda, non_blocking, host_pinned, expected", [
    ("_to_copy", False, True, False, False, ("HtoD", False, True)),
    ("_to_copy", False, True, True, False, ("HtoD", False, True)),  # staged: host blocked
    ("_to_copy", False, True, False, True, ("HtoD", True, True)),  # memcpy_and_sync
    ("_to_copy", False, True, True, True, ("HtoD", True, False)),
    ("_to_copy", True, False, False, None, ("DtoH", False, True)),
    ("_to_copy", True, False, True, None, ("DtoH", True, False)),  # output allocated pinned
    ("copy_", True, False, True, False, ("DtoH", False, True)),  # into pageable: waits
    ("copy_", True, False, True, True, ("DtoH", True, False)),
    ("copy_", True, False, False, True, ("DtoH", True, True)),
    ("copy_", True, True, False, None, ("DtoD", None, False)),  # never waits on the host
    ("_to_copy", True, True, True, None, ("DtoD", None, False)),
])
def test_copy_kind(op, src_cuda, dst_cuda, non_blocking, host_pinned, expected):
    assert tcuda.copy_kind(op, src_cuda, dst_cuda, non_blocking, host_pinned) == expected


# ----- on a real GPU -----

needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@pytest.mark.cuda
def test_gpu_backward_has_the_backward_line():
    model = torch.nn.Linear(64, 64).cuda()
    with memcpy_doctor.profiler(device="cuda") as prof:
        loss = model(torch.randn(32, 64, device="cuda")).square().sum()
        line = sys._getframe().f_lineno + 1
        loss.backward()
        torch.cuda.synchronize()
    mm = [o for o in prof.trace.ops if o.op == "aten::mm" and o.site and o.site.line == line]
    assert mm and all(o.device == "cuda:0" and o.device_ns > 0 for o in mm)


@pytest.mark.cuda
def test_gpu_factory_is_one_htod_copy_and_no_wait():
    with memcpy_doctor.profiler(device="cuda") as prof:
        line = sys._getframe().f_lineno + 1
        t = torch.tensor([1.0, 2.0, 3.0, 4.0], device="cuda")
        t.new_tensor([5.0, 6.0])
    copies = sorted((c.direction, c.sync, c.trigger, c.site.line, c.bytes)
                    for c in prof.trace.copies)
    assert copies == [("HtoD", True, "factory", line, 16), ("HtoD", True, "factory", line + 1, 8)]
    assert prof.trace.waits == []


@pytest.mark.cuda
def test_gpu_default_stream_drain_waits_for_its_work():
    from memcpy_doctor.tracer.cuda_hooks import _drain_stream
    torch.cuda._sleep(50_000_000)
    _drain_stream(0)
    assert torch.cuda.default_stream().query()


@pytest.mark.cuda
def test_gpu_graph_capture_keeps_the_trace():
    x = torch.ones(1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with memcpy_doctor.profiler(device="cuda") as prof:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            (x * 2).sum()  # warm-up
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            y = (x * 2).sum()
        graph.replay()
        assert y.item() == 2048.0
    assert [c.trigger for c in prof.trace.copies] == ["item"]


@pytest.mark.cuda
def test_gpu_sync_copies_inside_ops_are_timed_and_views_have_no_events():
    x = torch.randn(1 << 20, device="cuda")
    with memcpy_doctor.profiler(device="cuda") as prof:
        x[x > 0].view(-1)
        torch.cuda.synchronize()
    (mask,) = [c for c in prof.trace.copies if c.trigger == "mask"]
    assert mask.sync and mask.host_ns > 0
    views = [o for o in prof.trace.ops if o.op == "aten::view"]
    assert views and all(o.device_ns == 0 for o in views)


@pytest.mark.cuda
def test_gpu_copy_into_pageable_memory_waits():
    x = torch.randn(1024, device="cuda")
    with memcpy_doctor.profiler(device="cuda") as prof:
        torch.empty(1024).copy_(x, non_blocking=True)
        torch.empty(1024).pin_memory().copy_(x, non_blocking=True)
        torch.cuda.synchronize()
    assert sorted((c.pinned, c.sync) for c in prof.trace.copies) == [(False, True),
                                                                     (True, False)]


@pytest.mark.cuda
def test_gpu_peak_memory_of_the_run():
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()  # the test process's earlier peaks are not this run's
    with memcpy_doctor.profiler(device="cuda") as prof:
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    assert prof.trace.summary.peak_device_memory_bytes >= 64 << 20


@pytest.mark.cuda
@needs_two
def test_gpu_second_device_events_and_dtod():
    a = torch.randn(1 << 20, device="cuda:0")
    with memcpy_doctor.profiler(device="cuda") as prof:
        b = a.to("cuda:1")
        with torch.cuda.device(1):
            (b * 2).sum()
        (a * 2).sum()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
    (copy,) = prof.trace.copies
    assert (copy.direction, copy.sync) == ("DtoD", False)
    assert {o.device for o in prof.trace.ops if o.op == "aten::mul"} == {"cuda:0", "cuda:1"}


# ----- the real GPU's tracer, wired end to end, on host tensors -----

def test_the_real_gpu_tracer_runs_a_training_step_on_host_tensors(monkeypatch):
    # Every CUDA answer the tracer asks for at start and stop, faked; the program's tensors
    # stay on the host, so the per-op path's GPU steps run without a device. Backward runs
    # on a frameless thread as on a GPU, and reports a wait there as CUDA would.
    from memcpy_doctor.core.torch_private import gpu_trace
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(torch._C, "_activate_gpu_trace", lambda: None)
    monkeypatch.setattr(torch.autograd, "_engine_run_backward", engine_on_a_device_thread)
    monkeypatch.setattr(tcuda, "device_peaks", lambda: [0])
    monkeypatch.setattr(cuda_hooks, "_drain_stream", lambda stream: drained.append(stream))
    drained = []
    model = torch.nn.Linear(4, 2)
    hook_line = sys._getframe().f_lineno + 1  # a sync in a hook run on autograd's thread:
    model.register_full_backward_hook(lambda *a: fire(0))  # at the hook's line
    fire = gpu_trace.StreamSynchronizationCallbacks.fire_callbacks
    with memcpy_doctor.profiler(device="cuda") as prof:
        loss = model(torch.ones(3, 4, requires_grad=True)).sum()
        line = sys._getframe().f_lineno + 1
        loss.backward()
    trace = prof.trace
    assert (trace.meta.device, trace.meta.simulated, trace.meta.device_name) == (
        "cuda", False, "Fake GPU")
    assert model.weight.grad.shape == (2, 4)
    lines = {o.site.line for o in trace.ops if o.site and o.site.file == __file__}
    assert {line - 2, line} <= lines  # forward at its line, backward at backward()'s
    assert [(w.kind, w.site.line) for w in trace.waits] == [("stream_synchronize", hook_line)]
    assert drained == [0]
