"""What one run records, shared by its threads, and what each thread is in the middle of.

`RunRecords` is the run's: the device (the simulated GPU, or a real GPU's CUDA timer), the
event record every op, copy and wait goes into (tracer/events.py, over the aggregating
collector), the call-site caches and the device's timeline. `ThreadContext` is one thread's:
the Python call now running (its trigger, site, frame, arguments), the backward() call in
progress, how deep the tracer is suspended, the compiled region it is in, its host clock,
and, on a real GPU, its side of CUDA's wait handshake (tracer/cuda_hooks.py). torch's modes
are per thread, so each traced thread runs its own modes over its own context; a context is
always made by `RunRecords.context`, so a new thread starts from the class's defaults and
shares only what the run shares.

The rarer steps of recording live here too: finding a call site by a stack walk, and each
copy's and wait's one way into the event record (`record_copy`, `host_wait`).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from time import perf_counter_ns
from typing import Any, Callable, Iterator

import torch

from ..core.costmodel import DeviceProfile, Timeline
from ..core.torch_private import ENGINE_RUN_BACKWARD
from .collector import Collector, PendingCopy
from .cuda_hooks import GpuWaits
from .events import EventRecord
from .races import RaceChecker
from .sim.streams import current_stream_key
from .sites import SiteResolver

Tensor = torch.Tensor
_getframe = sys._getframe

#: ThreadContext.call_site when the op's call site must be found by walking the stack.
UNRESOLVED = object()


class RunRecords:
    """One run's shared records: `profile`, `sim` (SimDevice, or None on a real GPU),
    `timer` (CudaTimer on a real GPU, else None), `events` (the sink) over `collector`,
    `sites` (the call-site caches every thread's resolver shares), `timeline` (the
    simulated device's queue and the tracing thread's host clock; None on a real GPU) and
    `start_ns`; `stream_id()` names the current device stream of an event's device work."""

    def __init__(self, profile: DeviceProfile, sim: Any, timer: Any,
                 keep_events: int = 0) -> None:
        self.profile = profile
        self.sim = sim
        self.timer = timer
        self.collector = Collector()
        self.events = EventRecord(self.collector, keep_events)
        self.sites = SiteResolver()
        self.timeline = Timeline() if sim is not None else None
        self.start_ns = perf_counter_ns()  # the run's start (Tracer.start sets it again)
        self.stream_id: Callable[[], int | None] = (
            (lambda: 0) if sim is not None else _current_stream_id)
        #: host accesses to a copy still in flight (tracer/races.py), by the streams the
        #: program names: the simulated GPU's, or CUDA's handles
        self.races = RaceChecker(current_stream_key if sim is not None else _cuda_stream)

    def context(self, thread: str | None = None) -> ThreadContext:
        """A new context for the tracing thread (`thread` None) or another one, by name."""
        return ThreadContext(self, thread)


def _cuda_stream() -> int:
    """The current CUDA stream's handle, as CUDA's callbacks name it (0: the default; also
    where torch sees no GPU, as a test's fake of one)."""
    return torch.cuda.current_stream().cuda_stream if torch.cuda.is_available() else 0


def _current_stream_id() -> int | None:
    return torch.cuda.current_stream().stream_id if torch.cuda.is_available() else None


