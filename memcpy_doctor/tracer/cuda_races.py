"""What orders a copy before the host on a real GPU, from CUDA itself (tracer/races.py).

PyTorch's GPU trace (`torch.cuda._gpu_trace`, what its CUDA sanitizer uses) calls back on every
event record, event wait, and stream, event and device synchronization, with CUDA's handles:
a stream's `cudaStream_t` (0 for the default stream, as `Stream.cuda_stream` names it) and an
event's `cudaEvent_t` (`Event.cuda_event`). They include the syncs PyTorch makes inside ops
(`.item()`, a blocking copy, `nonzero`: `memcpy_and_sync` reports its stream), so the race
checker learns of each without a CUDA call of its own per op. A query that finds the work
done orders it too, and CUDA does not report queries: `Stream.query` and `Event.query` are
wrapped. Entering registers the callbacks and wraps the queries; leaving undoes both, also
on error.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.torch_private import gpu_trace
from .patches import Patch


class RaceHooks:
    """CUDA's callbacks and the wrapped queries, feeding one run's RaceChecker."""

    def __init__(self, races: Any) -> None:
        self.races = races
        self._registered: list[tuple[Any, Any]] = []
        self._patch: Patch | None = None

    # ----- the callbacks (CUDA's handles) -----
    def on_event_record(self, event: int, stream: int) -> None:
        self.races.event_recorded(event, stream)

    def on_event_wait(self, event: int, stream: int) -> None:
        self.races.stream_waited(stream, event)

    def on_stream_sync(self, stream: int) -> None:
        self.races.synced_stream(stream)

    def on_device_sync(self) -> None:
        self.races.synced_device()

    def on_event_sync(self, event: int) -> None:
        self.races.event_synced(event)

    # ----- the queries -----
    def query_patches(self) -> list[tuple[Any, str, Any]]:
        races = self.races
        event_query, stream_query = torch.cuda.Event.query, torch.cuda.Stream.query

        def event_done(event: Any) -> bool:
            done = event_query(event)
            if done:
                races.event_synced(event.cuda_event)
            return done

        def stream_done(stream: Any) -> bool:
            done = stream_query(stream)
            if done:
                races.synced_stream(stream.cuda_stream)
            return done

        event_done.__wrapped__, stream_done.__wrapped__ = event_query, stream_query
        return [(torch.cuda.Event, "query", event_done),
                (torch.cuda.Stream, "query", stream_done)]

    # ----- entering and leaving -----
    def __enter__(self) -> RaceHooks:
        try:
            if gpu_trace is not None:
                for registry, callback in (
                        (gpu_trace.EventRecordCallbacks, self.on_event_record),
                        (gpu_trace.EventWaitCallbacks, self.on_event_wait),
                        (gpu_trace.StreamSynchronizationCallbacks, self.on_stream_sync),
                        (gpu_trace.DeviceSynchronizationCallbacks, self.on_device_sync),
                        (gpu_trace.EventSynchronizationCallbacks, self.on_event_sync)):
                    registry.add_callback(callback)
                    self._registered.append((registry, callback))
                if torch.cuda.is_available():
                    torch._C._activate_gpu_trace()  # (idempotent; SyncHooks' too)
            self._patch = Patch(self.query_patches())
            self._patch.__enter__()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._patch is not None:
            patch, self._patch = self._patch, None
            patch.__exit__(None, None, None)
        for registry, callback in reversed(self._registered):
            if callback in registry.callback_list:
                registry.callback_list.remove(callback)
        self._registered.clear()
