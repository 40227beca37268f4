"""The real GPU: device time per op and per copy from CUDA events, host waits measured.

Events are taken from a pool and resolved without blocking the program: pending pairs are
read back once they have completed (checked every few hundred ops and at every host wait),
and all of them at the end, so the program's own synchronization is never changed.
Host waits are caught twice: the Python calls that wait are wrapped (`wait_patches`), and
CUDA's own synchronization callbacks (`SyncHooks`) catch the waits inside C++ ops.
"""

from __future__ import annotations

import os
import sys
import threading
from time import perf_counter_ns
from typing import Any

import torch

from ..core.torch_private import gpu_trace
from .optable import op_info

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
            result = original(*args, **kwargs)
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


#: Tracer functions that record the copy or wait they are in the middle of: a CUDA sync below
#: them is theirs. Keyed by (file, function name), so a refactor inside them needs no change.
_TRACER_DIR = os.path.dirname(os.path.abspath(__file__))
#: (The wait wrappers below, the real copy path and sync copies of state.py, and the print
#: handler of modes.py, which reads a tensor back under torch's own mode-free formatting.)
_RECORDING = {("cuda.py", "wrapper"), ("state.py", "_real_copy"), ("state.py", "sync_copy"),
              ("modes.py", "read_back")}


def waiting_op(frame: Any) -> tuple[bool, str | None]:
    """Whether a CUDA wait seen at `frame` is already recorded by the tracer, and the aten op
    it happens in (if any). The innermost tracer frame on the stack decides: a copy, a wait
    wrapper or a print handler records its own wait; `TraceState.dispatch` does when its op
    is one the tracer records as a copy (item, nonzero, masked index, ...). Any other op that
    waits (a C++ op nobody listed) is not recorded yet: the hook reports it."""
    while frame is not None:
        code = frame.f_code
        where = os.path.dirname(code.co_filename)
        if where == _TRACER_DIR:
            key = (os.path.basename(code.co_filename), code.co_name)
            if key in _RECORDING:
                return True, None
            if key == ("state.py", "dispatch"):
                func = frame.f_locals.get("func")
                if func is None:
                    return False, None
                info = op_info(func)
                recorded = (info.sync is not None or info.index or info.repeat_interleave_tensor
                            or info.short in ("_to_copy", "copy_"))
                return recorded, info.name
        frame = frame.f_back
    return False, None


class SyncHooks:
    """Host waits reported by CUDA itself (`torch.cuda._gpu_trace`), below the dispatcher.

    Op-level tracing sees a wait only where an op or a patched Python call is known to wait.
    A C++ op may call cudaStreamSynchronize on its own; PyTorch then fires the stream (device,
    event) synchronization callbacks, which land here, on the program's own stack, so the
    wait is recorded at the user's line, named after the op (`stream_synchronize in
    aten::foo`). Waits the tracer records anyway are skipped (`waiting_op`).

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
        recorded, op = waiting_op(sys._getframe(2))
        if recorded:
            return
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
