"""The per-op path: what the dispatch mode runs for every aten op, forward and backward.

It is the tracer's hot path (docs/benchmarks.md has what each part costs), so it is two
closures over one run's state, with what stays fixed for the run bound once; an op costs one
Python call beyond the op itself (the second closure):

- `dispatcher` guards the op (no eval-frame callback, no torch function handling, nothing
  while the tracer is suspended), then, on the simulated GPU (and for host tensors), runs its
  first steps inline: the op's entry in the op table, its tensor inputs, which of them are
  on the simulated device, its call site, the op itself, and where its outputs live.
  A real GPU's op goes to the real GPU's own steps (tracer/cuda.py, `gpu_op`) instead.
- `recorder` makes the closure both paths end with: the aggregate of (op, device, site, thread),
  the bytes the op read and wrote with the op-graph edges from their producers, its time
  (on the simulated GPU modeled, host side included: docs/sim-time.md; on a real GPU the
  host's measured time and CUDA events), and the
  host waits the op makes when it reads device data (TraceState.after_op).

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
from .cuda import gpu_op
from .optable import DTYPE_CLASS, OP_INFO, op_info
from .state import (_NO_KWARGS, UNRESOLVED, TraceState, names_cuda, tensor_args, tensors_out,
                    with_kwarg_tensors)

Tensor = torch.Tensor

_CPU = torch.device("cpu")
_DisableTorchFunction = torch._C.DisableTorchFunction
#: Whether a torch function mode is on the stack or an argument is a tensor subclass with its
#: own __torch_function__ (see `dispatcher`).
_has_torch_function = torch._C._has_torch_function


def dispatcher(state: TraceState) -> Callable[..., Any]:
    """The dispatch mode's `__torch_dispatch__` for `state`: runs one aten op, records it."""
    sim, timeline, record = state.sim, state.timeline, recorder(state)
    resolve_from = state.sites.resolve_from
    gpu = gpu_op(state, record) if sim is None else None
    marks = sim.cuda_marks.refs if sim is not None else None
    python_op_ns = state.profile.python_op_ns  # the program's own time per op (modeled)
    marked_in = sim.cuda_marks.inputs if sim is not None else None
    mark_outputs = sim.cuda_marks.mark_outputs if sim is not None else None

    def dispatch(mode: Any, func: Any, types: Any, args: tuple = (),
                 kwargs: dict | None = None) -> Any:
        prior, disabled = set_eval_frame(None), None
        try:
            kwargs = kwargs or _NO_KWARGS
            if state.suspended:
                return func(*args, **kwargs)
            if _has_torch_function(args):
                disabled = _DisableTorchFunction()
                disabled.__enter__()
            if gpu is not None:
                return gpu(func, args, kwargs)
            timeline.host_ns += python_op_ns  # the program's own time before this op
            # 1. the op, and its tensor inputs (most often all its arguments, or the first)
            info = OP_INFO.get(id(func)) or op_info(func)
            for a in args:
                if not isinstance(a, Tensor):
                    ins = args[:1] if info.lone_tensor else tensor_args(args)
                    break
            else:
                ins = args
            forced = state.forced  # a simulated factory's outputs: on cuda (True) or host
            if kwargs:
                ins = with_kwarg_tensors(ins, kwargs)
                if names_cuda(kwargs.get("device")):  # a real cuda device reached an op
                    if ins and info.short == "_to_copy":
                        return sim.dispatch_transfer(func, args, kwargs)
                    kwargs, forced = {**kwargs, "device": _CPU}, True  # built on the host
            dev_in, any_dev = (), False  # 2. which inputs are on the simulated device
            if marks:  # (none while no storage is marked)
                dev_in = marked_in(ins)
                any_dev = True in dev_in
                if any_dev and False in dev_in and forced is None and sim.mixed(info, ins, dev_in):
                    return sim.dispatch_copy(func, args, kwargs)  # (from C++ code)
            site = state.call_site  # 3. the call site: the function mode's, for a call into C++
            if site is UNRESOLVED:
                caller = state.call_frame  # such a call made from torch's code: its site,
                if caller is not None:  # found by its first op, once
                    site = state.call_site = resolve_from(caller)
                else:  # a walk, or the backward() call's site
                    site = state.op_site(2)
            # 4. the op itself (its host time is modeled, in `record`)
            out = info.call(*args, **kwargs) if kwargs else info.call(*args)
            outs = (out,) if isinstance(out, Tensor) else tensors_out(out)
            # 5. the outputs' device (a factory in a composite op: that of its call's inputs)
            on_device = forced if forced is not None else any_dev if ins else (
                state.call_args is not None and sim.any_cuda(*state.call_args))
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


def recorder(state: TraceState) -> Callable[..., None]:
    """The last steps of both per-op paths: `record(...)` records one op that ran on `device`
    (`dev_in`: which inputs `ins` are there; `host_ns`: measured, on a real GPU only), returns
    its aggregate, or None for an op that is itself a copy (`item()`'s `_local_scalar_dense`)."""
    sim, timeline, thread, profile = state.sim, state.timeline, state.thread, state.profile
    launch_ns, kernel_ns, host_cost = profile.launch_ns, profile.kernel_ns, profile.host_ns
    col, fold_at = state.collector, OpAgg.FOLD_AT
    ops, producers, pending = col.ops, col.producers, col.pending

    def record(info: Any, args: tuple, kwargs: dict, ins: Any, out: Any, outs: Any,
               dev_in: Any, any_dev: bool, device: str, site: Any, host_ns: int) -> Any:
        agg = None
        copy_is_op = any_dev and info.sync is not None and not info.kernel and dev_in[0]
        if not copy_is_op:
            # 6. the aggregate, and the bytes read and written with the op graph's edges
            key = (info.name, device, id(site), thread)
            agg = ops.get(key)
            if agg is None:
                agg = col.new_op(key, info.name, device, site)
                agg.launch_ns = launch_ns
            kernel = info.kernel
            try:
                flops = info.flops(args, kwargs, outs) if kernel and info.flops is not None else 0
            except Exception:  # a formula that does not fit these arguments
                flops = 0
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
                # Timeline.enqueue written out (its call cost 420 instructions an op)
                host = timeline.host_ns = timeline.host_ns + launch_ns
                start, host_ns = timeline.device_ns, launch_ns
                timeline.device_ns = (host if host > start else start) + device_ns
                timeline.busy_ns += device_ns
                (kernels := agg.kernel_times).append(device_ns)  # folded later, as `times`
                if len(kernels) >= fold_at:
                    agg.fold()
            agg.flops += flops
            agg.bytes += nbytes
            if col.chrome is not None:
                col.chrome_op(agg, host_ns, device_ns)
        # 8. the copies an op makes inside its own code
        if any_dev and info.reads:
            state.after_op(info, args, kwargs, out, site, host_ns if copy_is_op else 0)
        return agg

    return record