class ThreadContext:
    """One thread's side of a run (see the module's text). The per-op path reads it on
    every op, so what the run shares is also here, by reference: `profile`, `sim`, `timer`,
    `collector` and `events` are the run's own objects (`SHARED`); every other field is
    the thread's."""

    #: The fields that are the run's, shared by reference; the rest are the thread's own.
    SHARED = ("run", "profile", "sim", "timer", "collector", "events")

    __slots__ = SHARED + (
        "thread", "sites", "timeline", "suspended", "trigger", "forced", "call_args",
        "call_site", "call_frame", "backward_site", "cpu_only_checks", "backward_pending",
        "region", "gpu")

    def __init__(self, run: RunRecords, thread: str | None) -> None:
        self.run = run
        self.profile, self.sim, self.timer = run.profile, run.sim, run.timer
        self.collector, self.events = run.collector, run.events
        self.thread = thread  # its name; None: the thread that started the tracer
        self.sites = run.sites.fork()  # the shared caches; its own calls in progress
        #: its host clock: the run's own for the tracing thread, else one of its own over
        #: the same device queue (None on a real GPU)
        self.timeline = (run.timeline if thread is None or run.timeline is None
                         else run.timeline.fork())
        #: above 0 while the tracer does its own work on this thread (see `suspend`)
        self.suspended = 0
        self.trigger: str | None = None  # the Python call now running, if it names copies
        self.forced: bool | None = None  # simulated factory: outputs on cuda (True) / host
        #: simulated: the arguments of the torch call now running; an op inside it with no
        #: tensor inputs (a factory inside a composite op) is on cuda if they are
        self.call_args: tuple[tuple, dict] | None = None
        #: the user call site of the Python-level call now running, when the function mode
        #: knows every op inside it has that site (see FunctionMode); else UNRESOLVED
        self.call_site: Any = UNRESOLVED
        #: when call_site is UNRESOLVED inside such a call made from torch's own code: the
        #: frame that made it, for the call's first op to find the site from (see FunctionMode)
        self.call_frame: Any = None
        #: the user call site of the Tensor.backward() call now running, if any: the site of
        #: every op the autograd engine runs for it without Python code in between
        self.backward_site: Any = UNRESOLVED
        #: above 0 while a CPU kernel's range checks run that PyTorch skips for device
        #: tensors (`F.one_hot`'s): what they read back is no copy on a GPU
        self.cpu_only_checks = 0
        #: the reads of backward formulas left by this thread's forward ops, until the torch
        #: call that made them returns or a backward pass starts (tracer/backward.py arms
        #: them); each thread's own, as another thread could arm one before its node exists
        self.backward_pending: list = []
        #: the compiled region whose graph this thread is running (tracer/regions.py), or
        #: None: the per-op path hands each op to it
        self.region: Any = None
        #: real GPU: this thread's side of CUDA's wait handshake (tracer/cuda_hooks.py)
        self.gpu = GpuWaits() if run.sim is None else None

    # ----- suspending -----
    @contextmanager
    def suspend(self) -> Iterator[None]:
        """Run the block as the tracer's own work: its ops, copies and waits untraced."""
        self.suspended += 1
        try:
            yield
        finally:
            self.suspended -= 1

    def halt(self) -> None:
        """Suspend this thread for good: the run is over, and modes that could not be taken
        off (another thread's, or one a signal interrupted) must do nothing more."""
        self.suspended += 1

    # ----- clocks -----
    def gap(self) -> None:
        """The program's own time before an event the tracer records itself (a transfer, a
        wait), on the simulated timeline: modeled as before an op (docs/sim-time.md)."""
        if self.timeline is not None:
            self.timeline.host(self.profile.python_op_ns)

    def clock_ns(self) -> int:
        """The host's clock from the run's start: modeled on the simulated GPU, else wall."""
        if self.timeline is not None:
            return self.timeline.host_ns
        return perf_counter_ns() - self.run.start_ns

    def on_device(self, t: Tensor) -> bool:
        sim = self.sim
        return sim.on_device(t) if sim is not None else t.is_cuda

    # ----- call sites -----
    def op_site(self, depth: int) -> Any:
        """The user call site of an op whose site the function mode did not set: that of the
        call into C++ made from torch's code that the op runs in (found once, by its first
        op), of the backward() call the autograd engine runs it for, or found by a walk up
        from the Python frame below the op (`depth` frames above this call).

        The engine runs a GPU's backward ops on a thread of its own, where the per-op path's
        frame is the first: there the op has the backward() call's site (None when the
        backward pass was started without one, by torch's own code)."""
        caller = self.call_frame
        if caller is not None:
            site = self.call_site = self.sites.resolve_from(caller)
            return site
        try:
            caller = _getframe(depth)
        except ValueError:  # "call stack is not deep enough": autograd's device thread
            return self.backward_site if self.backward_site is not UNRESOLVED else None
        if caller.f_code is ENGINE_RUN_BACKWARD and self.backward_site is not UNRESOLVED:
            return self.backward_site  # (a hook or custom Function would be a frame between)
        site = self.sites.resolve_from(caller)
        if site is None and self.backward_site is not UNRESOLVED:
            return self.backward_site  # torch's own code on autograd's device thread
        return site

    def here(self) -> Any:
        """The user call site of a copy or wait being recorded now (as `op_site`, for the
        frames above this call)."""
        site = self.sites.resolve_from(_getframe(1))
        if site is None and self.backward_site is not UNRESOLVED:
            return self.backward_site
        return site

    # ----- copies and waits: into the event record -----
    def record_copy(self, direction: str, sync: bool, pinned: bool | None, trigger: str,
                    nbytes: int, host_ns: int, device_ns: int, site: Any, src: Tensor | None,
                    dst: Tensor | None, described: Tensor, into_existing: bool = False,
                    non_blocking: bool = False) -> PendingCopy:
        """Every copy's one way into the records: from `src` (whose producer it names) to
        `dst` (whose first reader is its consumer; None: none is looked for; `into_existing`:
        a tensor that was there before, as `copy_` writes), its shape and dtype those of
        `described`; `non_blocking`: the call asked it (whether or not the host then waited).
        On the simulated GPU the copy has just ended on the device's timeline (its device
        span ends there)."""
        stack, end_col = self.sites.stack_at(site)
        events, timeline = self.events, self.timeline
        # (a sync copy orders nothing while no copy is in flight)
        if direction != "DtoD" and (not sync or self.run.races.inflight):
            self._order(direction, sync, pinned, non_blocking, src, dst, site, nbytes,
                        trigger)
        return events.copy(
            direction, sync, pinned, trigger, nbytes, host_ns, device_ns, site, stack,
            self.collector.producer_of(src) if src is not None else None, src, dst,
            list(described.shape), str(described.dtype).replace("torch.", ""), self.thread,
            self.clock_ns(), end_col,
            device_end=timeline.device_ns if timeline is not None else None,
            stream=self.run.stream_id() if events.room else None, into_existing=into_existing,
            non_blocking=non_blocking)

    def _order(self, direction: str, sync: bool, pinned: bool | None, non_blocking: bool,
               src: Tensor | None, dst: Tensor | None, site: Any, nbytes: int,
               trigger: str) -> None:
        """What a copy between host and device tells the race checker: an async one (from
        or into pinned memory) is in flight on the current stream until ordered; a sync one
        orders the stream, as the host waited for it to drain (not a host->device copy from
        pageable memory with non_blocking: the host waits for the staging alone), and needs
        telling only while a copy is in flight."""
        races = self.run.races
        if not sync:
            host = dst if direction == "DtoH" else src
            if pinned and host is not None:
                races.copy(direction, host, site, nbytes, trigger)
        elif not (non_blocking and direction == "HtoD"):
            races.synced_stream()

    def sync_copy(self, direction: str, trigger: str, nbytes: int, src: Tensor, site: Any,
                  measured_ns: int) -> None:
        """A copy the host waits for, made inside an op or a Python call: modeled on the
        simulated GPU, `measured_ns` on a real one."""
        if self.timeline is not None:
            if self.sim.sync_debug:
                self.sim.synced()
            device_ns = self.profile.copy_ns(direction, nbytes, False)
            host_ns = self.timeline.blocking(0, device_ns, self.profile.sync_ns)
        else:
            host_ns, device_ns = measured_ns, 0
        self.record_copy(direction, True, False, trigger, nbytes, host_ns, device_ns, site,
                         src, None, src)

    def async_copy(self, direction: str, trigger: str, nbytes: int, src: Tensor,
                   site: Any) -> None:
        """A copy from pinned memory with non_blocking made inside an op (a host mask's
        positions sent to the device): the host pays the launch. Not timed on a real GPU
        (the op's time holds it)."""
        host_ns = device_ns = 0
        if self.timeline is not None:
            device_ns = self.profile.copy_ns(direction, nbytes, True)
            host_ns = self.timeline.enqueue(self.profile.launch_ns, device_ns)
        self.record_copy(direction, False, True, trigger, nbytes, host_ns, device_ns, site,
                         src, None, src, non_blocking=True)

    def host_wait(self, kind: str, measured_ns: int = 0, site: Any = UNRESOLVED) -> None:
        """A host wait that is not a copy: synchronize, stream or event waits, at `site`
        (found here when not given)."""
        if self.suspended:
            return
        if self.timeline is not None:
            self.gap()
            measured_ns = self.timeline.drain(self.profile.sync_ns)
        if site is UNRESOLVED:
            site = self.here()
        if kind == "synchronize":  # (a stream's or an event's: their own objects tell)
            self.run.races.synced_device()
        self.events.wait(kind, site, measured_ns, self.thread, self.clock_ns())
