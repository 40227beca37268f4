"""`profile --light`: every host sync with its call site, and nothing per op.

The full tracer sees every op through a dispatch mode, which costs a Python call per op and
changes what runs (torch.compile's code, fast paths). Light mode asks PyTorch instead:
`torch.cuda.set_sync_debug_mode("warn")` makes c10's `memcpy_and_sync` and
`stream_synchronize` raise a warning at each sync (c10/cuda/CUDAFunctions.h), and a
warnings filter of ours catches it, takes the user's stack there and counts it per site, with
the kind and direction the call at its frame says (synccall.py). The host waits sync-debug
mode does not flag (`torch.cuda.synchronize`, `Stream.synchronize`, `Event.synchronize`, a
`non_blocking=True` copy between the device and pageable memory) and, on a real GPU, the
syncs users make most (`.to()`, `.cuda()`, `copy_`, `.cpu()`, `.item()`, `.tolist()`,
`bool`, `float`, `int`, `nonzero`) are wrapped in Python and timed (lightwraps.py). No mode,
no per-op hook: an op that does not sync runs exactly as without the tool.

The hook is the filter's message pattern: Python's warning machinery calls the `match` method
of each filter's pattern in turn, and ours (first in the list, action "ignore") counts a sync
warning and keeps its text off the program's stderr. It works whatever `showwarning` the
program installs (logging.captureWarnings, a recorder), and other warnings pass to the
program's own filters unchanged.

When the warning comes: c10's TORCH_WARN does not reach Python at once. The Python binding
that called into C++ runs under a PyWarningHandler (torch/csrc/Exceptions.h,
HANDLE_TH_ERRORS), which buffers warnings and hands them to Python's `warnings` in its
destructor, after the C++ call, the sync included, has returned; a backward pass's are
replayed by the autograd engine on the calling thread when the pass ends. So a sync found by
its warning is counted at the right line but cannot be timed: it is recorded with no time. The
wrapped calls are timed by the wall clock around them.

On the simulated GPU (`--device sim`) the simulated device runs under its full tracer as
always (it needs the modes to exist at all) and hands each copy to `sim_copy`, which records
the sync ones with their direction, trigger and size; the simulated device's sync warnings are
only kept off stderr, and the full tracer's own records are dropped.
"""

from __future__ import annotations

import sys
import threading
import warnings
from contextlib import ExitStack, nullcontext
from time import perf_counter_ns, time_ns
from typing import Any, Callable

import torch

from ..core import __version__
from ..core.costmodel import DeviceProfile, load_profile
from ..core.defaults import (DEFAULT_DEVICE, LIGHT_SYNC_NOTE, SYNC_DEBUG_WARNING,
                             TIMELINE_EVENTS)
from ..core.summary import summarize
from ..core.trace import Meta, Trace
from . import Tracer, _active, check_device, register
from .collector import Collector
from .cuda import device_peaks, measured_peak
from .events import EventRecord
from .lightwraps import LightWrappers
from .patches import Patch
from .sites import SiteResolver
from .synccall import sync_call

_getframe = sys._getframe
_get_ident = threading.get_ident

#: What a light trace says it could not see, or how its figures differ from the full
#: tracer's (meta.untraced, shown under "Not traced" in the report).
LIGHT_NOTES = (
    "light mode: syncs found by PyTorch's sync-debug mode and by wrapping "
    "torch.cuda.synchronize, Stream.synchronize, Event.synchronize and (on a real GPU) "
    "to, cuda, copy_, cpu, item, tolist, bool, float, int and nonzero, each of those with "
    "its kind, size and wall time; no ops recorded (no per-op rows, producers or "
    "consumers); the time figures are the run's wall time and the host's time in the "
    "timed syncs",
    LIGHT_SYNC_NOTE,
    "light mode does not see: the caching allocator's syncs (cudaFree when it releases "
    "cached memory, pinned host allocations), libraries that call CUDA directly (NCCL, "
    "custom extensions), copies with non_blocking=True between the device and pageable "
    "memory called from C++, and syncs while the program has replaced or reset the "
    "warnings filters",
)
SIM_NOTE = ("light mode on the simulated GPU: times are this machine's wall clock around "
            "the wrapped calls, not modeled; each sync copy is the simulated GPU's, with its "
            "direction, trigger and size, not a sync-debug warning's")


