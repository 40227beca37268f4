"""The tracer: records every op, copy and host wait of the code it runs around.

    tracer = Tracer(device="sim")
    with tracer:
        train()
    trace = tracer.trace

The thread that starts the tracer is traced, and so is every thread started while it runs
(PyTorch's modes are per thread: each such thread runs under its own pair of modes, over a
state that shares the run's records). Threads that were already running are not; nor are
other processes. Every mode and patch is undone on exit, also on error; a thread still running
then keeps its modes, suspended, until it ends.
"""

from __future__ import annotations

import functools
import sys
import threading
from contextlib import ExitStack, contextmanager
from time import perf_counter_ns, time_ns
from typing import Any, Callable, Iterator

import torch

from ..core import __version__
from ..core.costmodel import DeviceProfile, load_profile
from ..core.summary import summarize
from ..core.defaults import (DEFAULT_DEVICE, DEFAULT_TRANSFER_LOG, DEVICE_CHOICES,
                             REGION_CALLS_TRACED, TIMELINE_EVENTS)
from ..core.guardstate import inside_guard
from ..core.compiled import CompileInfo
from ..core.torch_private import compile_hooks
from ..core.trace import Meta, Trace
from .sim import marks as _sim
from .sim import streams as _streams
from .chrome import ChromeLog
from .collector import CopyEvent
from .compiled import CompileWatch
from .context import UNRESOLVED, RunRecords, ThreadContext
from .cuda import device_peaks, measured_peak, wait_patches
from .cuda_hooks import SyncHooks
from .cuda_races import RaceHooks
from .cuda_timer import CudaTimer
from .perop import recorder
from .modes import DispatchMode, FunctionMode, common_handlers, real_gpu_handlers
from .sim.device import SimDevice
from .sim.session import session_sim
from .sim.autocast import cuda_autocast
from .sim.torchlib import serialization, torch_patches
from .patches import Patch, start_under
from .transfers import TransferLog

_active_lock = threading.Lock()
_active: list[Tracer] = []


def active_tracer() -> Tracer | None:
    """The tracer now running in this process, if any."""
    return _active[0] if _active else None


def register(tracer: Any) -> None:
    """Make `tracer` the one active in this process; RuntimeError if one already is."""
    with _active_lock:
        if _active:
            raise RuntimeError("a memcpy-doctor tracer is already running in this process")
        _active.append(tracer)


def check_device(device: str) -> None:
    """ValueError (one line) for a device name that is not one of DEVICE_CHOICES."""
    if device not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {', '.join(DEVICE_CHOICES)}, not {device!r}")


def resolve_device(device: str) -> str:
    """'auto' means the real GPU when torch has one, else the simulated one."""
    check_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "sim"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device here (use --device sim)")
    return device


