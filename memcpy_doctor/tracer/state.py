"""The tracer's per-run state and its per-op path, shared by the real and the simulated GPU.

`TraceState.dispatcher()` makes what the dispatch mode calls for every aten op (forward and
backward); it is the hot path: one op-table lookup, the call site (found once per Python call by the
function mode, or by a walk over cached code objects), one aggregate update, one look-up per
input for the op graph and one weak reference per output for producer tracking.
docs/benchmarks.md has what each costs. Each traced thread has its own TraceState (`sibling`)
over the same records.
"""

from __future__ import annotations

import sys
from time import perf_counter_ns
from typing import Any, Callable

import torch

from ..core.torch_private import ENGINE_RUN_BACKWARD, set_eval_frame
from ..core.costmodel import DeviceProfile, Timeline
from .collector import Collector, OpAgg
from .optable import (DTYPE_CLASS, OP_INFO, SCALAR_TRIGGERS, OpInfo, index_tensors, is_mask,
                      op_info)
from .sim.marks import NO_STORAGE
from .sites import SiteResolver

Tensor = torch.Tensor

_CPU = torch.device("cpu")
_getframe = sys._getframe
_DisableTorchFunction = torch._C.DisableTorchFunction
#: Whether a torch function mode is on the stack or an argument is a tensor subclass with its
#: own __torch_function__ (see TraceState.dispatcher).
_has_torch_function = torch._C._has_torch_function
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


