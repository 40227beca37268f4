"""Device time on a real GPU: CUDA event pairs around an op's or a copy's device work, read
back without ever making the program wait.

Events come from a pool per device and are resolved once they have completed (checked every
few hundred ops and at every host wait), and all of them when the run ends, so the program's
own synchronization is never changed. The CUDA calls the timer makes go through `TorchCuda`,
one seam that the tests answer with fakes that behave as PyTorch's source says.

What the events cannot tell (README, "Limits on a real GPU"): a pair measures from the start
event to the stop event on the stream. On an idle GPU the start event completes as soon as it
is recorded, so the op's device time also holds the host's time to launch it: an upper
bound for short kernels, exact when the GPU is busy.
"""

from __future__ import annotations

from typing import Any

import torch

#: Pending event pairs checked for completion every this many pairs.
POLL_EVERY = 256


class TorchCuda:
    """The CUDA calls CudaTimer makes (PyTorch's, here; a test's fake elsewhere)."""

    @staticmethod
    def new_event() -> Any:
        return torch.cuda.Event(enable_timing=True)

    #: whether the current stream is capturing a CUDA graph (asked per op: torch's C call,
    #: with no Python frame of its own)
    capturing = staticmethod(torch._C._cuda_isCurrentStreamCapturing)

    @staticmethod
    def device_count() -> int:
        return torch.cuda.device_count()

    @staticmethod
    def current_stream(device: int) -> Any:
        return torch.cuda.current_stream(device)

    @staticmethod
    def synchronize(device: int) -> None:
        # torch's C call, not torch.cuda.synchronize, which the tracer patches to record it
        with torch.cuda.device(device):
            torch._C._cuda_synchronize()


class CudaTimer:
    """CUDA event pairs around device work, resolved into the aggregates later.

    `begin(device)` records a start event on the current stream of the device the work runs
    on, `end(...)` the stop event; `target.add_device(ns, host_ns)` is called once the device
    has run the work, and `placed.place(index, start_ns, ns)` places an event the run's ordered
    record (tracer/events.py) keeps on the host's clock: from an event `start(now_ns)`
    recorded on each device when the run began (so the span is off by the time the device was
    still busy with earlier work then). While the current stream captures a CUDA graph nothing is
    recorded or queried: an event recorded then is a node of the graph, and CUDA forbids
    querying events during a capture (the capture would fail, or the query raise, and the
    trace be lost).
    """

    def __init__(self, cuda: Any = None) -> None:
        self.cuda = cuda if cuda is not None else TorchCuda()
        self._capturing = self.cuda.capturing
        #: several GPUs: an event is bound to the device it is first recorded on, and the
        #: work of an op on cuda:1 runs on cuda:1's current stream, whatever the current device
        self.devices = self.cuda.device_count()
        self._pools: dict[int, list[Any]] = {}
        self._pending: list[tuple[Any, Any, Any, int, int, Any]] = []
        self._since_poll = 0
        #: by device: an event recorded when the run began, and the host's clock then
        self._origins: dict[int, tuple[Any, int]] = {}

    def start(self, now_ns: int) -> None:
        """The run begins: an origin event on each device, at `now_ns` on the host's clock
        (nothing while a graph is being captured: spans are then not placed)."""
        if not self.devices or self._capturing():
            return
        for device in range(self.devices):
            self._origins[device] = (self._recorded(device), now_ns)

    def _recorded(self, device: int) -> Any:
        pool = self._pools.get(device)
        event = pool.pop() if pool else self.cuda.new_event()
        if self.devices > 1:
            event.record(self.cuda.current_stream(device))
        else:  # (one device: the current stream is cuda:0's)
            event.record()
        return event

    def begin(self, device: int = 0) -> Any:
        """The start of a pair (None while a graph is being captured)."""
        if self._capturing():
            return None
        return (self._recorded(device), device)

    def cancel(self, start: Any) -> None:
        if start is not None:
            self._pools.setdefault(start[1], []).append(start[0])

    def end(self, start: Any, target: Any, host_ns: int, placed: Any = None,
            index: int | None = None) -> None:
        """The pair's stop, on the device its start was recorded on; with `index`, the work's
        event in the run's ordered record `placed` is placed once the pair is read."""
        if start is None:
            return
        first, device = start
        event = (placed, index) if index is not None else None
        self._pending.append((first, self._recorded(device), target, host_ns, device, event))
        self._since_poll += 1
        if self._since_poll >= POLL_EVERY:
            self.poll()

    def poll(self) -> None:
        """Resolve the pairs that have completed, in order; stop at the first that has not."""
        self._since_poll = 0
        if not self._pending or self._capturing():
            return
        done = 0
        for start, stop, target, host_ns, device, event in self._pending:
            if not stop.query():
                break
            ns = int(start.elapsed_time(stop) * 1e6)
            target.add_device(ns, host_ns)
            origin = self._origins.get(device) if event is not None else None
            if origin is not None:
                placed, index = event
                placed.place(index, origin[1] + int(origin[0].elapsed_time(start) * 1e6), ns)
            pool = self._pools.setdefault(device, [])
            pool.append(start)
            pool.append(stop)
            done += 1
        del self._pending[:done]

    def finish(self) -> None:
        """Wait for every device (the run is over), then resolve every pair."""
        for device in range(self.devices):
            self.cuda.synchronize(device)
        self.poll()
