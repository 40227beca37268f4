"""The tracer's per-run state and its per-op path, shared by the real and the simulated GPU.

`TraceState.dispatch` is called for every aten op (forward and backward) by the dispatch mode;
it is the hot path: one op-table lookup, one call-site walk over cached code objects, one
aggregate update, one weak reference per output for producer tracking.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

import torch

from ..analysis.costmodel import DeviceProfile, Timeline
from .collector import Collector
from .optable import SCALAR_TRIGGERS, OpInfo, dtype_class, index_tensors, is_mask, op_info
from .sites import SiteResolver

Tensor = torch.Tensor

#: Ops that hand back their input's data unchanged: the producer stays the op that made it.
_PASS_THROUGH = frozenset({"detach", "alias", "lift_fresh"})
_CPU = torch.device("cpu")


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


def _work(info: OpInfo, args: tuple, kwargs: dict, ins: list[Tensor],
          outs: list[Tensor]) -> tuple[int, int, str]:
    """FLOPs, bytes read and written, and the dtype class of one kernel (the roofline's input;
    kept for placement, which asks what an op would cost on the other device)."""
    flops = 0
    if info.flops is not None:
        try:
            flops = info.flops(args, kwargs, outs)
        except Exception:  # a formula that does not fit these arguments: count bytes only
            flops = 0
    nbytes = sum(t.nbytes for t in ins) + sum(o.nbytes for o in outs)
    ref = outs[0] if outs else (ins[0] if ins else None)
    return flops, nbytes, dtype_class(ref.dtype) if ref is not None else "other"


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
        self.last_exit = perf_counter_ns()
        self.untraced_threads: list[str] = []  # threads started while tracing

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
        self.gap()
        info = op_info(func)
        ins = tensors_in(args, kwargs)
        sim = self.sim
        forced = self.forced
        if sim is not None:
            target = kwargs.get("device")
            if _names_cuda(target):
                # A real cuda device reached an aten op (torch.set_default_device("cuda"), or
                # torch code handed one): build on the host, or copy there, as a GPU would.
                if ins and info.short == "_to_copy":
                    return sim.dispatch_transfer(func, args, kwargs)
                kwargs = {**kwargs, "device": _CPU}
                forced = True
            on_dev = sim.on_device
            dev_in = [on_dev(t) for t in ins]
            any_dev = True in dev_in
            if any_dev and False in dev_in and not info.mixed_ok and forced is None:
                sim.check_mixed(ins, dev_in)
        else:
            dev_in = [t.is_cuda for t in ins]
            any_dev = True in dev_in
            if info.short in ("_to_copy", "copy_") and (any_dev or
                                                        _names_cuda(kwargs.get("device"))):
                # .to("cuda") of a host tensor has no device input: its target says it
                copied = self._real_copy(info, func, args, kwargs)
                if copied is not None:
                    return copied[0]
        site = self.sites.resolve()
        timer = self.timer
        if timer is not None and (any_dev or (not ins and _names_cuda(kwargs.get("device")))):
            mark = timer.begin()
        else:
            mark = None
        t0 = perf_counter_ns()
        out = func(*args, **kwargs)
        host_ns = perf_counter_ns() - t0
        outs = tensors_out(out)

        if sim is not None:
            if forced is not None:
                cuda_out = forced
            elif ins:
                cuda_out = any_dev
            else:
                cuda_out = self.call_args is not None and sim.any_cuda(*self.call_args)
            if cuda_out:
                for o in outs:
                    sim.mark_cuda(o)
            device = "cuda:0" if (cuda_out or any_dev) else "cpu"
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
            agg = col.op(info.name, device, site)
            run_ns = host_ns
            device_ns = flops = nbytes = 0
            if info.kernel:
                flops, nbytes, dclass = _work(info, args, kwargs, ins, outs)
            if device != "cpu":
                if sim is None:
                    if mark is not None:
                        timer.end(mark, agg, host_ns)
                elif info.kernel:  # simulated kernel: modeled; the host pays the launch only
                    device_ns = self.profile.kernel_ns(flops, nbytes, dclass)
                    host_ns = self.timeline.enqueue(self.profile.launch_ns, device_ns)
                else:
                    self.timeline.host(host_ns)
            elif self.timeline is not None:
                self.timeline.host(host_ns)
            col.add_op(agg, host_ns, device_ns, run_ns, flops, nbytes)
            pending = col.has_pending()
            for t in ins:
                if pending:
                    col.consume(t, agg.ref)
                made_by = col.producer_of(t)
                if made_by is not None:
                    col.flow(made_by, agg.ref, t.nbytes)
            producer = agg.ref
            if info.short in _PASS_THROUGH and ins:
                producer = col.producer_of(ins[0]) or producer
            for o in outs:
                col.set_producer(o, producer)
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
        self.returned()
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
            shape=list(src.shape), dtype=str(src.dtype).replace("torch.", ""))

    def host_wait(self, kind: str, measured_ns: int = 0) -> None:
        """A host wait that is not a copy: synchronize, stream or event waits."""
        if self.suspended:
            return
        if self.timeline is not None:
            self.gap()
            measured_ns = self.timeline.drain(self.profile.sync_ns)
        self.collector.wait(kind, self.sites.resolve(), measured_ns)
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
            shape=list(src.shape), dtype=str(src.dtype).replace("torch.", ""))
        self.timer.end(mark, pending, host_ns)
        if producer is not None:
            self.collector.set_producer(dst_t, producer)
        self.returned()
        return (out,)

