"""The tracer's per-run state, and the steps of the per-op path that are not on its fast path.

A TraceState holds what one run records (the collector), the rules it records by, and what
the program is in the middle of (the Python call now running, its site, the trigger it names).
The per-op path (tracer/perop.py) reads it on every op; the rarer steps live here: finding an
op's call site by a stack walk, the host waits of an op that reads device data, and every
copy's one way into the records (`record_copy`). Each traced thread has its own TraceState
(`sibling`) over the same records.
"""

from __future__ import annotations

import sys
from time import perf_counter_ns
from typing import Any

import torch

from ..core.costmodel import DeviceProfile, Timeline
from ..core.torch_private import ENGINE_RUN_BACKWARD
from .backward import pend
from .collector import Collector, PendingCopy
from .optable import SCALAR_TRIGGERS, OpInfo, index_tensors, is_mask
from .sites import SiteResolver
from .syncpoints import COUNT_BYTES

Tensor = torch.Tensor

_getframe = sys._getframe
#: The kwargs of an op without any, shared by all such ops (neither torch nor the tracer
#: changes a kwargs dict in place; a read-only mapping would cost 0.14 us each time it is
#: unpacked).
_NO_KWARGS: dict = {}

#: TraceState.call_site when the op's call site must be found by walking the stack.
UNRESOLVED = object()


def tensors_in(args: tuple, kwargs: dict) -> list[Tensor]:
    """Tensor arguments, including those inside list arguments (Tensor[] and Tensor?[])."""
    found = []
    for a in args:
        if isinstance(a, Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(b for b in a if isinstance(b, Tensor))
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, Tensor):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                found.extend(b for b in a if isinstance(b, Tensor))
    return found


def tensor_args(args: tuple) -> list[Tensor]:
    """The tensors among an op's positional arguments, including those inside Tensor[] and
    Tensor?[] lists (not int[] lists, such as a view's or a sum's sizes: most lists here)."""
    ins = []
    for a in args:
        if isinstance(a, Tensor):
            ins.append(a)
        elif (a.__class__ is list or a.__class__ is tuple) and a and a[0].__class__ is not int:
            ins += [b for b in a if isinstance(b, Tensor)]
    return ins


def with_kwarg_tensors(ins: tuple | list, kwargs: dict) -> tuple | list:
    """`ins` and the tensors among keyword arguments, if there are any (a new list)."""
    for a in kwargs.values():
        if isinstance(a, Tensor) or a.__class__ is list or a.__class__ is tuple:
            return list(ins) + tensors_in((), kwargs)
    return ins


def names_cuda(device: Any) -> bool:
    """Whether `device` (an op's device argument, or None) is a cuda torch.device."""
    return isinstance(device, torch.device) and device.type == "cuda"


