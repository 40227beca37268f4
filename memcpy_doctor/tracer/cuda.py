"""The real GPU: its steps of the per-op path, its copies and host waits, measured.

`GpuSteps` holds the real GPU's steps of the one per-op path (tracer/perop.py): a copy
between devices is recorded as a copy (`real_copy`), any other op is timed by CUDA events
(tracer/cuda_timer.py) when it launches device work, and recorded by the shared last steps.
Host waits are caught twice: the Python calls that wait are wrapped (`wait_patches`), and
CUDA's own synchronization callbacks (tracer/cuda_hooks.py) catch the waits inside C++ code.
The data factories copy below the dispatcher and are recorded by the function mode
(`factory_handler`).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any, Callable

import torch

from ..core.torch_private import default_device_type
from .backward import engine_patches
from .cuda_hooks import COPY_OPS, records_waits
from .optable import OpInfo
from .sim.torchlib import tensors_in_data
from .tensors import tensors_out

Tensor = torch.Tensor


def wait_patches(state_of: Any) -> list[tuple[Any, str, Any]]:
    """Wrap the real host waits so each is recorded (with its measured time) at its site, in
    the state of the thread that waits (`state_of()`); and the backward engine's entry, where
    the reads of backward formulas are armed (tracer/backward.py)."""

    def timed(kind: str, original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = state_of()
            if state.suspended:
                return original(*args, **kwargs)
            t0 = perf_counter_ns()
            result = run_recorded(state, original, args, kwargs)
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
        *engine_patches(state_of),
    ]


def run_recorded(ctx: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)`, run as part of a copy or wait that the tracer records itself
    in the thread context `ctx`: a CUDA sync inside it is not reported again (cuda_hooks
    GpuWaits.recording)."""
    waits = ctx.gpu
    waits.recording += 1
    try:
        return func(*args, **kwargs)
    finally:
        waits.recording -= 1


class GpuSteps:
    """The real GPU's own steps of the per-op path (tracer/perop.py) for one thread
    context (`run`): which inputs are on the device, a copy between devices, and the op run,
    timed and recorded. An op that launches device work is timed by CUDA events around it;
    a host wait inside it (reported by cuda_hooks.SyncHooks) is timed to its return."""

    __slots__ = ("ctx", "timer", "waits", "events")

    def __init__(self, ctx: Any) -> None:
        self.ctx, self.timer, self.waits, self.events = ctx, ctx.timer, ctx.gpu, ctx.events

    def run(self, record: Callable[..., Any], info: OpInfo, func: Any, args: tuple,
            kwargs: dict, ins: Any, to_cuda: bool | None, site: Any) -> Any:
        """Step 2 and steps 4 to 8 of an op on a real GPU, whose inputs are `ins` (to the
        device: `to_cuda`): which inputs are on a GPU; a copy between devices run and
        recorded as a copy (`real_copy`); else the op run, timed, and recorded with
        `record`."""
        dev_in = [t.is_cuda for t in ins]
        any_dev = True in dev_in
        if (any_dev or to_cuda) and info.short in COPY_OPS:
            copied = real_copy(self.ctx, info, func, args, kwargs)
            if copied is not None:
                return copied[0]
        timer, waits = self.timer, self.waits
        mark = None
        if info.kernel and (any_dev or (not ins and to_cuda)):  # (a view launches nothing)
            mark = timer.begin(0 if timer.devices < 2 else _device_of(
                ins[dev_in.index(True)] if any_dev else None, kwargs.get("device")))
        prev, waits.running_op = waits.running_op, info
        t0 = perf_counter_ns()
        try:
            out = info.call(*args, **kwargs)
        finally:
            waits.running_op = prev
            t1 = perf_counter_ns()
            sync_at = waits.sync_at_ns
            if sync_at:
                waits.sync_at_ns = 0
        host_ns = t1 - t0
        outs = (out,) if isinstance(out, Tensor) else tensors_out(out)
        if any_dev:
            device = f"cuda:{ins[dev_in.index(True)].get_device()}"
        elif outs and outs[0].is_cuda:
            device = f"cuda:{outs[0].get_device()}"
        else:
            device = "cpu"
        # a wait inside the op: for its copy (read by opreads.after_op), or named after it
        agg = record(info, args, kwargs, ins, out, outs, dev_in, any_dev, device, site,
                     host_ns, t1 - sync_at if sync_at else 0)
        if sync_at and not records_waits(info):
            self.ctx.host_wait(f"{waits.sync_kind} in {info.name}", t1 - sync_at, site)
        if mark is not None:  # the op's device time, from its events once they are read
            if agg is not None:
                events = self.events
                timer.end(mark, agg, host_ns, events, events.kept_last(agg))
            else:
                timer.cancel(mark)  # the op is a copy: its time is the copy's
        return out


def _device_of(tensor: Tensor | None, device: Any) -> int:
    """The index of the GPU an op's device work runs on: its device input's, else the one
    its `device` argument names, else the current one."""
    if tensor is not None:
        return tensor.get_device()
    if isinstance(device, torch.device) and device.index is not None:
        return device.index
    return torch.cuda.current_device()


