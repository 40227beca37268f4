"""A compiled graph's calls under the tracer: each call is a *region* of the trace.

A region is a boundary for call sites (what it dispatches has the line of the graph's first
host read, else of its first node, rather than the compiled function's `def` line), one op row
"Torch-Compiled Region: F/C" (Kineto's name for it), and, on the simulated GPU, its outputs on
the device of its inputs and its device time modeled as one memory-bound kernel (what Inductor
fuses).

**Traced calls, then steady ones.** A region's first `calls_traced` calls with the same input
shapes are traced op by op: the ops the compiled code still dispatches (matmuls Inductor calls
out to, fallbacks, host reads it keeps) are recorded as in eager code. A compiled graph's code
is straight-line: on the same shapes it makes the same ops each call. So once those calls made
no copy and no host wait inside the region (and its inputs are plain tensors), its later calls
with those shapes are *steady*: they run with the tracer's modes off inside, and record only
the region's row (a real GPU's: the measured host time; the simulated GPU's: its own kernel,
plus the modeled host and device time of the ops inside it, as on its last traced call). The
trace counts both (`GraphRecord.traced_calls`); `calls_traced=None` traces every call.

**Compiled backwards.** AOT autograd compiles a graph's backward too, and the autograd engine
runs it (a `CompiledFunctionBackward` node), not the region: `BackwardRunner` makes each such
graph a region of its own, traced and then steady in the same way, its row named after the
node, at the `backward()` call's line.
"""

from __future__ import annotations

from sys import _getframe
from time import perf_counter_ns
from typing import Any, Callable

import torch

from ..core.compiled import GraphRecord
from .optable import OP_INFO, OpInfo, op_info
from .context import UNRESOLVED
from .sites import UNSET
from .tensors import tensor_args, tensors_out, with_kwarg_tensors

Tensor = torch.Tensor
_DisableTorchFunction = torch._C.DisableTorchFunction
_DisableTorchDispatch = torch._C._DisableTorchDispatch
#: Tensor types a steady call may hand to compiled code with the modes off: a subclass with
#: its own handlers needs them on
_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


def _plain(ins: list) -> bool:
    return all(type(t) in _PLAIN_TENSORS for t in ins)


def _on_device(marks: Any, ins: list) -> list[bool]:
    """Which of a region's tensor inputs are on the device (the simulated GPU's `marks`, or
    a real GPU's when None)."""
    if marks is None:
        return [t.is_cuda for t in ins]
    return marks.inputs(ins) if marks.refs else [False] * len(ins)


def _device_of(ins: list, dev_in: list) -> str:
    """The device a region ran on: that of its first input on the device."""
    t = ins[dev_in.index(True)]
    return f"cuda:{t.get_device()}" if t.is_cuda else "cuda:0"  # (the simulated GPU's: 0)


class RegionScope:
    """What the per-op path does with each op a compiled graph's call dispatches, while the
    thread is inside the call (`ThreadContext.region`): on the simulated GPU
    (`mark_storages`), the tensors the op reads are marked as device memory first (if they
    are not yet); with several host reads (`reads`), each op that reads the device from the
    host moves the region's site (`entry[1]`) on to the next read's line, in the graph's
    order."""

    __slots__ = ("entry", "reads", "mark_storages", "taken")

    def __init__(self, entry: list | None, reads: list | None,
                 mark_storages: Callable | None) -> None:
        self.entry, self.reads, self.mark_storages = entry, reads, mark_storages
        self.taken = 0

    def enter(self, args: tuple, kwargs: dict) -> None:
        """Before an op (with torch function handling off where it could see the reads)."""
        if self.mark_storages is not None:
            ins = tensor_args(args)
            self.mark_storages(with_kwarg_tensors(ins, kwargs) if kwargs else ins)

    def leave(self, func: Any) -> None:
        """After an op, or its error."""
        reads = self.reads
        if reads is not None and (OP_INFO.get(id(func)) or op_info(func)).sync:
            self.taken += 1
            self.entry[1] = reads[min(self.taken, len(reads) - 1)]


def enter_region(state: Any, entry: list | None, reads: list | None,
                 mark_storages: Callable | None) -> Callable[[], None]:
    """Put the thread of `state` (its ThreadContext) inside a region (RegionScope) until
    the returned function is called."""
    prev = state.region
    state.region = RegionScope(entry, reads, mark_storages)
    return lambda: setattr(state, "region", prev)


def _record_step(records: dict[int, Any], recorder: Callable, state: Any) -> Callable:
    """The thread's per-op record step (tracer/perop.py), made once per thread."""
    record = records.get(id(state))
    if record is None:
        record = records[id(state)] = recorder(state)
    return record


def _add_inside(state: Any, agg: Any, extra: tuple[int, int] | None) -> None:
    """A steady call's row takes the time its traced calls modeled for the ops inside it
    (`extra`: host ns, device ns), on the simulated GPU; so does its event."""
    timeline = state.timeline
    if extra is not None and timeline is not None and agg is not None:
        inside_host, inside_device = extra
        timeline.host_ns += inside_host
        timeline.device_ns += inside_device
        agg.add_device(inside_device, agg.launch_ns + agg.model_ns)
        state.events.extend(agg, inside_host, inside_device)