def light_problem(device: str) -> str | None:
    """Why `profile --light` cannot run on `device` here (one line), or None. The real GPU
    needs one, and a torch with sync-debug mode; the simulated GPU has its own."""
    if device == "sim":
        return None
    if not torch.cuda.is_available():
        return ("--light: torch sees no CUDA GPU here; --light --device sim runs light mode "
                "on the simulated GPU")
    if not callable(getattr(torch.cuda, "set_sync_debug_mode", None)):
        return (f"--light: torch {torch.__version__} has no sync-debug mode "
                "(torch.cuda.set_sync_debug_mode, PyTorch 1.10 and later)")
    return None


class _SyncWarnings:
    """The pattern of our warnings filter: `match` is called with the text of every warning
    that reaches the filter; a sync warning is counted (unless a wrapped call is running on
    the thread: it counts its own) and matched, so that the filter's "ignore" drops it."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: LightHooks) -> None:
        self.hooks = hooks

    def match(self, text: str) -> bool:
        if not text.startswith(SYNC_DEBUG_WARNING):
            return False
        hooks = self.hooks
        if not hooks.sim and _get_ident() not in hooks.quiet:
            hooks.sync(_getframe(1))
        return True


class LightHooks(LightWrappers):
    """The warnings filter and the wrapped calls, recording into one event record (over its
    Collector) while entered; every filter and patch is undone on exit, also on error.
    Nothing here holds a tensor."""

    def __init__(self, clock_start: int | None = None,
                 keep_events: int = TIMELINE_EVENTS, sim: bool = False) -> None:
        """`sim`: on the simulated GPU, whose tracer hands every copy to `sim_copy`: its sync
        copies are recorded from there, with their direction, trigger and size, and its sync
        warnings only kept off stderr; Tensor.to and Tensor.cuda are not wrapped (wrapping
        them would hide the call from the simulated GPU's mode, which finds it by name)."""
        self.sim = sim
        self.collector = Collector()
        self.events = EventRecord(self.collector, keep_events)
        self.sites = SiteResolver()
        self.quiet: set[int] = set()  # threads inside a wrapped call
        self.start_ns = perf_counter_ns() if clock_start is None else clock_start
        self._stacks: dict[int, list] = {}  # id(site): the stack of its first sync
        self._thread = _get_ident()
        self._filter: tuple | None = None
        self._stack: ExitStack | None = None

    # ----- recording -----
    def _where(self, frame: Any) -> tuple[Any, list, str | None]:
        site = self.sites.resolve_from(frame)
        stack = self._stacks.get(id(site))
        if stack is None:
            stack = self._stacks[id(site)] = self.sites.stack(frame)
        thread = None if _get_ident() == self._thread else threading.current_thread().name
        return site, stack, thread

    def sync(self, frame: Any) -> None:
        """A sync that sync-debug mode reported, made by the code of `frame` or above it:
        its kind and direction as the call at `frame` says (synccall), its size and time
        unknown (0), whether it asked non_blocking unknown (None)."""
        trigger, direction = sync_call(frame)
        site, stack, thread = self._where(frame)
        self.events.copy(direction, True, None, trigger, 0, 0, 0, site, stack, None,
                         None, None, None, None, thread, perf_counter_ns() - self.start_ns)

    def wait(self, kind: str, ns: int, frame: Any) -> None:
        site, _, thread = self._where(frame)
        self.events.wait(kind, site, ns, thread, perf_counter_ns() - self.start_ns)

    def copy(self, src: torch.Tensor, ns: int, frame: Any, direction: str = "DtoH",
             trigger: str = "copy_", non_blocking: bool = True, pinned: bool = False,
             nbytes: int | None = None) -> None:
        """A copy the host waited for, made by a wrapped call from or of `src` (`nbytes`: a
        count it read, where not the tensor's own bytes): by default one with
        non_blocking=True between the device and pageable host memory."""
        site, stack, thread = self._where(frame)
        self.events.copy(direction, True, pinned, trigger,
                         src.nbytes if nbytes is None else nbytes, ns, 0, site, stack,
                         None, src, None, list(src.shape),
                         str(src.dtype).replace("torch.", ""), thread,
                         perf_counter_ns() - self.start_ns, non_blocking=non_blocking)

    def sim_copy(self, note: Any) -> None:
        """A copy listener on the simulated GPU's tracer (a CopyEvent): each sync copy is
        recorded with its direction, trigger and size, untimed (light mode's times are the
        wall clock's, around the wrapped calls), a copy a wrapped call makes excepted (it
        records itself)."""
        if note.sync and _get_ident() not in self.quiet:
            site, stack, thread = self._where(_getframe(1))
            self.events.copy(note.direction, True, note.pinned, note.trigger, note.nbytes, 0,
                             0, site, stack, None, None, None, note.shape, note.dtype, thread,
                             perf_counter_ns() - self.start_ns,
                             non_blocking=note.non_blocking)

    # ----- the wrapped calls (lightwraps.LightWrappers) -----
    def timed_call(self, ident: int, call: Callable, args: tuple,
                   kwargs: dict) -> tuple[Any, int]:
        """`call(*args, **kwargs)` and its wall time, with the thread `ident` quiet while it
        runs (a sync warning inside it belongs to the call, which is recorded as a whole)."""
        self.quiet.add(ident)
        try:
            t0 = perf_counter_ns()
            result = call(*args, **kwargs)
            return result, perf_counter_ns() - t0
        finally:
            self.quiet.discard(ident)

    def patches(self) -> list[tuple[Any, str, Any]]:
        """The calls wrapped, as they are now (the simulated GPU's, under --device sim)."""
        cuda = torch.cuda
        return [(cuda, "synchronize", self.timed("synchronize", cuda.synchronize)),
                (cuda.Stream, "synchronize", self.timed("stream_synchronize",
                                                        cuda.Stream.synchronize)),
                (cuda.Event, "synchronize", self.timed("event_synchronize",
                                                       cuda.Event.synchronize)),
                (torch.Tensor, "copy_", self.copy_wrapper(torch.Tensor.copy_)),
                *([] if self.sim else [
                    (torch.Tensor, "to", self.to_wrapper(torch.Tensor.to, "to")),
                    (torch.Tensor, "cuda", self.to_wrapper(torch.Tensor.cuda, "cuda")),
                    *self.read_patches()])]

    # ----- entering and leaving -----
    @staticmethod
    def owns(entry: tuple) -> bool:
        """Whether `entry` of warnings.filters is a light mode's filter."""
        return isinstance(entry[1], _SyncWarnings)

    def __enter__(self) -> LightHooks:
        stack = ExitStack()
        try:
            self._filter = ("ignore", _SyncWarnings(self), UserWarning, None, 0)
            warnings.filters.insert(0, self._filter)
            filters_changed()
            stack.callback(self._remove_filter)
            stack.enter_context(Patch(self.patches()))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def _remove_filter(self) -> None:
        """Take our filter out of the list the program now uses (its own filters, added or
        changed while it ran, stay as it left them)."""
        for i, f in enumerate(warnings.filters):
            if f is self._filter:
                del warnings.filters[i]
                filters_changed()
                break
        self._filter = None

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


def filters_changed() -> None:
    """Tell `warnings` its filter list changed, so that the decisions it cached per call site
    are made again: `_filters_mutated()` to Python 3.13, `_filters_mutated_lock_held()`
    under its lock from 3.14 (the only one 3.14's module keeps)."""
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:
        mutated()
        return
    with getattr(warnings, "_lock", None) or nullcontext():
        warnings._filters_mutated_lock_held()


class LightTracer:
    """`profile --light`: start, stop and the finished trace, as Tracer has them (the runner
    drives either). One tracer, full or light, can be active per process."""

    def __init__(self, device: str = DEFAULT_DEVICE, profile: str | DeviceProfile | None = None,
                 command: list[str] | None = None) -> None:
        """ValueError (its message one line) when light mode cannot run on `device` here."""
        check_device(device)
        self.requested_device = device
        # "auto" is the real GPU, and without one light_problem says to ask for the simulated
        # GPU: light mode is for a GPU's run, where a full trace would cost too much
        self.device = "sim" if device == "sim" else "cuda"
        problem = light_problem(self.device)
        if problem is not None:
            raise ValueError(problem)
        self.profile = profile if isinstance(profile, DeviceProfile) else load_profile(profile)
        self.command = list(command) if command is not None else list(sys.argv)
        self.trace: Trace | None = None
        self.chrome = None  # no timeline in light mode
        self.hooks: LightHooks | None = None
        self._sim: Tracer | None = None
        self._stack: ExitStack | None = None
        self._abandon_modes = False  # (stop's argument, for the simulated GPU's tracer)
        self._peaks_before: list[int] = []
        self._start_ns = 0
        self._started_at = None  # wall clock (ns since the epoch) at start

    def start(self) -> LightTracer:
        register(self)
        stack = ExitStack()
        stack.callback(_active.clear)
        try:
            if self.device == "sim":
                sim = self._sim = Tracer(device="sim", profile=self.profile,
                                         command=self.command, timeline_events=0)
                sim.registers = False
                sim.start()
                stack.callback(self._stop_sim)
            else:
                self._peaks_before = device_peaks()
            self._started_at = time_ns()
            self._start_ns = perf_counter_ns()
            self.hooks = stack.enter_context(LightHooks(self._start_ns,
                                                        sim=self._sim is not None))
            if self._sim is not None:
                self._sim.add_copy_listener(self.hooks.sim_copy)
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, previous)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def _stop_sim(self) -> None:
        if self._sim is not None and self._sim.trace is None:
            self._sim.stop(abandon_modes=self._abandon_modes)

    def stop(self, *, abandon_modes: bool = False) -> Trace:
        """Stop (sync-debug mode, filter and patches undone; on the simulated GPU its tracer
        stopped) and build the trace. `abandon_modes`: as Tracer.stop's."""
        if self._stack is None:
            if self.trace is None:
                raise RuntimeError("the tracer was never started")
            return self.trace
        end_ns = perf_counter_ns()
        stack, self._stack = self._stack, None
        self._abandon_modes = abandon_modes  # (the simulated GPU's tracer stops in its turn,
        stack.close()  # after light mode's patches over its own are undone)
        self.trace = self._build(end_ns)
        return self.trace

    def add_copy_listener(self, listener: Callable) -> None:
        raise RuntimeError("transfer_guard needs memcpy-doctor's full tracer: profile "
                           "without --light")

    def remove_copy_listener(self, listener: Callable) -> None:
        pass

    def __enter__(self) -> LightTracer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _build(self, end_ns: int) -> Trace:
        col = self.hooks.collector
        col.finish()
        events, copies, waits = col.event_rows(), col.copy_records(), col.wait_records()
        wall = end_ns - self._start_ns
        notes = list(LIGHT_NOTES)
        if self._sim is not None:
            simulated, name = True, self.profile.name
            peak = self._sim.trace.summary.peak_device_memory_bytes
            notes = [n for n in notes if n != LIGHT_SYNC_NOTE] + [SIM_NOTE]
        else:
            simulated, name = False, torch.cuda.get_device_name()
            peak = measured_peak(self._peaks_before, notes)
        meta = Meta(device=self.device, simulated=simulated, device_name=name,
                    device_profile=self.profile.to_dict() if simulated else None,
                    torch_version=torch.__version__, command=self.command,
                    memcpy_doctor_version=__version__, wall_ns=wall, untraced=notes,
                    light=True, started_ns=self._started_at)
        return Trace(meta=meta, summary=summarize(wall, events, copies, peak), events=events,
                     ops=[], copies=copies, waits=waits,
                     timeline=self.hooks.events.timeline([], copies, waits))