def _with_kwarg_tensors(ins: tuple | list, kwargs: dict) -> tuple | list:
    """`ins` and the tensors among keyword arguments, if there are any (a new list)."""
    for a in kwargs.values():
        if isinstance(a, Tensor) or a.__class__ is list or a.__class__ is tuple:
            return list(ins) + tensors_in((), kwargs)
    return ins


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
        #: when call_site is UNRESOLVED inside such a call made from torch's own code: the
        #: frame that made it, for the call's first op to find the site from (see FunctionMode)
        self.call_frame: Any = None
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
        other.sites = self.sites.fork()
        other.timeline = self.timeline.fork() if self.timeline is not None else None
        other.suspended = False
        other.trigger = other.forced = other.call_args = None
        other.call_site = other.backward_site = UNRESOLVED
        other.call_frame = None
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
    def dispatcher(self) -> Callable[..., Any]:
        """The dispatch mode's `__torch_dispatch__` for this state: runs one aten op and
        records it.

        It runs for every op of the program (docs/benchmarks.md has what each part costs), so
        it is one closure, not a method behind the mode's own: what stays fixed for the run
        (the device, the records, the tables) is bound once here, the lookups of the helpers
        it would call are inlined, and it is also the mode's wrapper. torch wraps a dispatch
        mode's `__torch_dispatch__` in torch._dynamo.disable (about a microsecond an op); the
        mode opts out (modes.DispatchMode) and this does the same job in two C calls: no
        eval-frame callback runs the tracer's own code (the caller's is restored after). The
        tracer's own tensor reads must not reach a function mode or a subclass handler:
        DisableTorchFunction is entered only when `_has_torch_function` says one could see
        them (usually none can: the function mode is off while the call it handles runs, and
        entering it costs a fifth of a microsecond).
        """
        state = self
        sim = self.sim
        timer = self.timer
        timeline = self.timeline
        thread = self.thread
        profile = self.profile
        launch_ns, kernel_min_ns, bandwidth = self.launch_ns, self.kernel_min_ns, self.bandwidth
        col = self.collector
        ops, producers, pending = col.ops, col.producers, col.pending
        resolve_from = self.sites.resolve_from
        fold_at = OpAgg.FOLD_AT
        cuda_marks = sim.cuda_marks if sim is not None else None
        marks = cuda_marks.refs if sim is not None else None
        mark_new = cuda_marks.add_new if sim is not None else None

        def dispatch(mode: Any, func: Any, types: Any, args: tuple = (),
                     kwargs: dict | None = None) -> Any:
            prior = set_eval_frame(None)
            disabled = None
            try:
                if kwargs is None:
                    kwargs = _NO_KWARGS
                if state.suspended:
                    return func(*args, **kwargs)
                if _has_torch_function(args):
                    disabled = _DisableTorchFunction()
                    disabled.__enter__()
                if timeline is not None:  # the program's own time since the tracer returned
                    timeline.host_ns += perf_counter_ns() - state.last_exit
                info = OP_INFO.get(id(func)) or op_info(func)
                for a in args:  # the tensor inputs: most often all the arguments
                    if not isinstance(a, Tensor):
                        ins = []
                        for a in args:
                            if isinstance(a, Tensor):
                                ins.append(a)
                            elif (a.__class__ is list or a.__class__ is tuple) and a and (
                                    a[0].__class__ is not int):  # Tensor[] or Tensor?[]
                                # (not int[]: a view's or a sum's sizes, most lists here)
                                ins += [b for b in a if isinstance(b, Tensor)]
                        break
                else:
                    ins = args
                if kwargs:
                    ins = _with_kwarg_tensors(ins, kwargs)
                forced = state.forced
                if sim is not None:
                    if kwargs:
                        target = kwargs.get("device")
                        if target is not None and _names_cuda(target):
                            # A real cuda device reached an aten op (torch.set_default_device
                            # ("cuda"), or torch code handed one): build on the host, or copy
                            # there, as a GPU would.
                            if ins and info.short == "_to_copy":
                                return sim.dispatch_transfer(func, args, kwargs)
                            kwargs = {**kwargs, "device": _CPU}
                            forced = True
                    if marks:
                        dev_in = []
                        for t in ins:
                            try:
                                dev_in.append(id(t.untyped_storage()) in marks)
                            except NO_STORAGE:
                                dev_in.append(False)  # sparse, nested, storage-less: unmarked
                        any_dev = True in dev_in
                        if any_dev and False in dev_in and not info.mixed_ok and forced is None:
                            sim.check_mixed(ins, dev_in)
                    else:
                        dev_in, any_dev = (), False
                else:
                    dev_in = [t.is_cuda for t in ins]
                    any_dev = True in dev_in
                    if info.short in ("_to_copy", "copy_") and (
                            any_dev or _names_cuda(kwargs.get("device"))):
                        # .to("cuda") of a host tensor has no device input: its target says it
                        copied = state._real_copy(info, func, args, kwargs)
                        if copied is not None:
                            return copied[0]

                site = state.call_site  # set by the function mode for a call into C++
                if site is UNRESOLVED:
                    caller = state.call_frame  # the caller of such a call in torch's code:
                    if caller is not None:  # the call's site, found by its first op
                        site = state.call_site = resolve_from(caller)
                    else:
                        caller = _getframe(1)  # the Python frame below the C++ of this op
                        if (caller is not None and caller.f_code is ENGINE_RUN_BACKWARD
                                and state.backward_site is not UNRESOLVED):
                            site = state.backward_site  # from the autograd engine
                        else:  # (a hook or custom Function would be the caller between)
                            site = resolve_from(caller)
                    del caller  # a frame holds the program's locals: never keep it

                if timer is not None and (any_dev or (
                        not ins and _names_cuda(kwargs.get("device")))):
                    mark = timer.begin()
                else:
                    mark = None
                t0 = perf_counter_ns()
                # (without kwargs, most ops, the call builds no dict to unpack them into)
                out = info.call(*args, **kwargs) if kwargs else info.call(*args)
                host_ns = perf_counter_ns() - t0
                if isinstance(out, Tensor):
                    outs = (out,)
                else:
                    outs = tensors_out(out)

                if sim is not None:
                    if forced is not None:
                        cuda_out = forced
                    elif ins:
                        cuda_out = any_dev
                    else:
                        cuda_out = state.call_args is not None and sim.any_cuda(*state.call_args)
                    if cuda_out:
                        for o in outs:
                            try:
                                storage = o.untyped_storage()
                            except NO_STORAGE:
                                continue  # sparse, nested or storage-less tensors: unmarked
                            storage_id = id(storage)
                            if storage_id not in marks:  # new storage (not a view, in place)
                                mark_new(storage, storage_id)
                        device = "cuda:0"
                    else:
                        device = "cuda:0" if any_dev else "cpu"
                elif any_dev:
                    device = f"cuda:{ins[dev_in.index(True)].get_device()}"
                elif outs and outs[0].is_cuda:
                    device = f"cuda:{outs[0].get_device()}"
                else:
                    device = "cpu"

                sync = info.sync
                copy_is_op = any_dev and sync is not None and not info.kernel and dev_in[0]
                if not copy_is_op:
                    key = (info.name, device, id(site), thread)
                    agg = ops.get(key)
                    if agg is None:
                        agg = col.new_op(key, info.name, device, site)
                        agg.launch_ns = launch_ns
                    kernel = info.kernel
                    flops = 0
                    if kernel and info.flops is not None:
                        try:
                            flops = info.flops(args, kwargs, outs)
                        except Exception:  # a formula that does not fit these arguments
                            flops = 0
                    # the inputs: bytes read, and the op graph's edges from the ops that
                    # made them
                    nbytes = producers.read(ins, agg.flows_in, kernel)
                    if pending:  # copies awaiting their first reader: is it this op?
                        for t in ins:
                            col.consume(t, agg.ref)
                    # the outputs: made by this op, or by the op that made the input an op
                    # hands back unchanged; a kernel's outputs are bytes it wrote
                    producer = agg
                    if info.pass_through and ins:
                        producer = producers.get(ins[0]) or agg
                    if kernel:
                        nbytes += producers.write(outs, producer, True)
                    else:
                        producers.write(outs, producer, False)
                        nbytes = 0

                    device_ns = 0
                    if device == "cpu" or sim is None or not kernel:
                        # the op's time is the host's (on a real GPU its device time is added
                        # when measured; on the simulated one a view or an allocation has
                        # none): folded into its counters later (OpAgg.fold)
                        if timeline is not None:
                            timeline.host_ns += host_ns
                        elif mark is not None:
                            timer.end(mark, agg, host_ns)
                        times = agg.times
                        times.append(host_ns)
                        if len(times) >= fold_at:
                            agg.fold()
                    else:  # simulated kernel: modeled; the host pays the launch
                        agg.run_ns += host_ns  # what the host computed the op in
                        if flops:
                            ref = outs[0] if outs else ins[0]
                            device_ns = profile.kernel_ns(
                                flops, nbytes, DTYPE_CLASS.get(ref.dtype, "other"))
                        else:  # DeviceProfile.kernel_ns without FLOPs: bytes/bandwidth
                            device_ns = kernel_min_ns + round(nbytes / bandwidth * 1e9)
                        # Timeline.enqueue, inlined: the host pays the launch, the device
                        # runs the kernel when it is free
                        host_ns = launch_ns
                        timeline.host_ns += host_ns
                        start = timeline.host_ns
                        if timeline.device_ns > start:
                            start = timeline.device_ns
                        timeline.device_ns = start + device_ns
                        kernels = agg.kernel_times  # folded later, as `times`
                        kernels.append(device_ns)
                        if len(kernels) >= fold_at:
                            agg.fold()
                    if flops:
                        agg.flops += flops
                    if nbytes:
                        agg.bytes += nbytes
                    if col.chrome is not None:
                        col.chrome_op(agg, host_ns, device_ns)
                elif mark is not None:
                    timer.cancel(mark)  # the op is a copy: its time is the copy's

                if any_dev:
                    if sync is not None and dev_in[0]:
                        trigger = sync.trigger
                        if (info.short == "_local_scalar_dense"
                                and state.trigger in SCALAR_TRIGGERS):
                            trigger = state.trigger
                        state.sync_copy("DtoH", trigger, sync.nbytes(args, kwargs, out), ins[0],
                                        site, host_ns if copy_is_op else 0)
                    elif info.repeat_interleave_tensor and dev_in[0]:
                        output_size = args[1] if len(args) > 1 else kwargs.get("output_size")
                        if output_size is None:  # its size is the sum of repeats, read back
                            state.sync_copy("DtoH", "repeat_interleave", 8, ins[0], site, 0)
                    elif info.index:
                        state._index_copies(info, args, site)
                if timeline is not None:
                    state.last_exit = perf_counter_ns()
                return out
            finally:
                if disabled is not None:
                    disabled.__exit__(None, None, None)
                if prior is not None:  # (torch.compile's callback; most often none is set)
                    set_eval_frame(prior)

        return dispatch

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

