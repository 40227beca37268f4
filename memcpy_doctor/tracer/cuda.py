"""The real GPU: its steps of the per-op path, device time per op and per copy from CUDA
events, host waits measured.

`gpu_op` runs an op on a real GPU inside the per-op path's guard (tracer/perop.py): a copy
between devices is recorded as a copy (`real_copy`), any other op is timed by CUDA events
when it has device work and recorded by the shared last steps.

Events are taken from a pool and resolved without blocking the program: pending pairs are
read back once they have completed (checked every few hundred ops and at every host wait),
and all of them at the end, so the program's own synchronization is never changed.
Host waits are caught twice: the Python calls that wait are wrapped (`wait_patches`), and
CUDA's own synchronization callbacks (`SyncHooks`) catch the waits inside C++ ops.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns
from typing import Any, Callable

import torch

from ..core.torch_private import gpu_trace
from .optable import OP_INFO, OpInfo, op_info
from .state import (UNRESOLVED, TraceState, names_cuda, tensor_args, tensors_out,
                    with_kwarg_tensors)

Tensor = torch.Tensor

#: Pending event pairs checked for completion every this many ops.
_POLL_EVERY = 256


class CudaTimer:
    """CUDA event pairs around device work, resolved into the aggregates later."""

    def __init__(self) -> None:
        self._pool: list[Any] = []
        self._pending: list[tuple[Any, Any, Any, int]] = []
        self._since_poll = 0

    def _event(self) -> Any:
        return self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)

    def begin(self) -> Any:
        start = self._event()
        start.record()
        return start

    def cancel(self, start: Any) -> None:
        self._pool.append(start)

    def end(self, start: Any, target: Any, host_ns: int) -> None:
        """`target.add_device(ns, host_ns)` is called once the device has run the work."""
        stop = self._event()
        stop.record()
        self._pending.append((start, stop, target, host_ns))
        self._since_poll += 1
        if self._since_poll >= _POLL_EVERY:
            self.poll()

    def poll(self) -> None:
        """Resolve the pairs that have completed, in order; stop at the first that has not."""
        self._since_poll = 0
        done = 0
        for start, stop, target, host_ns in self._pending:
            if not stop.query():
                break
            target.add_device(int(start.elapsed_time(stop) * 1e6), host_ns)
            self._pool.append(start)
            self._pool.append(stop)
            done += 1
        del self._pending[:done]

    def finish(self) -> None:
        torch.cuda.synchronize()
        self.poll()


def wait_patches(state_of: Any) -> list[tuple[Any, str, Any]]:
    """Wrap the real host waits so each is recorded (with its measured time) at its site, in
    the state of the thread that waits (`state_of()`)."""

    def timed(kind: str, original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = state_of()
            if state.suspended:
                return original(*args, **kwargs)
            t0 = perf_counter_ns()
            result = state.run_recorded(original, args, kwargs)
            state.host_wait(kind, perf_counter_ns() - t0)
            if state.timer is not None:
                state.timer.poll()
            return result
        wrapper.__wrapped__ = original
        return wrapper

    return [
        (torch.cuda, "synchronize", timed("synchronize", torch.cuda.synchronize)),
        (torch.cuda.Stream, "synchronize", timed("stream_synchronize",
                                                 torch.cuda.Stream.synchronize)),
        (torch.cuda.Event, "synchronize", timed("event_synchronize",
                                                torch.cuda.Event.synchronize)),
    ]


def records_waits(info: OpInfo) -> bool:
    """Whether the tracer records the host waits of the op `info` as copies: a copy between
    devices, or an op that reads device data back (item, nonzero, a masked index, ...).
    Any other op that waits (a C++ op nobody listed) is not recorded by the per-op path."""
    return info.reads or info.short in _COPY_OPS


#: The ops a real GPU's copies between devices run as.
_COPY_OPS = ("_to_copy", "copy_")


def gpu_op(state: TraceState, record: Callable[..., None]) -> Callable[..., Any]:
    """The real GPU's steps of the per-op path for `state`: `run(func, args, kwargs)` runs one
    aten op and records it with `record` (tracer/perop.py's `recorder`), inside the per-op
    path's guard. An op with device work is timed by CUDA events around it."""
    timer = state.timer

    def run(func: Any, args: tuple, kwargs: dict) -> Any:
        info = OP_INFO.get(id(func)) or op_info(func)
        ins = args if all(isinstance(a, Tensor) for a in args) else tensor_args(args)
        if kwargs:
            ins = with_kwarg_tensors(ins, kwargs)
        dev_in = [t.is_cuda for t in ins]
        any_dev = True in dev_in
        to_cuda = names_cuda(kwargs.get("device"))  # .to("cuda") of a host tensor, a factory
        if info.short in _COPY_OPS and (any_dev or to_cuda):
            copied = real_copy(state, info, func, args, kwargs)
            if copied is not None:
                return copied[0]
        site = state.call_site
        if site is UNRESOLVED:
            site = state.op_site(3)
        mark = timer.begin() if any_dev or (not ins and to_cuda) else None
        prev, state.running_op = state.running_op, info
        t0 = perf_counter_ns()
        try:
            out = info.call(*args, **kwargs)
        finally:
            state.running_op = prev
        host_ns = perf_counter_ns() - t0
        outs = (out,) if isinstance(out, Tensor) else tensors_out(out)
        if any_dev:
            device = f"cuda:{ins[dev_in.index(True)].get_device()}"
        elif outs and outs[0].is_cuda:
            device = f"cuda:{outs[0].get_device()}"
        else:
            device = "cpu"
        agg = record(info, args, kwargs, ins, out, outs, dev_in, any_dev, device, site, host_ns)
        if mark is not None:  # the op's device time, from its events once they are read
            if agg is not None:
                timer.end(mark, agg, host_ns)
            else:
                timer.cancel(mark)  # the op is a copy: its time is the copy's
        return out

    return run


def real_copy(state: TraceState, info: OpInfo, func: Any, args: tuple,
              kwargs: dict) -> tuple[Any] | None:
    """A real GPU's copy between devices (`_to_copy` or `copy_`), run and recorded as a copy
    rather than an op; None if the op copies within one device (then it is an op)."""
    if info.short == "_to_copy":
        src = args[0]
        target = kwargs.get("device")
        if target is None or target == src.device:
            return None
        dst_cuda = target.type == "cuda"
        non_blocking = bool(kwargs.get("non_blocking", False))
    else:
        dst, src = args[0], args[1]
        if dst.device == src.device:
            return None
        dst_cuda = dst.is_cuda
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if src.is_cuda and dst_cuda:
        direction, pinned = "DtoD", None
    elif dst_cuda:
        direction, pinned = "HtoD", src.is_pinned()
    else:
        direction, pinned = "DtoH", non_blocking
    sync = not non_blocking or (direction == "DtoH" and info.short == "copy_"
                                and not args[0].is_pinned())
    site = state.sites.resolve()
    mark = state.timer.begin()
    t0 = perf_counter_ns()
    out = state.run_recorded(func, args, kwargs)
    host_ns = perf_counter_ns() - t0
    dst_t = out if isinstance(out, Tensor) else args[0]
    trigger = state.trigger or ("to" if info.short == "_to_copy" else "copy_")
    pending = state.record_copy(direction, sync, pinned, trigger, dst_t.nbytes, host_ns, 0,
                                site, src, dst_t, src)
    state.timer.end(mark, pending, host_ns)
    state.collector.inherit_producer(dst_t, src)
    return (out,)


class SyncHooks:
    """Host waits reported by CUDA itself (`torch.cuda._gpu_trace`), below the dispatcher.

    Op-level tracing sees a wait only where an op or a patched Python call is known to wait.
    A C++ op may call cudaStreamSynchronize on its own; PyTorch then fires the stream (device,
    event) synchronization callbacks, which land here, on the program's own stack, so the
    wait is recorded at the user's line, named after the op (`stream_synchronize in
    aten::foo`). Waits the tracer records anyway are skipped: those inside a copy or wait
    it records itself (`TraceState.recording`) and those of an op it records as a copy
    (`TraceState.running_op`, `records_waits`).

    Stream and device waits are timed by draining that stream (device) first, which the
    program was about to do anyway; an event wait cannot be drained from its handle and is
    counted with no time. Only the tracing thread's waits count (the modes see no other).
    Entering registers the callbacks; leaving removes them, also on error. PyTorch's trace
    switch itself cannot be turned off again: after a run, each CUDA event, allocation and
    sync costs one call into an empty Python callback list.
    """

    def __init__(self, state: Any, drain_stream: Any = None, drain_device: Any = None) -> None:
        self.state = state
        self.thread = threading.get_ident()
        self._drain_stream = drain_stream or _drain_stream
        self._drain_device = drain_device or _drain_device
        self._busy = False
        self._registered: list[tuple[Any, Any]] = []

    # ----- the callbacks -----
    def on_stream_sync(self, stream: int) -> None:
        self._wait("stream_synchronize", lambda: self._drain_stream(stream))

    def on_device_sync(self) -> None:
        self._wait("synchronize", self._drain_device)

    def on_event_sync(self, event: int) -> None:
        self._wait("event_synchronize", None)

    def _wait(self, kind: str, drain: Any) -> None:
        state = self.state
        if state.suspended or self._busy or threading.get_ident() != self.thread:
            return
        if state.recording:
            return
        info = state.running_op
        if info is not None and records_waits(info):
            return
        op = info.name if info is not None else None
        self._busy = True  # the drain syncs too, and fires these callbacks again
        state.suspended = True
        try:
            t0 = perf_counter_ns()
            if drain is not None:
                drain()
            ns = perf_counter_ns() - t0 if drain is not None else 0
        finally:
            state.suspended = False
            self._busy = False
        state.host_wait(f"{kind} in {op}" if op else kind, ns)

    # ----- registration -----
    def __enter__(self) -> SyncHooks:
        if gpu_trace is None:
            return self
        for registry, callback in ((gpu_trace.StreamSynchronizationCallbacks,
                                    self.on_stream_sync),
                                   (gpu_trace.DeviceSynchronizationCallbacks,
                                    self.on_device_sync),
                                   (gpu_trace.EventSynchronizationCallbacks,
                                    self.on_event_sync)):
            registry.add_callback(callback)
            self._registered.append((registry, callback))
        if torch.cuda.is_available():
            torch._C._activate_gpu_trace()  # idempotent; without it CUDA calls no callback
        return self

    def __exit__(self, *exc: Any) -> None:
        for registry, callback in reversed(self._registered):
            if callback in registry.callback_list:
                registry.callback_list.remove(callback)
        self._registered.clear()


def _drain_stream(stream: int) -> None:
    # The C base class's synchronize: the tracer's patched Stream.synchronize would record it.
    torch._C._CudaStreamBase.synchronize(torch.cuda.ExternalStream(stream))


def _drain_device() -> None:
    torch._C._cuda_synchronize()