def real_copy(ctx: Any, info: OpInfo, func: Any, args: tuple,
              kwargs: dict) -> tuple[Any] | None:
    """A real GPU's copy between devices (`_to_copy` or `copy_`), run and recorded as a copy
    rather than an op; None if the op copies within one device (then it is an op)."""
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
        target = dst.device
        dst_cuda = dst.is_cuda
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if src.is_cuda and dst_cuda:
        host_pinned = None
    elif dst_cuda:
        host_pinned = src.is_pinned()
    else:
        host_pinned = args[0].is_pinned() if info.short == "copy_" else None
    direction, pinned, sync = copy_kind(info.short, src.is_cuda, dst_cuda, non_blocking,
                                        host_pinned)
    site = ctx.here()
    timer = ctx.timer
    mark = timer.begin(0 if timer.devices < 2 else _device_of(
        src if src.is_cuda else None, target))
    t0 = perf_counter_ns()
    out = run_recorded(ctx, func, args, kwargs)
    host_ns = perf_counter_ns() - t0
    dst_t = out if isinstance(out, Tensor) else args[0]
    trigger = ctx.trigger or ("to" if info.short == "_to_copy" else "copy_")
    pending = ctx.record_copy(direction, sync, pinned, trigger, dst_t.nbytes, host_ns, 0,
                              site, src, dst_t, src, info.short == "copy_", non_blocking)
    timer.end(mark, pending, host_ns, ctx.events, ctx.events.kept_last(pending))
    ctx.collector.inherit_producer(dst_t, src)
    return (out,)


def copy_kind(op: str, src_cuda: bool, dst_cuda: bool, non_blocking: bool,
              host_pinned: bool | None) -> tuple[str, bool | None, bool]:
    """(direction, pinned, sync) of a copy between devices made by `op` (`_to_copy` or
    `copy_`), as PyTorch runs it (Copy.cu): between GPUs, copy_device_to_device never waits
    on the host; from the host (`host_pinned`: whether the source is pinned), a copy
    without non_blocking is memcpy_and_sync, pinned or not, and one with non_blocking from
    pageable memory is cudaMemcpyAsync, which the driver stages through its own pinned
    buffers while the host is blocked ("might be synchronous with respect to host": CUDA's
    API synchronization behavior), so it is sync too; to the host, `.to(non_blocking=True)`
    allocates its output pinned, while `copy_` writes into the caller's buffer
    (`host_pinned`: the destination's), and into pageable memory the host waits. (Whether
    the call asked non_blocking is recorded beside, as the copy's `non_blocking`.)"""
    if src_cuda and dst_cuda:
        return "DtoD", None, False
    if dst_cuda:
        return "HtoD", host_pinned, not (non_blocking and host_pinned)
    pinned = non_blocking if op == "_to_copy" else bool(host_pinned)
    return "DtoH", pinned, not (non_blocking and pinned)


def factory_handler(state: Any) -> Callable[..., Any]:
    """The function mode's handler of the data factories on a real GPU (`torch.tensor(data,
    device="cuda")`, `as_tensor`, `asarray`, `t.new_tensor`). They copy from the host in C++
    under ExcludeDispatchKeyGuard(Python) (tensor_new.cpp, internal_new_from_data), out of the
    dispatch mode's sight, where the sync hook alone would see a stream wait. Recorded here as
    the simulated GPU records them: a DtoH sync `factory` read of each device tensor inside
    list data (or of a device tensor given with `device="cpu"`), then an HtoD sync `factory`
    copy of the result (its time is the whole call's)."""

    def factory(func: Any, args: tuple, kwargs: dict) -> Any:
        first = 1 if func is Tensor.new_tensor else 0
        data = args[first] if len(args) > first else kwargs.get("data", kwargs.get("obj"))
        device = kwargs.get("device")
        if device is None:
            device = args[0].device if first else default_device_type()
        on_device = isinstance(data, Tensor) and data.is_cuda
        to_cuda = torch.device(device).type == "cuda" and not on_device
        if isinstance(data, (list, tuple)):
            reads = [t for t in tensors_in_data(data) if t.is_cuda]
        else:  # a device tensor sent to the host named by `device=`: `var.to(device)`
            reads = [data] if on_device and kwargs.get("device") is not None and (
                torch.device(device).type == "cpu") else []
        if not to_cuda and not reads:
            return func(*args, **kwargs)
        site = state.here()
        for t in reads:
            state.sync_copy("DtoH", "factory", t.nbytes, t, site, 0)
        with state.suspend():  # the call's ops and waits are this copy's
            t0 = perf_counter_ns()
            out = func(*args, **kwargs)
            host_ns = perf_counter_ns() - t0
        if to_cuda and isinstance(out, Tensor) and out.nbytes:
            src = data if isinstance(data, Tensor) else None
            state.record_copy("HtoD", True, False, "factory", out.nbytes, host_ns, 0, site,
                              src, out, out)
            if src is not None:
                state.collector.inherit_producer(out, src)
        return out

    return factory


def device_peaks() -> list[int]:
    """The allocator's peak of allocated bytes on each GPU, as PyTorch keeps it."""
    return [torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())]


def measured_peak(before: list[int], notes: list[str]) -> int | None:
    """The run's peak on a real GPU, from the allocator's peaks at its start (`before`) and
    now; where it is not known, a note to the trace's `notes` says why."""
    peak = run_peak(before, device_peaks())
    if peak is None:
        notes.append("peak memory: not known; the allocator's peak before the run was higher "
                     "than any during it (torch.cuda.reset_peak_memory_stats() before tracing "
                     "gives it)")
    return peak


def run_peak(before: list[int], after: list[int]) -> int | None:
    """The peak a run reached on its busiest GPU, from the allocator's peaks before and after
    it: None when no peak rose and one before was above zero (the program's peak before the
    run is higher; the tracer leaves PyTorch's peak statistics as they are rather than reset
    them under the program)."""
    risen = [a for a, b in zip(after, before) if a > b]
    if risen:
        return max(risen)
    return None if any(before) else 0
