"""Host waits reported by CUDA itself (`torch.cuda._gpu_trace`), below the dispatcher.

Op-level tracing sees a wait only where an op or a patched Python call is known to wait. A C++
op may call cudaStreamSynchronize on its own; PyTorch then fires the stream (device, event)
synchronization callbacks, which land here, on the program's own stack, so the wait is recorded
at the user's line, named after the op (`stream_synchronize in aten::foo`).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any, Callable

import torch

from ..core.torch_private import gpu_trace
from .optable import OpInfo


def records_waits(info: OpInfo) -> bool:
    """Whether the tracer records the host waits of the op `info` as copies: a copy between
    devices, or an op that reads device data back (item, nonzero, a masked index, ...).
    Any other op that waits (a C++ op nobody listed) is not recorded by the per-op path."""
    return info.reads or info.short in COPY_OPS


#: The ops a real GPU's copies between devices run as.
COPY_OPS = ("_to_copy", "copy_")


class GpuWaits:
    """One thread's side of the handshake between CUDA's sync callbacks (SyncHooks) and the
    real GPU's steps of the per-op path (tracer/cuda.py), which only those two modules use:

    - `recording`: above 0 while the tracer runs a copy or a wait that it records itself
      (cuda.run_recorded): a sync inside it is not reported again;
    - `running_op`: the op (its OpInfo) the per-op path is running, if any: a sync inside
      it is marked, not recorded, here;
    - `sync_at_ns`, `sync_kind`: when CUDA first reported a sync inside that op (0: none)
      and its kind; the per-op path times the wait to the op's return and records it."""

    __slots__ = ("recording", "running_op", "sync_at_ns", "sync_kind")

    def __init__(self) -> None:
        self.recording = 0
        self.running_op: OpInfo | None = None
        self.sync_at_ns = 0
        self.sync_kind = ""


class SyncHooks:
    """CUDA's synchronization callbacks, recorded as host waits in the state of the thread
    that waits (`state_of()`: None for a thread the tracer does not trace).

    A wait inside an op the real GPU's per-op path is running (`GpuWaits.running_op`) is
    timed from the callback to the op's return (`GpuWaits.sync_at_ns`, read by
    tracer/cuda.py's steps): PyTorch fires the callback before it waits, and, in
    `memcpy_and_sync`, before the copy it waits for. Such a wait is recorded by the per-op
    path, as the op's copy when the tracer records the op's waits as copies (`records_waits`),
    else as a wait named after the op. Waits the tracer records anyway are skipped: those
    inside a copy or wait it records itself (`GpuWaits.recording`).

    A wait outside any op (a C++ call below Python that is not an op) is timed by draining
    the stream (device) first, which the program was about to do anyway; an event wait cannot
    be drained from its handle and is counted with no time. Entering registers the callbacks;
    leaving removes them, also on error. PyTorch's trace switch itself cannot be turned off
    again: after a run, each CUDA event, allocation and sync costs one call into an empty
    Python callback list (README, "Limits on a real GPU").
    """

    def __init__(self, state_of: Callable[[], Any], drain_stream: Any = None,
                 drain_device: Any = None) -> None:
        self.state_of = state_of
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
        if self._busy:
            return
        state = self.state_of()
        if state is None or state.suspended:
            return
        waits = state.gpu
        if waits.recording:
            return
        if waits.running_op is not None:  # timed and recorded when the op returns
            if not waits.sync_at_ns:
                waits.sync_at_ns, waits.sync_kind = perf_counter_ns(), kind
            return
        self._busy = True  # the drain syncs too, and fires these callbacks again
        try:
            with state.suspend():
                t0 = perf_counter_ns()
                if drain is not None:
                    drain()
                ns = perf_counter_ns() - t0 if drain is not None else 0
        finally:
            self._busy = False
        state.host_wait(kind, ns)

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


def stream_of(handle: int, cuda: Any = None) -> Any:
    """The stream a callback's handle names. 0 is the default (legacy) stream of the current
    device; `ExternalStream(0)` is not that stream but a fresh one from the pool (Stream.cpp,
    THCPStream_pynew), so waiting on it would wait for nothing."""
    cuda = cuda if cuda is not None else torch.cuda
    return cuda.default_stream() if handle == 0 else cuda.ExternalStream(handle)


def _drain_stream(stream: int) -> None:
    # The C base class's synchronize: the tracer's patched Stream.synchronize would record it.
    torch._C._CudaStreamBase.synchronize(stream_of(stream))


def _drain_device() -> None:
    torch._C._cuda_synchronize()