class Tracer:
    """Start, stop, and the finished trace. One tracer can be active per process."""

    def __init__(self, device: str = DEFAULT_DEVICE, profile: str | DeviceProfile | None = None,
                 command: list[str] | None = None,
                 log_transfers: int = DEFAULT_TRANSFER_LOG,
                 timeline_events: int = TIMELINE_EVENTS, chrome_events: int = 0,
                 compiled_calls_traced: int | None = REGION_CALLS_TRACED) -> None:
        """`log_transfers`: keep the first N copies, in order, in the trace (explain --log);
        `timeline_events`: keep the run's first N events, in order, in the trace's
        `timeline`; `chrome_events`: keep the first N events on a Chrome trace's timeline
        (`chrome` after stop); `compiled_calls_traced`: trace the ops inside a compiled
        graph on its first N calls (per input shapes), after which a graph that made no copy
        in them runs untraced inside (tracer/regions.py); None: on every call."""
        self.log_transfers = log_transfers
        self.compiled_calls_traced = compiled_calls_traced
        self.timeline_events = timeline_events
        self.chrome_events = chrome_events
        self.chrome: ChromeLog | None = None
        self._transfers: TransferLog | None = None
        self.requested_device = device
        self.profile = profile if isinstance(profile, DeviceProfile) else load_profile(profile)
        self.command = list(command) if command is not None else list(sys.argv)
        self.device: str | None = None
        self.trace: Trace | None = None
        self._stack: ExitStack | None = None
        self._state: ThreadContext | None = None  # the tracing thread's context
        self._start_ns = 0
        self._started_at = None  # wall clock (ns since the epoch) at start
        self._sim: SimDevice | None = None
        self._siblings: list[ThreadContext] = []  # the contexts of other traced threads
        #: the running ones, by thread ident (the simulated device reads it too)
        self._thread_states: dict[int, ThreadContext] = {}
        self._thread = threading.get_ident()  # the tracing thread (set again by start)
        self._peaks_before: list[int] = []  # real GPU: the allocator's peaks at the start
        self._compile: CompileWatch | None = None
        self._compiles_asked = [0]  # torch.compile calls while tracing, on a torch that
        # cannot keep compiled code compiled under the tracer
        #: False for the simulated GPU under `profile --light`, whose LightTracer stands for
        #: the run as the active tracer (tracer/light.py)
        self.registers = True

    def start(self) -> Tracer:
        if inside_guard():
            raise RuntimeError("start the memcpy-doctor tracer outside device_guard blocks "
                               "(a guard opened first would not see the simulated device)")
        self._thread = threading.get_ident()
        stack = ExitStack()
        if self.registers:
            register(self)
            stack.callback(_active.clear)
        try:
            session = session_sim()
            if session is not None:  # the pytest plugin's session-wide simulated GPU: this
                # run takes its place until it stops, over the same device tensors
                self.device = session.resolve(self.requested_device)
                stack.enter_context(session.paused())
            else:
                self.device = resolve_device(self.requested_device)
            if self.device == "sim":
                sim = SimDevice(lambda s: RunRecords(self.profile, s, None,
                                                     self.timeline_events).context())
                if session is not None:
                    session.share_marks(sim)
                sim.thread_states = self._thread_states
                self._sim = sim
                state = sim.main_state
                handlers = self._handlers(state)
                _streams._ACTIVE["sim"] = sim
                stack.callback(_streams._ACTIVE.clear)
                stack.callback(_streams.reset_streams)
                autocast = stack.enter_context(cuda_autocast(sim))
                sim_patch = Patch(
                    [(torch.cuda, k, v) for k, v in _sim.cuda_patches(sim, self.profile).items()]
                    + [(torch.accelerator, k, v)
                       for k, v in _sim.accelerator_patches(sim).items()]
                    + [_sim.pin_memory_patch(sim)] + _sim.memory_stats_patches(sim)
                    + torch_patches(sim) + autocast)
                stack.enter_context(sim_patch)
                stack.enter_context(serialization(sim))
            else:
                sim_patch = None
                state = RunRecords(self.profile, None, CudaTimer(),
                                   self.timeline_events).context()
                handlers = self._handlers(state)
                stack.enter_context(Patch(wait_patches(self._state_here)))
                stack.enter_context(SyncHooks(self._waiting_state))  # inside C++ code
                stack.enter_context(RaceHooks(state.run.races))  # what orders a copy
                self._peaks_before = device_peaks()
            self._state = state
            self._subscribe(state.events)
            stack.enter_context(Patch([(threading.Thread, "start",
                                        start_under(self.thread_modes))]))
            stack.callback(state.halt)  # a mode left on the stack does nothing more
            stack.enter_context(FunctionMode(state, handlers))
            stack.enter_context(DispatchMode(state))
            # The first call into a dispatch mode imports torch._dynamo (over a second):
            # pay it here, untraced, not inside the user's first op.
            with state.suspend():
                torch.empty(0)
            self._compile = self._watch_compiles(stack, sim_patch)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        run = state.run
        self._started_at = time_ns()
        self._start_ns = run.start_ns = perf_counter_ns()
        if run.timer is not None:
            run.timer.start(0)  # device spans are placed from here, the host clock's 0
        return self

    def _subscribe(self, events: Any) -> None:
        """The transfer log and the Chrome trace's timeline, where asked for: subscribers
        of the run's event record."""
        if self.log_transfers:
            self._transfers = TransferLog(self.log_transfers)
            events.subscribe(self._transfers)
        if self.chrome_events:
            self.chrome = ChromeLog(self.chrome_events)
            events.subscribe(self.chrome, self.chrome_events)

    def _watch_compiles(self, stack: ExitStack, sim_patch: Patch | None) -> CompileWatch | None:
        """Keep torch.compile's code compiled while tracing (tracer/compiled.py); None on a
        torch that cannot (compiled functions then run eagerly, op by op)."""
        hooks = compile_hooks()
        if hooks is None:  # compiled functions run eagerly: count the compiles
            stack.enter_context(Patch([(torch, "compile", _counted(torch.compile,
                                                                   self._compiles_asked))]))
            return None
        lift = restore = None
        if sim_patch is not None:  # the compile sees the host it runs on
            lift, restore = (lambda: sim_patch.__exit__(None, None, None)), sim_patch.__enter__
        return stack.enter_context(CompileWatch(hooks, self._state_here, recorder, self._sim,
                                                lift, restore, self.compiled_calls_traced))

    def _handlers(self, state: ThreadContext) -> dict[Any, Callable]:
        if self._sim is not None:
            return {**common_handlers(state), **self._sim.handlers}
        return real_gpu_handlers(state)

    @contextmanager
    def thread_modes(self, name: str) -> Iterator[None]:
        """Trace the calling thread (one started while tracing) until the block ends."""
        main = self._state
        if self._stack is None or main is None:  # the tracer stopped before it ran
            yield
            return
        state = main.run.context(name)
        ident = threading.get_ident()
        self._siblings.append(state)
        self._thread_states[ident] = state
        try:
            with FunctionMode(state, self._handlers(state)), DispatchMode(state):
                yield
        finally:
            self._thread_states.pop(ident, None)

    def _state_here(self) -> ThreadContext:
        """The calling thread's context."""
        return self._thread_states.get(threading.get_ident(), self._state)

    def _waiting_state(self) -> ThreadContext | None:
        """The state a host wait that CUDA reports on the calling thread belongs to: the
        thread's own; on a thread the tracer does not trace, that of a traced thread now in a
        backward pass (autograd runs a GPU's backward ops on threads of its own, under the
        modes of the thread that called backward); else None."""
        ident = threading.get_ident()
        state = self._thread_states.get(ident)
        if state is not None or ident == self._thread:
            return state or self._state
        for state in (self._state, *self._siblings):
            if state is not None and state.backward_site is not UNRESOLVED:
                return state
        return None

    def stop(self, *, abandon_modes: bool = False) -> Trace:
        """Stop tracing (modes and patches undone) and build the trace.

        `abandon_modes`: for a process about to end, stopped from a signal handler that may
        have interrupted the tracer's own handling of a call or op. Torch takes a mode off its
        stack while the mode's handler runs, so taking ours off fails there; the trace is
        built all the same (the rest is undone), rather than lost.
        """
        if self._stack is None:
            if self.trace is None:
                raise RuntimeError("the tracer was never started")
            return self.trace
        state = self._state
        end_ns = perf_counter_ns()
        state.gap()  # the program's own work after its last op (simulated GPU: modeled)
        stack, self._stack = self._stack, None
        for sibling in self._siblings:  # threads still running: their ops are not recorded
            sibling.halt()
        try:
            stack.close()
        except RuntimeError:  # "trying to pop from empty mode stack", with every exit run
            if not abandon_modes:
                raise
        if state.timer is not None:
            state.timer.finish()
        state.collector.finish()
        self.trace = self._build(state, end_ns)
        return self.trace

    def add_copy_listener(self, listener: Callable[[CopyEvent], None]) -> None:
        """Call `listener(event)` for every copy from now until it is removed or the tracer
        stops; what it raises reaches the program at the copy's line."""
        if self._state is None or self._stack is None:
            raise RuntimeError("the tracer is not running")
        self._state.events.listeners.append(listener)

    def remove_copy_listener(self, listener: Callable[[CopyEvent], None]) -> None:
        if self._state is not None and listener in self._state.events.listeners:
            self._state.events.listeners.remove(listener)

    def _compile_info(self, copies: list) -> CompileInfo | None:
        """trace.compile: what torch.compile did while tracing; None if it did nothing."""
        if self._compile is None:
            if not self._compiles_asked[0]:
                return None
            return CompileInfo(supported=False, notes=[
                f"torch {torch.__version__} cannot run compiled code under a dispatch mode "
                "(no ignore_compile_internals): compiled functions ran eagerly, op by op"])
        info = self._compile.info()
        if not info.graphs and not info.graph_breaks and not info.recompiles:
            return None
        info.attach_copies(copies)
        if self.device == "sim":
            info.notes.append("compiled regions ran Inductor's CPU code; each region's device "
                              "time is modeled as one memory-bound kernel (its inputs read, its "
                              "outputs written), not from its real kernels")
        else:
            info.notes.append("compiled regions: host time measured; the device time of "
                              "their own kernels is not (torch.profiler's trace has it)")
        return info

    def __enter__(self) -> Tracer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _build(self, state: ThreadContext, end_ns: int) -> Trace:
        col = state.collector
        events = col.event_rows()
        copies = col.copy_records()
        ops, waits = col.op_records(), col.wait_records()
        notes = []
        if state.timeline is not None:
            total = state.timeline.end_ns()
            peak = self._sim.cuda_marks.peak if self._sim else None
        else:
            total = end_ns - self._start_ns
            peak = measured_peak(self._peaks_before, notes)
        simulated = self.device == "sim"
        meta = Meta(
            device=self.device, simulated=simulated,
            device_name=self.profile.name if simulated else torch.cuda.get_device_name(),
            device_profile=self.profile.to_dict() if simulated else None,
            torch_version=torch.__version__, command=self.command,
            memcpy_doctor_version=__version__, wall_ns=end_ns - self._start_ns,
            started_ns=self._started_at)
        meta.untraced += notes
        transfers = self._transfers.records() if self._transfers is not None else []
        if self._transfers is not None and self._transfers.dropped:
            meta.untraced.append(f"transfer log: {self._transfers.dropped} transfers after the "
                                 f"first {len(transfers)} are counted but not logged")
        return Trace(meta=meta, summary=summarize(total, events, copies, peak), events=events,
                     ops=ops, copies=copies, waits=waits, flows=col.flow_records(),
                     transfers=transfers, compile=self._compile_info(copies),
                     timeline=state.events.timeline(ops, copies, waits),
                     races=state.run.races.records())


def _counted(compile_: Callable, count: list[int]) -> Callable:
    """torch.compile, counting its calls in `count[0]`."""

    @functools.wraps(compile_)
    def compile(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return compile_(*args, **kwargs)

    return compile
