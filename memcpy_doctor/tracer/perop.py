"""The per-op path: what the dispatch mode runs for every aten op, forward and backward.

There is one, for every device: the simulated GPU (and host tensors, the benchmarked path),
a real GPU, and the pytest plugin's session-wide simulated GPU, which records nothing. It is
the tracer's hot path (docs/benchmarks.md has what each part costs), so it is two closures
over one thread's context, with what stays fixed for the run bound once; on the simulated
GPU an op costs one Python call beyond the op itself (the second closure):

- `dispatcher` guards the op (no eval-frame callback, no torch function handling, nothing
  while the tracer is suspended), hands it to the compiled region the thread is in, if any
  (tracer/regions.py), then runs the steps every device shares: the op's entry in the op
  table, its tensor inputs, its call site, the op itself. Where devices differ, it calls
  the device's own step: on the simulated GPU, which inputs are marked as the device's, the
  error a GPU raises for mixed devices, the marks of the outputs (written inline: they run
  on every op); on a real GPU, `GpuSteps` (tracer/cuda.py): inputs from `is_cuda`, a copy
  between devices, the op timed by the wall clock and CUDA events.
- `recorder` makes the closure it ends with: the aggregate of (op, device, site, thread),
  the bytes the op read and wrote with the op-graph edges from their producers, its time
  (on the simulated GPU modeled, host side included: docs/sim-time.md; on a real GPU the
  host's measured time and CUDA events), the op's event in the run's ordered record while
  it has room (tracer/events.py: past its bound, one comparison), and the host waits the op
  makes when it reads device data (tracer/opreads.py). A host op made while an async copy
  is in flight is shown to the race checker (tracer/races.py: one truth test otherwise).

The guard: torch wraps a dispatch mode's `__torch_dispatch__` in torch._dynamo.disable (about
a microsecond an op); the mode opts out (modes.DispatchMode) and `dispatch` does the same job
in two C calls: no eval-frame callback runs the tracer's own code (the caller's is restored
after). The tracer's own tensor reads must not reach a function mode or a subclass handler:
DisableTorchFunction is entered only when `_has_torch_function` says one could see them
(usually none can: the function mode is off while the call it handles runs).

docs/architecture.md walks through these steps.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..core.torch_private import set_eval_frame
from .collector import OpAgg
from .context import UNRESOLVED, ThreadContext
from .cuda import GpuSteps
from .opreads import after_op
from .optable import DTYPE_CLASS, OP_INFO, op_info
from .tensors import (NO_KWARGS, names_cuda, storage_of, tensor_args, tensors_out,
                      with_kwarg_tensors)

Tensor = torch.Tensor

_CPU = torch.device("cpu")
_DisableTorchFunction = torch._C.DisableTorchFunction
#: Whether a torch function mode is on the stack or an argument is a tensor subclass with its
#: own __torch_function__ (see `dispatcher`).
_has_torch_function = torch._C._has_torch_function


def dispatcher(ctx: ThreadContext, records: bool = True) -> Callable[..., Any]:
    """The dispatch mode's `__torch_dispatch__` for the thread of `ctx`: runs one aten op
    and records it (with `records` False, only simulates the device: SessionSim's)."""
    sim, resolve_from = ctx.sim, ctx.sites.resolve_from
    record, gpu = recorder(ctx) if records else _unrecorded, GpuSteps(ctx) if sim is None else None
    # the program's own time per op (modeled), on a clock nobody reads on a real GPU
    clock = ctx.timeline if ctx.timeline is not None else _Unread()
    python_op_ns = ctx.profile.python_op_ns
    if not records:  # no site is looked for
        ctx.call_site = None
    cuda = sim.cuda_marks if sim is not None else None  # (the simulated device's marks)
    marks, marked_in, mark_outputs = ((cuda.refs, cuda.inputs, cuda.mark_outputs)
                                      if cuda is not None else (None, None, None))

    def dispatch(mode: Any, func: Any, types: Any, args: tuple = (),
                 kwargs: dict | None = None) -> Any:
        prior, disabled = set_eval_frame(None), None
        try:
            kwargs = kwargs or NO_KWARGS
            if ctx.suspended:
                return func(*args, **kwargs)
            if _has_torch_function(args):
                disabled = _DisableTorchFunction()
                disabled.__enter__()
            if ctx.region is not None:  # inside a compiled graph's call
                return _in_region(ctx, dispatch, mode, func, types, args, kwargs)
            # 1. the op, and its tensor inputs (most often all its arguments, or the first)
            info = OP_INFO.get(id(func)) or op_info(func)
            if info.composite:  # (inference mode: autograd did not decompose it)
                return _decomposed(mode, func, args, kwargs)
            clock.host_ns += python_op_ns  # 0. the program's own time before this op
            for a in args:
                if not isinstance(a, Tensor):
                    ins = args[:1] if info.lone_tensor else tensor_args(args)
                    break
            else:
                ins = args
            forced = ctx.forced  # a simulated factory's outputs: on cuda (True) or host
            if kwargs:
                ins = with_kwarg_tensors(ins, kwargs)
                if gpu is None and kwargs.get("pin_memory"):
                    return _pinned(sim, func, args, kwargs)  # (below the function mode)
                if names_cuda(kwargs.get("device")):  # a cuda device reached an op
                    if gpu is None and ins and info.short == "_to_copy":
                        return sim.dispatch_transfer(func, args, kwargs)
                    if gpu is None:  # the simulated GPU builds it on the host
                        kwargs = {**kwargs, "device": _CPU}
                    forced = True
            dev_in, any_dev = (), False  # 2. which inputs are on the simulated device
            if marks:  # (none while no storage is marked, and none on a real GPU)
                dev_in = marked_in(ins)
                any_dev = True in dev_in
                if any_dev and False in dev_in and forced is None and sim.mixed(info, ins, dev_in):
                    return sim.dispatch_copy(func, args, kwargs)  # (from C++ code)
            site = ctx.call_site  # 3. the call site: the function mode's, for a call into C++
            if site is UNRESOLVED:
                caller = ctx.call_frame  # such a call made from torch's code: its site,
                if caller is not None:  # found by its first op, once
                    site = ctx.call_site = resolve_from(caller)
                else:  # a walk, or the backward() call's site
                    site = ctx.op_site(2)
            if gpu is not None:  # 2 and 4-8 on a real GPU (timed by the clock and CUDA events)
                return gpu.run(record, info, func, args, kwargs, ins, forced, site)
            out = info.call(*args, **kwargs) if kwargs else info.call(*args)  # 4. the op
            outs = (out,) if isinstance(out, Tensor) else tensors_out(out)
            # 5. the outputs' device (a factory in a composite op: that of its call's inputs)
            on_device = forced if forced is not None else any_dev if ins else (
                ctx.call_args is not None and sim.any_cuda(*ctx.call_args))
            if on_device:  # new storages made on the device are marked
                mark_outputs(outs)
            record(info, args, kwargs, ins, out, outs, dev_in, any_dev,
                   "cuda:0" if on_device or any_dev else "cpu", site, 0)
            return out
        finally:
            if disabled is not None:
                disabled.__exit__(None, None, None)
            if prior is not None:  # (torch.compile's callback; most often none is set)
                set_eval_frame(prior)

    return dispatch


def _in_region(ctx: ThreadContext, dispatch: Callable[..., Any], mode: Any, func: Any,
               types: Any, args: tuple, kwargs: dict) -> Any:
    """An op a compiled graph's call dispatches (tracer/regions.py): its region sees it
    before and after `dispatch` runs it."""
    region = ctx.region
    region.enter(args, kwargs)
    ctx.region = None
    try:
        return dispatch(mode, func, types, args, kwargs)
    finally:
        ctx.region = region
        region.leave(func)


class _Unread:
    """The modeled host clock a real GPU's per-op path advances, which nobody reads."""

    __slots__ = ("host_ns",)

    def __init__(self) -> None:
        self.host_ns = 0


def _decomposed(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """A composite op run as its parts, with the mode on, so that each part reaches the
    per-op path as it does where autograd decomposes it (what FakeTensorMode does)."""
    with mode:
        return func.decompose(*args, **kwargs)


def _pinned(sim: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """A factory asking pinned memory where the function mode does not see it (a
    saved-tensors hook's `torch.empty(..., pin_memory=True)`, as `save_on_cpu` makes): host
    memory, marked pinned, as the function mode's factory handler makes it (an allocation:
    no kernel, no record)."""
    out = func(*args, **{**kwargs, "pin_memory": False})
    sim.pinned_marks.add(storage_of(out))
    return out


def _unrecorded(*args: Any) -> None:
    """The record step of a path that records nothing (SessionSim's)."""


def recorder(ctx: ThreadContext) -> Callable[..., Any]:
    """The per-op path's last steps: `record(...)` records an op (on a real GPU `host_ns` is
    measured, `waited_ns` a wait inside it); returns its aggregate (None: a copy, `item()`)."""
    sim, timeline, thread, profile = ctx.sim, ctx.timeline, ctx.thread, ctx.profile
    launch_ns, kernel_ns, host_cost = profile.launch_ns, profile.kernel_ns, profile.host_ns
    col, fold_at, events = ctx.collector, OpAgg.FOLD_AT, ctx.events
    ops, producers, pending = col.ops, col.producers, col.pending
    races, inflight = ctx.run.races, ctx.run.races.inflight  # (empty: no copy in flight)

    def record(info: Any, args: tuple, kwargs: dict, ins: Any, out: Any, outs: Any,
               dev_in: Any, any_dev: bool, device: str, site: Any, host_ns: int,
               waited_ns: int = 0) -> Any:
        agg = None
        if inflight and device == "cpu" and (info.kernel or info.sync is not None):
            races.access(info.name, info.short, ins, site, thread)  # (a copy's memory?)
        copy_is_op = any_dev and info.sync is not None and not info.kernel and dev_in[0]
        if not copy_is_op:
            # 6. the aggregate, and the bytes read and written with the op graph's edges
            key = (info.name, device, id(site), thread)
            agg = ops.get(key)
            if agg is None:
                agg = col.new_op(key, info.name, device, site, launch_ns)
            kernel = info.kernel
            flops = info.flops(args, kwargs, outs) if kernel and info.flops is not None else 0
            nbytes = producers.read(ins, agg.flows_in, kernel)
            if pending:  # copies awaiting their first reader: is it this op?
                for t in ins:
                    col.consume(t, agg.ref)
            # the outputs are made by this op, or, where an op hands its input back
            # unchanged, by the op that made that input; a kernel's outputs are bytes written
            producer = agg
            if info.pass_through and ins:
                producer = producers.get(ins[0]) or agg
            if kernel:
                nbytes += producers.write(outs, producer, True)
            else:
                producers.write(outs, producer, False)
                nbytes = 0
            device_ns = 0  # 7. the op's time
            if sim is None or device == "cpu" or not kernel:
                # the host's (a real GPU's device time comes from its events), folded later
                if timeline is not None:  # simulated: modeled, as the last call's if alike
                    if nbytes != agg.model_bytes or flops != agg.model_flops:
                        agg.model_bytes, agg.model_flops = nbytes, flops
                        agg.model_ns = host_cost(flops, nbytes)
                    host_ns = agg.model_ns
                    timeline.host_ns += host_ns
                times = agg.times
                times.append(host_ns)
                if len(times) >= fold_at:
                    agg.fold()
            else:  # a simulated kernel: modeled; the host pays its launch
                dtype = (DTYPE_CLASS.get((outs[0] if outs else ins[0]).dtype, "other")
                         if flops else None)  # (the peak FLOP/s of that dtype)
                if nbytes != agg.model_bytes or flops != agg.model_flops or (
                        dtype != agg.model_dtype):  # else the time of the last call stands
                    agg.model_bytes, agg.model_flops, agg.model_dtype = nbytes, flops, dtype
                    agg.model_ns = kernel_ns(flops, nbytes, dtype)
                    agg.model_host_ns = host_cost(flops, nbytes)
                device_ns = agg.model_ns
                agg.run_ns += agg.model_host_ns  # what it would cost on the host
                # Timeline.enqueue inlined (a call costs 420 instructions; test_costmodel)
                host = timeline.host_ns = timeline.host_ns + launch_ns
                start, host_ns = timeline.device_ns, launch_ns
                timeline.device_ns = (host if host > start else start) + device_ns
                timeline.busy_ns += device_ns
                (kernels := agg.kernel_times).append(device_ns)  # folded later, as `times`
                if len(kernels) >= fold_at:
                    agg.fold()
            agg.flops += flops
            agg.bytes += nbytes
            if events.room:  # the ordered record, while it has room
                events.op(ctx, agg, kernel and device != "cpu", host_ns, device_ns, ins, outs)
        # 8. the copies an op makes inside its own code
        if any_dev and info.reads:
            after_op(ctx, info, args, kwargs, out, site,
                     waited_ns or (host_ns if copy_is_op else 0))
        return agg

    return record