def tensors_out(out: Any) -> list[Tensor]:
    """The tensors an op returned."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, Tensor)]
    return []


class TraceState:
    """Everything one run of the tracer records, and the rules it records by."""

    def __init__(self, profile: DeviceProfile, sim: Any, timer: Any,
                 log_transfers: int = 0) -> None:
        self.profile = profile
        self.sim = sim  # SimDevice, or None on a real GPU
        self.timer = timer  # CudaTimer on a real GPU, else None
        self.collector = Collector(log_transfers)
        self.sites = SiteResolver()
        self.timeline = Timeline() if sim is not None else None
        self.suspended = False
        self.trigger: str | None = None  # the Python call now running, if it names copies
        self.forced: bool | None = None  # simulated factory: outputs on cuda (True) / host
        self.dispatch_mode: Any = None  # this thread's modes.DispatchMode, once entered
        # simulated: the arguments of the torch call now running; an op inside it with no
        # tensor inputs (a factory inside a composite op) is on cuda if they are
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
        self.start_ns = perf_counter_ns()  # the run's start (Tracer.start sets it again)
        self.thread: str | None = None  # another thread's name; None: the tracing thread
        #: real GPU: above 0 while the tracer runs a copy or a wait that it records itself,
        #: and the op now running (its OpInfo): CUDA's sync callbacks read both to tell the
        #: waits the tracer records from those it would miss (tracer/cuda_hooks.py)
        self.recording = 0
        self.running_op: Any = None
        #: real GPU: when CUDA first reported a host wait inside the op now running (0: none)
        #: and its kind, and, while that op is recorded, how long the wait lasted
        self.sync_at_ns = 0
        self.sync_kind = ""
        self.waited_ns = 0
        #: above 0 while a CPU kernel's range checks run that PyTorch skips for device
        #: tensors (`F.one_hot`'s): what they read back is no copy on a GPU
        self.cpu_only_checks = 0
        #: the reads of backward formulas left by this thread's forward ops, until the torch
        #: call that made them returns or a backward pass starts (tracer/backward.py arms
        #: them); each thread's own, as another thread could arm one before its node exists
        self.backward_pending: list = []

    def sibling(self, thread: str) -> TraceState:
        """The state of another thread of the same run: the same records, sites and device,
        its own call in progress and its own host clock (torch's modes are per thread, so
        each traced thread has its own modes over its own state)."""
        other = TraceState.__new__(TraceState)
        other.__dict__.update(self.__dict__)  # the shared parts: profile, records, device
        other.thread = thread
        other.sites = self.sites.fork()
        other.timeline = self.timeline.fork() if self.timeline is not None else None
        other.suspended = False
        other.trigger = other.forced = other.call_args = None
        other.call_site = other.backward_site = UNRESOLVED
        other.call_frame = other.running_op = None
        other.backward_pending = []
        other.recording = other.cpu_only_checks = 0
        other.sync_at_ns = other.waited_ns = 0
        return other

    # ----- clocks -----
    def gap(self) -> None:
        """The program's own time before an event the tracer records itself (a transfer, a
        wait), on the simulated timeline: modeled as before an op (docs/sim-time.md)."""
        if self.timeline is not None:
            self.timeline.host(self.profile.python_op_ns)

    def on_device(self, t: Tensor) -> bool:
        sim = self.sim
        return sim.on_device(t) if sim is not None else t.is_cuda

    # ----- the per-op path's rarer steps (tracer/perop.py) -----
    def op_site(self, depth: int) -> Any:
        """The user call site of an op whose site the function mode did not set: that of the
        call into C++ made from torch's code that the op runs in (found once, by its first
        op; the simulated GPU's per-op path does this step inline), of the backward() call
        the autograd engine runs it for, or found by a walk up from the Python frame below
        the op (`depth` frames above this call).

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

    def after_op(self, info: OpInfo, args: tuple, kwargs: dict, out: Any, site: Any,
                 measured_ns: int) -> None:
        """The rarer step after an op with device inputs (`info.reads`): the copies it makes
        the host wait for inside its own code (`item()`, `nonzero`, ...: its rule in
        tracer/syncpoints.py; on a real GPU `measured_ns` when the op is the copy itself, or
        the wait CUDA reported inside it), an index op's reads, and those its backward
        formula will make (kept until a backward pass: tracer/backward.py)."""
        if self.waited_ns:
            measured_ns = self.waited_ns
        sync = info.sync
        if sync is not None and not self.cpu_only_checks:
            trigger = sync.trigger
            if info.short == "_local_scalar_dense" and self.trigger in SCALAR_TRIGGERS:
                trigger = self.trigger
            on_device = self.on_device
            for direction, tensor, nbytes in sync.reads(args, kwargs, out):
                if on_device(tensor):
                    self.sync_copy(direction, trigger, nbytes, tensor, site, measured_ns)
                    measured_ns = 0
        elif info.index:
            self._index_copies(info, args, kwargs, site, measured_ns)
        if info.backward is not None:
            pend(self, info.backward, args, kwargs, out)

    def _index_copies(self, info: OpInfo, args: tuple, kwargs: dict, site: Any,
                      measured_ns: int) -> None:
        """Indexing a device tensor: a device mask is counted on the host (DtoH); a host index
        tensor is copied to the device first (HtoD), and so is a 0-dim host value assigned
        (`t[idx] = 5.0`). `t[mask] = scalar` copies nothing: PyTorch hands a lone device mask
        with a one-element host value to `masked_fill_`."""
        on_device = self.on_device
        if not on_device(args[0]):
            return
        indices = index_tensors(info, args)
        if info.short != "index":  # an assignment: `t[indices] = value`
            value = args[2] if len(args) > 2 else kwargs.get("values")
            host_scalar = (isinstance(value, Tensor) and value.numel() == 1
                           and not on_device(value))
            accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            if (host_scalar and not accumulate and len(indices) == 1 and is_mask(indices[0])
                    and on_device(indices[0])):
                return  # masked_fill_ with the value read on the host: no copy
            if host_scalar and value.dim() == 0:  # sent over first: value.to(self.device())
                self.sync_copy("HtoD", "index", value.nbytes, value, site, measured_ns)
                measured_ns = 0
        for idx in indices:
            if on_device(idx):
                if is_mask(idx):
                    self.sync_copy("DtoH", "mask", COUNT_BYTES, idx, site, measured_ns)
                    measured_ns = 0
            elif idx.dim() >= 1:
                self.sync_copy("HtoD", "index", idx.nbytes, idx, site, measured_ns)
                measured_ns = 0

    # ----- copies and waits -----
    def record_copy(self, direction: str, sync: bool, pinned: bool | None, trigger: str,
                    nbytes: int, host_ns: int, device_ns: int, site: Any, src: Tensor | None,
                    dst: Tensor | None, described: Tensor) -> PendingCopy:
        """Every copy's one way into the records: from `src` (whose producer it names) to
        `dst` (whose first reader is its consumer; None: none is looked for), its shape and
        dtype those of `described`."""
        col = self.collector
        stack, end_col = self.sites.stack_at(site)
        return col.copy(
            direction=direction, sync=sync, pinned=pinned, trigger=trigger, nbytes=nbytes,
            host_ns=host_ns, device_ns=device_ns, site=site, stack=stack, end_col=end_col,
            producer=col.producer_of(src) if src is not None else None, dst=dst,
            shape=list(described.shape), dtype=str(described.dtype).replace("torch.", ""),
            thread=self.thread,
            at_ns=self.timeline.host_ns if self.timeline is not None else self.clock_ns())

    def clock_ns(self) -> int:
        """The host's clock from the run's start: modeled on the simulated GPU, else wall."""
        if self.timeline is not None:
            return self.timeline.host_ns
        return perf_counter_ns() - self.start_ns

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

    def run_recorded(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`func(*args, **kwargs)`, run as part of a copy or wait that the tracer records
        itself: a CUDA sync inside it is not reported again (see `recording`)."""
        self.recording += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.recording -= 1

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
        self.collector.wait(kind, site, measured_ns, self.thread)