class Region:
    """One compiled graph: what its calls record, and what its traced calls taught.

    `steady` maps a key of the inputs (their shapes, None for a graph compiled for static
    shapes, whose guards fix them; and whether any is on the device: the simulated GPU's
    device tensors are host tensors to Dynamo's guards) to what a steady call adds on the
    simulated GPU: the modeled (host ns, device ns) of the ops inside, as on the last traced
    call; `quiet` counts the traced calls per key that made no copy and no wait inside;
    `noisy` is set by one that did (learn_from)."""

    __slots__ = ("record", "info", "site", "calls", "breaks_at", "dynamic", "quiet", "steady",
                 "noisy", "traced_calls")

    def __init__(self, record: GraphRecord, dynamic: bool) -> None:
        self.record = record  # (its host reads: record.host_reads)
        #: where what it dispatches is: its first host read, else its first user line
        self.site = record.host_reads[0] if record.host_reads else record.site
        self.info = OpInfo(name=record.name, short="compiled_region", kernel=True, sync=None,
                           index=False, reads=False, mixed_ok=True, flops=None,
                           pass_through=False, lone_tensor=False, call=None)
        self.calls = 0
        self.traced_calls = 0
        self.breaks_at: Any = None  # the GraphBreak this graph ends at
        self.dynamic = dynamic  # compiled for symbolic shapes: steady per input shapes
        self.quiet: dict[Any, int] = {}
        self.steady: dict[Any, tuple[int, int]] = {}
        self.noisy = False

    @staticmethod
    def shapes_key(ins: list) -> tuple:
        return tuple([t.shape for t in ins])

    @staticmethod
    def watch(state: Any) -> tuple[int, int, int]:
        """What a traced call is measured from: the copies and waits recorded so far, and
        the simulated GPU's modeled host time and queued device time."""
        timeline = state.timeline
        host, busy = (timeline.host_ns, timeline.busy_ns) if timeline is not None else (0, 0)
        return state.collector.recorded, host, busy

    def learn_from(self, state: Any, watched: tuple[int, int, int], key: Any, plain: bool,
                   calls_traced: int | None) -> None:
        """After a traced call watched from `watched` (watch): steady from now on with these
        inputs (`key`) once its last `calls_traced` calls made no copy and no wait inside
        (and its inputs were `plain` tensors); noisy for good after one that did."""
        if self.noisy or calls_traced is None:
            return
        seen, host0, busy0 = watched
        if state.collector.recorded != seen or not plain:
            self.noisy = True
            return
        timeline = state.timeline
        quiet = self.quiet[key] = self.quiet.get(key, 0) + 1
        if quiet >= calls_traced:
            self.steady[key] = ((timeline.host_ns - host0, timeline.busy_ns - busy0)
                                if timeline is not None else (0, 0))


