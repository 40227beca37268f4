"""The real GPU: device time per op and per copy from CUDA events, host waits measured.

Events are taken from a pool and resolved without blocking the program: pending pairs are
read back once they have completed (checked every few hundred ops and at every host wait),
and all of them at the end, so the program's own synchronization is never changed.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

import torch

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


def wait_patches(state: Any) -> list[tuple[Any, str, Any]]:
    """Wrap the real host waits so each is recorded (with its measured time) at its site."""

    def timed(kind: str, original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
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
