"""The tracer's per-run state and its per-op path, shared by the real and the simulated GPU.

`TraceState.dispatch` is called for every aten op (forward and backward) by the dispatch mode;
it is the hot path: one op-table lookup, the call site (found once per Python call by the
function mode, or by a walk over cached code objects), one aggregate update, one look-up per
input for the op graph and one weak reference per output for producer tracking.
docs/benchmarks.md has what each costs. Each traced thread has its own TraceState (`sibling`)
over the same records.
"""

from __future__ import annotations

import sys
from time import perf_counter_ns
from typing import Any

import torch

from .._torch_private import ENGINE_RUN_BACKWARD
from ..analysis.costmodel import DeviceProfile, Timeline
from .collector import Collector, TensorRef
from .optable import (DTYPE_CLASS, OP_INFO, SCALAR_TRIGGERS, OpInfo, index_tensors, is_mask,
                      op_info)
from .sim import NO_STORAGE
from .sites import SiteResolver

Tensor = torch.Tensor

_CPU = torch.device("cpu")
_getframe = sys._getframe

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


def _names_cuda(device: Any) -> bool:
    return isinstance(device, torch.device) and device.type == "cuda"


def tensors_out(out: Any) -> list[Tensor]:
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
        self.launch_ns = profile.launch_ns
        self.kernel_min_ns = profile.kernel_min_ns
        self.bandwidth = profile.memory_bandwidth
        self.sim = sim  # SimDevice, or None on a real GPU
        self.timer = timer  # CudaTimer on a real GPU, else None
        self.collector = Collector(log_transfers)
        self.sites = SiteResolver()
        self.timeline = Timeline() if sim is not None else None
        self.suspended = False
        self.trigger: str | None = None  # the Python call now running, if it names copies
        self.forced: bool | None = None  # simulated factory: outputs on cuda (True) / host
        # simulated: the arguments of the torch call now running; an op inside it with no
        # tensor inputs (a factory inside a composite op) is on cuda if they are
        self.call_args: tuple[tuple, dict] | None = None
        #: the user call site of the Python-level call now running, when the function mode
        #: knows every op inside it has that site (see FunctionMode); else UNRESOLVED
        self.call_site: Any = UNRESOLVED
        #: the user call site of the Tensor.backward() call now running, if any: the site of
        #: every op the autograd engine runs for it without Python code in between
        self.backward_site: Any = UNRESOLVED
        self.last_exit = perf_counter_ns()
        self.thread: str | None = None  # another thread's name; None: the tracing thread

    def sibling(self, thread: str) -> TraceState:
        """The state of another thread of the same run: the same records, sites and device,
        its own call in progress and its own host clock (torch's modes are per thread, so
        each traced thread has its own modes over its own state)."""
        other = TraceState.__new__(TraceState)
        other.__dict__.update(self.__dict__)  # the shared parts: profile, records, device
        other.thread = thread
        other.timeline = self.timeline.fork() if self.timeline is not None else None
        other.suspended = False
        other.trigger = other.forced = other.call_args = None
        other.call_site = other.backward_site = UNRESOLVED
        other.last_exit = perf_counter_ns()
        return other

    # ----- clocks -----
    def gap(self) -> int:
        """Host time since the tracer last returned to the program (simulated timeline)."""
        now = perf_counter_ns()
        if self.timeline is not None:
            self.timeline.host(max(0, now - self.last_exit))
        return now

    def returned(self) -> None:
        self.last_exit = perf_counter_ns()

    def on_device(self, t: Tensor) -> bool:
        sim = self.sim
        return sim.on_device(t) if sim is not None else t.is_cuda

    # ----- the per-op path -----
    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one aten op and record it. Written flat, with the lookups of the helpers it
        would call inlined: this runs for every op of the program (see docs/benchmarks.md)."""
        now = perf_counter_ns()
        timeline = self.timeline
        if timeline is not None and now > self.last_exit:  # the program's own time since
            timeline.host_ns += now - self.last_exit
        info = OP_INFO.get(id(func)) or op_info(func)
        ins = []
        for a in args:
            if isinstance(a, Tensor):
                ins.append(a)
        if len(ins) < len(args):  # a Tensor[] argument (cat, index), or a scalar
            for a in args:
                if a.__class__ is list or a.__class__ is tuple:
                    ins.extend(b for b in a if isinstance(b, Tensor))
        if kwargs:
            for a in kwargs.values():
                if isinstance(a, Tensor):
                    ins.append(a)
                elif a.__class__ is list or a.__class__ is tuple:
                    ins.extend(b for b in a if isinstance(b, Tensor))
        sim = self.sim
        forced = self.forced
        if sim is not None:
            if kwargs:
                target = kwargs.get("device")
                if target is not None and _names_cuda(target):
                    # A real cuda device reached an aten op (torch.set_default_device("cuda"),
                    # or torch code handed one): build on the host, or copy there, as a GPU
                    # would.
                    if ins and info.short == "_to_copy":
                        return sim.dispatch_transfer(func, args, kwargs)
                    kwargs = {**kwargs, "device": _CPU}
                    forced = True
            marks = sim.cuda_marks.refs
            if marks:
                dev_in = []
                for t in ins:
                    try:
                        dev_in.append(id(t.untyped_storage()) in marks)
                    except NO_STORAGE:
                        dev_in.append(False)  # sparse, nested, storage-less: never marked
                any_dev = True in dev_in
                if any_dev and False in dev_in and not info.mixed_ok and forced is None:
                    sim.check_mixed(ins, dev_in)
            else:
                dev_in, any_dev = (), False
        else:
            dev_in = [t.is_cuda for t in ins]
            any_dev = True in dev_in
            if info.short in ("_to_copy", "copy_") and (any_dev or
                                                        _names_cuda(kwargs.get("device"))):
                # .to("cuda") of a host tensor has no device input: its target says it
                copied = self._real_copy(info, func, args, kwargs)
                if copied is not None:
                    return copied[0]

        site = self.call_site  # set by the function mode for a call into C++
        if site is UNRESOLVED:
            caller = _getframe(1).f_back  # the Python frame below the C++ that ran this op
            if (caller is not None and caller.f_code is ENGINE_RUN_BACKWARD
                    and self.backward_site is not UNRESOLVED):
                site = self.backward_site  # straight from the autograd engine: no user code
            else:  # (a hook or custom Function would be the caller) between the two
                site = self.sites.resolve_from(caller)
            del caller  # a frame holds the program's locals: never keep it past the call

        timer = self.timer
        if timer is not None and (any_dev or (not ins and _names_cuda(kwargs.get("device")))):
            mark = timer.begin()
        else:
            mark = None
        t0 = perf_counter_ns()
        out = info.call(*args, **kwargs)
        host_ns = perf_counter_ns() - t0
        if isinstance(out, Tensor):
            outs = [out]
        else:
            outs = tensors_out(out)

        if sim is not None:
            if forced is not None:
                cuda_out = forced
            elif ins:
                cuda_out = any_dev
            else:
                cuda_out = self.call_args is not None and sim.any_cuda(*self.call_args)
            if cuda_out:
                marks = sim.cuda_marks.refs
                for o in outs:
                    try:
                        storage = o.untyped_storage()
                    except NO_STORAGE:
                        continue  # sparse, nested or storage-less tensors: never marked
                    if id(storage) not in marks:  # a new storage (not a view, not in place)
                        sim.cuda_marks.add(storage)
                device = "cuda:0"
            else:
                device = "cuda:0" if any_dev else "cpu"
        elif any_dev:
            device = f"cuda:{ins[dev_in.index(True)].get_device()}"
        elif outs and outs[0].is_cuda:
            device = f"cuda:{outs[0].get_device()}"
        else:
            device = "cpu"

        col = self.collector
        sync = info.sync
        copy_is_op = sync is not None and not info.kernel and any_dev and dev_in[0]
        if not copy_is_op:
            key = (info.name, device, id(site), self.thread)
            agg = col.ops.get(key)
            if agg is None:
                agg = col.new_op(key, info.name, device, site)
            run_ns = host_ns
            device_ns = flops = nbytes = 0
            kernel = info.kernel
            if kernel and info.flops is not None:
                try:
                    flops = info.flops(args, kwargs, outs)
                except Exception:  # a formula that does not fit these arguments
                    flops = 0
            # the inputs: bytes read, and the op graph's edges from the ops that made them
            producers = col.producers
            flows_in = agg.flows_in
            for t in ins:
                made = producers.get(id(t))
                if made is not None and made() is t:
                    made_by = made.value
                    edge = flows_in.get(id(made_by))
                    if edge is None:
                        edge = flows_in[id(made_by)] = [made_by, 0, 0]
                    read = t.nbytes
                    edge[1] += 1
                    edge[2] += read
                    if kernel:
                        nbytes += read
                elif kernel:
                    nbytes += t.nbytes
            if kernel:
                for o in outs:
                    nbytes += o.nbytes
            if device != "cpu":
                if sim is None:
                    if mark is not None:
                        timer.end(mark, agg, host_ns)
                elif info.kernel:  # simulated kernel: modeled; the host pays the launch only
                    if flops:
                        ref = outs[0] if outs else ins[0]
                        device_ns = self.profile.kernel_ns(
                            flops, nbytes, DTYPE_CLASS.get(ref.dtype, "other"))
                    else:  # DeviceProfile.kernel_ns without FLOPs: bytes over bandwidth
                        device_ns = self.kernel_min_ns + round(nbytes / self.bandwidth * 1e9)
                    # Timeline.enqueue, inlined: the host pays the launch, the device runs
                    # the kernel when it is free
                    host_ns = self.launch_ns
                    timeline.host_ns += host_ns
                    start = timeline.host_ns
                    if timeline.device_ns > start:
                        start = timeline.device_ns
                    timeline.device_ns = start + device_ns
                else:
                    timeline.host_ns += host_ns
            elif timeline is not None:
                timeline.host_ns += host_ns
            agg.calls += 1
            agg.host_ns += host_ns
            agg.device_ns += device_ns
            agg.run_ns += run_ns
            agg.flops += flops
            agg.bytes += nbytes
            total = host_ns + device_ns
            if total < agg.min_ns:
                agg.min_ns = total
            if total > agg.max_ns:
                agg.max_ns = total
            if col.chrome is not None:
                col.chrome_op(agg, host_ns, device_ns)

            if col.pending:  # copies awaiting their first reader: is it this op?
                for t in ins:
                    col.consume(t, agg.ref)
            producer = agg
            if info.pass_through and ins:
                producer = col.producer_agg(ins[0]) or agg
            for o in outs:  # Collector.set_producer, inlined
                made = producers.get(id(o))
                if made is not None and made() is o:
                    made.value = producer
                else:
                    made = producers[id(o)] = TensorRef(o)
                    made.value = producer
            if len(producers) > col.sweep_at:
                col.sweep()
        elif mark is not None:
            timer.cancel(mark)  # the op is a copy: its time is the copy's

        if any_dev:
            if sync is not None and dev_in[0]:
                trigger = sync.trigger
                if info.short == "_local_scalar_dense" and self.trigger in SCALAR_TRIGGERS:
                    trigger = self.trigger
                self.sync_copy("DtoH", trigger, sync.nbytes(args, kwargs, out), ins[0], site,
                               host_ns if copy_is_op else 0)
            elif info.repeat_interleave_tensor and dev_in[0]:
                output_size = args[1] if len(args) > 1 else kwargs.get("output_size")
                if output_size is None:  # the output's size is the sum of repeats, read back
                    self.sync_copy("DtoH", "repeat_interleave", 8, ins[0], site, 0)
            elif info.index:
                self._index_copies(info, args, site)
        self.last_exit = perf_counter_ns()
        return out

    def _index_copies(self, info: OpInfo, args: tuple, site: Any) -> None:
        """Indexing a device tensor: a device mask is counted on the host (DtoH); a host index
        tensor is copied to the device first (HtoD)."""
        on_device = self.on_device
        if not on_device(args[0]):
            return
        for idx in index_tensors(info, args):
            if on_device(idx):
                if is_mask(idx):
                    self.sync_copy("DtoH", "mask", 8, idx, site, 0)
            elif idx.dim() >= 1:
                self.sync_copy("HtoD", "index", idx.nbytes, idx, site, 0)

    # ----- copies and waits -----
    def sync_copy(self, direction: str, trigger: str, nbytes: int, src: Tensor, site: Any,
                  measured_ns: int, dst: Tensor | None = None,
                  pinned: bool | None = False) -> None:
        """A copy the host waits for, made inside an op or a Python call."""
        if self.timeline is not None:
            device_ns = self.profile.copy_ns(direction, nbytes, pinned)
            host_ns = self.timeline.blocking(0, device_ns, self.profile.sync_ns)
        else:
            host_ns, device_ns = measured_ns, 0
        self.collector.copy(
            direction=direction, sync=True, pinned=pinned, trigger=trigger, nbytes=nbytes,
            host_ns=host_ns, device_ns=device_ns, site=site, stack=self.sites.stack_at(site),
            producer=self.collector.producer_of(src), dst=dst,
            shape=list(src.shape), dtype=str(src.dtype).replace("torch.", ""),
            thread=self.thread)

    def host_wait(self, kind: str, measured_ns: int = 0) -> None:
        """A host wait that is not a copy: synchronize, stream or event waits."""
        if self.suspended:
            return
        if self.timeline is not None:
            self.gap()
            measured_ns = self.timeline.drain(self.profile.sync_ns)
        self.collector.wait(kind, self.sites.resolve(), measured_ns, self.thread)
        self.returned()

    def _real_copy(self, info: OpInfo, func: Any, args: tuple,
                   kwargs: dict) -> tuple[Any] | None:
        """A real GPU's copy between devices, recorded as a copy rather than an op."""
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
        site = self.sites.resolve()
        mark = self.timer.begin()
        t0 = perf_counter_ns()
        out = func(*args, **kwargs)
        host_ns = perf_counter_ns() - t0
        dst_t = out if isinstance(out, Tensor) else args[0]
        trigger = self.trigger or ("to" if info.short == "_to_copy" else "copy_")
        producer = self.collector.producer_of(src)
        pending = self.collector.copy(
            direction=direction, sync=sync, pinned=pinned, trigger=trigger,
            nbytes=dst_t.nbytes, host_ns=host_ns, device_ns=0, site=site,
            stack=self.sites.stack_at(site), producer=producer, dst=dst_t,
            shape=list(src.shape), dtype=str(src.dtype).replace("torch.", ""), thread=self.thread)
        self.timer.end(mark, pending, host_ns)
        self.collector.inherit_producer(dst_t, src)
        self.returned()
        return (out,)