class RegionRunner:
    """Runs one compiled graph as a region of the thread's trace (see the module's text).

    `state_here()`: the calling thread's ThreadContext; `recorder(state)`: its per-op record
    step (tracer/perop.py); `sim`: the simulated GPU or None; `calls_traced`: traced calls per
    input shapes before a quiet region goes steady (None: all)."""

    def __init__(self, region: Region, compiled: Callable, state_here: Callable,
                 recorder: Callable, sim: Any, calls_traced: int | None) -> None:
        self.region, self.compiled = region, compiled
        self.state_here, self.recorder, self.sim = state_here, recorder, sim
        self.marks = sim.cuda_marks if sim is not None else None
        self.calls_traced = calls_traced
        self._records: dict[int, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = self.state_here()
        if state is None or state.suspended:
            return self.compiled(*args, **kwargs)
        region, marks = self.region, self.marks
        region.calls += 1
        disabled = _DisableTorchFunction()  # the tracer's own reads: not the program's
        disabled.__enter__()
        try:
            ins = [a for a in args if isinstance(a, Tensor)]
            dev_in = _on_device(marks, ins)
            key = (region.shapes_key(ins) if region.dynamic else None, True in dev_in)
            extra = region.steady.get(key) if region.steady else None
            if extra is not None:  # a steady call: the ops inside untraced
                with _DisableTorchDispatch():
                    t0 = perf_counter_ns()
                    out = self.compiled(*args, **kwargs)
                    host_ns = perf_counter_ns() - t0
                return self._finish(state, args, kwargs, ins, dev_in, out, host_ns, extra, None)
        finally:
            disabled.__exit__(None, None, None)
        return self._traced(state, args, kwargs, ins, dev_in, key)

    def _traced(self, state: Any, args: tuple, kwargs: dict, ins: list, dev_in: list,
                key: Any) -> Any:
        """A call traced op by op."""
        region, marks = self.region, self.marks
        region.traced_calls += 1
        any_dev = True in dev_in
        calls = state.sites.calls
        entry = [_getframe(0), UNSET if region.site is None else region.site]
        calls.append(entry)
        reads = region.record.host_reads
        mark = any_dev and marks is not None  # what the region still dispatches may
        walk = len(reads) > 1  # touch buffers Inductor made on the host (on a GPU,
        # device memory); a region with several host reads has each at its own line
        put_back = enter_region(state, entry, reads if walk else None,
                                marks.mark_outputs if mark else None) if mark or walk else None
        watched = region.watch(state)
        t0 = perf_counter_ns()
        try:
            out = self.compiled(*args, **kwargs)
        finally:
            calls.pop()
            if put_back is not None:
                put_back()
        host_ns = perf_counter_ns() - t0
        region.learn_from(state, watched, key, _plain(ins), self.calls_traced)
        with _DisableTorchFunction():
            return self._finish(state, args, kwargs, ins, dev_in, out, host_ns, None, entry)

    def _finish(self, state: Any, args: tuple, kwargs: dict, ins: list, dev_in: list,
                out: Any, host_ns: int, extra: tuple[int, int] | None,
                entry: list | None) -> Any:
        """Record the region's row (torch function handling off): its outputs, on the
        simulated GPU marked where its inputs are, and, for a steady call (`extra`), the time
        of the ops inside it."""
        region, marks = self.region, self.marks
        any_dev = True in dev_in
        outs = [out] if isinstance(out, Tensor) else tensors_out(out)
        if any_dev and marks is not None:  # the artifact ran on the host: its new outputs
            marks.mark_outputs(outs)  # live where its inputs do
        record = _record_step(self._records, self.recorder, state)
        device = _device_of(ins, dev_in) if any_dev else "cpu"
        site = region.site
        if site is None:  # a graph of torch's own code (a compiled nn.Sequential): the
            if entry is not None and entry[1] is not UNSET:  # caller's line
                site = entry[1]
            else:
                site = state.sites.resolve_from(_getframe(2))
            if region.record.site is None:
                region.record.site = site
        agg = record(region.info, args, kwargs, ins, out, outs, dev_in, any_dev, device, site,
                     host_ns)
        _add_inside(state, agg, extra)
        return out


class BackwardRunner:
    """Runs one compiled backward graph (AOT autograd's, called by the autograd engine for a
    CompiledFunctionBackward node) as a region, as RegionRunner does a forward: traced op by
    op, then steady once its traced calls with the same input shapes were quiet. Its row is
    the node's name, at the backward() call's line. The compiled backward frees its inputs as
    it goes (AOT hands it their list to empty), so nothing here holds them during the call:
    its row has no reads, only the gradients it writes."""

    def __init__(self, region: Region, state_here: Callable, recorder: Callable, sim: Any,
                 calls_traced: int | None) -> None:
        self.region, self.state_here, self.recorder = region, state_here, recorder
        self.marks = sim.cuda_marks if sim is not None else None
        self.calls_traced = calls_traced
        self._records: dict[int, Any] = {}

    def __call__(self, state: Any, call: Callable, f: Any, args: list, rest: tuple,
                 kwargs: dict) -> Any:
        region, marks = self.region, self.marks
        region.calls += 1
        with _DisableTorchFunction():
            ins = [a for a in args if isinstance(a, Tensor)]
            dev_in = _on_device(marks, ins)
            any_dev = True in dev_in
            device = _device_of(ins, dev_in) if any_dev else "cpu"
            key = (region.shapes_key(ins), any_dev)
            plain = _plain(ins)
            del ins
        extra = region.steady.get(key) if region.steady else None
        if extra is not None:  # a steady call: the ops inside untraced
            with _DisableTorchFunction(), _DisableTorchDispatch():
                t0 = perf_counter_ns()
                out = call(f, args, *rest, **kwargs)
                host_ns = perf_counter_ns() - t0
            return self._finish(state, out, any_dev, device, host_ns, extra)
        region.traced_calls += 1
        watched = region.watch(state)
        put_back = (enter_region(state, None, None, marks.mark_outputs)
                    if any_dev and marks is not None else None)
        t0 = perf_counter_ns()
        try:
            out = call(f, args, *rest, **kwargs)
        finally:
            if put_back is not None:
                put_back()
        host_ns = perf_counter_ns() - t0
        region.learn_from(state, watched, key, plain, self.calls_traced)
        return self._finish(state, out, any_dev, device, host_ns, None)

    def _finish(self, state: Any, out: Any, any_dev: bool, device: str, host_ns: int,
                extra: tuple[int, int] | None) -> Any:
        """Record the node's row: the gradients it wrote, on the simulated GPU marked where
        its inputs were, and, for a steady call (`extra`), the time of the ops inside it."""
        with _DisableTorchFunction():
            outs = tensors_out(out)
            if any_dev and self.marks is not None:
                self.marks.mark_outputs(outs)
            record = _record_step(self._records, self.recorder, state)
            site = state.backward_site  # the backward() call's line, set as it began
            if site is UNRESOLVED:
                site = state.here()
            agg = record(self.region.info, (), {}, [], out, outs, [], any_dev, device, site,
                         host_ns)
            _add_inside(state, agg, extra)
        return out

