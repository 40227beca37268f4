"""Aggregation as the program runs: per op and site, per copy path, per wait site.

The collector is what the run's event record (tracer/events.py) fills for every event; the
per-op path fills an op's aggregate itself, inline (tracer/perop.py).

Nothing here holds a user tensor. Which op made each live tensor is in a ProducerTable
(tracer/producers.py: weak references, stale entries swept as it fills, no callback on every
free). Copies awaiting their consumer are rare and keep a callback, which finishes the copy
when its destination is freed unread.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..core.defaults import OP_TIMES_FOLD_AT
from ..core.trace import (CopyRecord, EventRow, FlowRecord, OpRecord, OpRef, Site, WaitRecord,
                          copy_event_name)
from .producers import ProducerTable


class EventAgg:
    """One Event Summary row being filled."""

    __slots__ = ("calls", "cpu_ns", "gpu_ns", "min_ns", "max_ns")

    def __init__(self) -> None:
        self.calls = 0
        self.cpu_ns = 0
        self.gpu_ns = 0
        self.min_ns = -1
        self.max_ns = 0

    def add(self, cpu_ns: int, gpu_ns: int) -> None:
        self.calls += 1
        self.cpu_ns += cpu_ns
        self.gpu_ns += gpu_ns
        self.span(cpu_ns + gpu_ns)

    def span(self, total: int) -> None:
        if self.min_ns < 0 or total < self.min_ns:
            self.min_ns = total
        if total > self.max_ns:
            self.max_ns = total


#: OpAgg.min_ns before the first call.
NO_CALL_YET = 1 << 62


class OpAgg:
    """One (op, device, site) being filled; `ref` is what copies name as producer/consumer.

    The per-op path (tracer/perop.py) updates the counters in place; the Event
    Summary row of the op is folded from its OpAggs at the end. `flows_in` holds, by the
    producing OpAgg (hashed by identity), the op graph's edges into this op: [reads, bytes]
    (filled by ProducerTable.read). A call whose time is the host's lands in `times` first,
    a simulated kernel's device time in `kernel_times` (see `fold`): appending is cheaper
    than updating five counters per call.
    """

    __slots__ = ("ref", "event", "thread", "calls", "host_ns", "device_ns", "run_ns", "flops",
                 "bytes", "min_ns", "max_ns", "flows_in", "times", "kernel_times", "launch_ns",
                 "model_bytes", "model_flops", "model_dtype", "model_ns",
                 "model_host_ns")

    #: the length at which the per-op path folds `times` or `kernel_times`
    FOLD_AT = OP_TIMES_FOLD_AT

    def __init__(self, ref: OpRef, event: EventAgg, thread: str | None = None) -> None:
        self.ref = ref
        self.event = event
        self.thread = thread
        self.calls = 0
        self.host_ns = 0
        self.device_ns = 0
        self.run_ns = 0
        self.flops = 0
        self.bytes = 0
        self.min_ns = NO_CALL_YET  # above any call's time: the per-op path compares once
        self.max_ns = 0
        self.flows_in: dict[OpAgg, list[int]] = {}
        #: host times (ns) of calls without device time, not yet in the counters
        self.times: list[int] = []
        #: modeled device times (ns) of simulated kernels, not yet in the counters; each
        #: such call cost the host `launch_ns` (what it would cost on the host, modeled, is
        #: added to run_ns as it happens)
        self.kernel_times: list[int] = []
        self.launch_ns = 0
        #: the bytes, FLOPs and dtype class of the last simulated call, and its modeled
        #: times (a kernel's on the device and on the host; a host op's on the host): the
        #: calls of one op at one line most often repeat them, and the per-op path then
        #: reuses the times rather than calling the cost model again (a pure function)
        self.model_bytes = self.model_flops = -1
        self.model_dtype: str | None = None
        self.model_ns = self.model_host_ns = 0

    def fold(self) -> None:
        """Add the calls in `times` and `kernel_times` to the counters."""
        times = self.times
        if times:
            total = sum(times)
            self.calls += len(times)
            self.host_ns += total
            self.run_ns += total
            self._span(min(times), max(times))
            times.clear()
        kernels = self.kernel_times
        if kernels:
            launch = self.launch_ns
            self.calls += len(kernels)
            self.host_ns += launch * len(kernels)
            self.device_ns += sum(kernels)
            self._span(launch + min(kernels), launch + max(kernels))
            kernels.clear()

    def _span(self, shortest: int, longest: int) -> None:
        if shortest < self.min_ns:
            self.min_ns = shortest
        if longest > self.max_ns:
            self.max_ns = longest

    def add_device(self, ns: int, host_ns: int) -> None:
        """Device time measured after the call (real GPU): lands on the op and its row."""
        self.device_ns += ns
        self._span(host_ns + ns, host_ns + ns)


class CopyAgg:
    """One copy path being filled. `path` is what it is a path of: (direction, sync, pinned,
    trigger, site, producer, thread, non_blocking, consumer); the collector files it under the
    ids of those objects (hashing a Site or an OpRef runs Python code) and merges equal paths
    at the end."""

    __slots__ = ("path", "calls", "bytes", "host_ns", "device_ns", "stack", "shape", "dtype",
                 "first_ns", "last_ns", "end_col")

    def __init__(self, path: tuple, stack: list[Site], shape: list[int] | None,
                 dtype: str | None, at_ns: int, end_col: int | None) -> None:
        self.path = path
        self.first_ns = self.last_ns = at_ns  # when its first and last calls were made
        self.end_col = end_col  # where the call that made it ends on its site's line
        self.calls = 0
        self.bytes = 0
        self.host_ns = 0
        self.device_ns = 0
        self.stack = stack
        self.shape = shape
        self.dtype = dtype


    def merged(self, other: CopyAgg) -> CopyAgg:
        """A new aggregate of this path's calls and `other`'s (the same path): the first
        call's stack, shape and place on the line, and both's counts."""
        first = self if self.first_ns <= other.first_ns else other
        out = CopyAgg(self.path, first.stack, first.shape, first.dtype, first.first_ns,
                      first.end_col)
        out.last_ns = max(self.last_ns, other.last_ns)
        out.calls = self.calls + other.calls
        out.bytes = self.bytes + other.bytes
        out.host_ns = self.host_ns + other.host_ns
        out.device_ns = self.device_ns + other.device_ns
        return out


class PendingCopy:
    """A copy whose destination tensor has not been read yet (its consumer is unknown)."""

    __slots__ = ("key", "path", "nbytes", "host_ns", "device_ns", "stack", "shape", "dtype",
                 "agg", "event", "holders", "at_ns", "end_col")

    def __init__(self, key: tuple, path: tuple, nbytes: int, host_ns: int, device_ns: int,
                 stack: list[Site], shape: list[int] | None, dtype: str | None,
                 event: EventAgg, at_ns: int, end_col: int | None = None) -> None:
        self.at_ns = at_ns  # when it was made (the host's clock from the run's start)
        self.end_col = end_col
        self.key = key  # the path's key: its objects by id (see CopyAgg)
        # (direction, sync, pinned, trigger, site, producer, thread, non_blocking)
        self.path = path
        self.nbytes = nbytes
        self.host_ns = host_ns
        self.device_ns = device_ns
        self.stack = stack
        self.shape = shape
        self.dtype = dtype
        self.agg: CopyAgg | None = None  # set once the consumer is known
        self.event = event
        self.holders = 0  # live tensors holding the destination (see rebind) awaiting a reader

    def add_device(self, ns: int, host_ns: int) -> None:
        """Device time measured after the call (real GPU async copies and peer copies)."""
        self.event.gpu_ns += ns
        self.event.span(host_ns + ns)
        if self.agg is not None:
            self.agg.device_ns += ns
        else:
            self.device_ns += ns


@dataclass(frozen=True)
class CopyEvent:
    """One copy, as listeners (transfer_guard, the pytest plugin) see it when it happens."""

    direction: str
    sync: bool
    pinned: bool | None
    trigger: str
    nbytes: int
    site: Site | None
    producer: OpRef | None
    shape: list[int] | None
    dtype: str | None
    non_blocking: bool | None = None  # whether the call asked non_blocking=True


class Collector:
    """The aggregated record of one traced run."""

    def __init__(self) -> None:
        self.events: dict[str, EventAgg] = {}
        self.op_events: dict[str, EventAgg] = {}  # the rows folded from `ops` at the end
        #: by (op name, device, id of the interned Site, thread or None)
        self.ops: dict[tuple[str, str, int, str | None], OpAgg] = {}
        #: by the ids of the path's objects (see CopyAgg); merged by value in copy_records
        self.copies: dict[tuple, CopyAgg] = {}
        self.waits: dict[tuple[str, Site | None, str | None], list[int]] = {}
        #: live tensor -> the OpAgg that made its data (and its size, when known)
        self.producers = ProducerTable()
        #: id(tensor) -> (weak reference, the copy into it awaiting its first reader)
        self.pending: dict[int, tuple[weakref.KeyedRef, PendingCopy]] = {}
        #: copies and host waits recorded so far (a compiled region reads it around a call)
        self.recorded = 0
        self._index: tuple[dict, dict, dict] | None = None  # record_index's, once finished

    # ----- ops -----
    def new_op(self, key: tuple[str, str, int, str | None], name: str, device: str,
               site: Site | None, launch_ns: int = 0) -> OpAgg:
        """The aggregate of an op first seen at `key`: (name, device, id(site), thread),
        whose simulated kernels cost the host `launch_ns` each. The per-op path
        (tracer/perop.py) looks aggregates up and updates them itself."""
        event = self.op_events.get(name)
        if event is None:
            event = self.op_events[name] = self.events[name] = EventAgg()
        agg = self.ops[key] = OpAgg(OpRef(name, device, site), event, key[3])
        agg.launch_ns = launch_ns
        return agg

    # ----- producers -----
    def set_producer(self, t: torch.Tensor, agg: OpAgg) -> None:
        self.producers.write((t,), agg, False)

    def producer_agg(self, t: torch.Tensor) -> OpAgg | None:
        return self.producers.get(t)

    def producer_of(self, t: torch.Tensor) -> OpRef | None:
        """The op that made t's data, as copies name it."""
        agg = self.producers.get(t)
        return agg.ref if agg is not None else None

    def inherit_producer(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst holds src's data (a copy of it, or src itself rebound): src's producer, or
        none if src has none (not the op that made dst's data before)."""
        agg = self.producer_agg(src)
        if agg is not None:
            self.set_producer(dst, agg)
        else:
            self.producers.forget(dst)

    # ----- copies -----
    def copy(self, *, direction: str, sync: bool, pinned: bool | None, trigger: str,
             nbytes: int, host_ns: int, device_ns: int, site: Site | None,
             stack: list[Site], producer: OpRef | None, dst: torch.Tensor | None,
             shape: list[int] | None = None, dtype: str | None = None,
             thread: str | None = None, at_ns: int = 0,
             end_col: int | None = None, non_blocking: bool | None = None) -> PendingCopy:
        """Record one copy (made in `thread`, None for the tracing thread, at `at_ns` on the
        host's clock; `non_blocking`: whether the call asked it, None where not known). With
        `dst`, it waits for the first op that reads dst."""
        self.recorded += 1
        name = copy_event_name(direction, sync)
        event = self.events.get(name)
        if event is None:
            event = self.events[name] = EventAgg()
        event.add(host_ns, device_ns)
        # the objects that live as long as the run, by id: equal values are merged at the end
        # (the stack too: a library's line reached from two lines of the user's code is two
        # paths, each with its caller; SiteResolver.stack_at gives each caller its own list,
        # whose value joins the path's at the end: `_by_value`)
        key = (direction, sync, pinned, trigger, id(site), id(producer), thread, non_blocking,
               id(stack))
        pending = PendingCopy(key, (direction, sync, pinned, trigger, site, producer, thread,
                                    non_blocking),
                              nbytes, host_ns, device_ns, stack, shape, dtype, event, at_ns,
                              end_col)
        if dst is None:
            self._finish(pending, None)
        else:
            self._hold(dst, pending)
        return pending

    def _hold(self, t: torch.Tensor, pending: PendingCopy) -> None:
        k = id(t)
        old = self.pending.get(k)
        if old is not None:  # a second copy into the same tensor before any op read it
            old[1].holders -= 1
            if old[1].holders == 0 and old[1].agg is None:
                self._finish(old[1], None)
        self.pending[k] = (weakref.KeyedRef(t, self._drop_pending, k), pending)
        pending.holders += 1

    def _drop_pending(self, ref: weakref.KeyedRef) -> None:
        entry = self.pending.get(ref.key)
        if entry is not None and entry[0] is ref:
            del self.pending[ref.key]
            pending = entry[1]
            pending.holders -= 1
            if pending.holders == 0 and pending.agg is None:
                self._finish(pending, None)  # freed before any op read it

    def _pending_of(self, t: torch.Tensor) -> PendingCopy | None:
        entry = self.pending.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        return None

    def consume(self, t: torch.Tensor, consumer: OpRef) -> None:
        """`consumer` read t: if t holds a copy's destination, that copy's consumer is found."""
        pending = self._pending_of(t)
        if pending is not None:
            del self.pending[id(t)]
            pending.holders -= 1
            if pending.agg is None:
                self._finish(pending, consumer)

    def rebind(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """`new.data = old`: new now holds old's data, so it inherits old's producer and the
        copy waiting for a consumer (Module.to() moves parameters this way)."""
        self.inherit_producer(new, old)
        entry = self.pending.get(id(old))
        if entry is not None and entry[0]() is old:
            del self.pending[id(old)]
            entry[1].holders -= 1
            self._hold(new, entry[1])

    def _finish(self, p: PendingCopy, consumer: OpRef | None) -> None:
        key = p.key + (id(consumer),)
        agg = self.copies.get(key)
        if agg is None:  # (the CopyAgg keeps the path's objects, and so their ids, alive)
            agg = self.copies[key] = CopyAgg(p.path + (consumer,), p.stack, p.shape, p.dtype,
                                             p.at_ns, p.end_col)
        agg.last_ns = p.at_ns
        agg.calls += 1
        agg.bytes += p.nbytes
        agg.host_ns += p.host_ns
        agg.device_ns += p.device_ns
        p.agg = agg

    # ----- waits -----
    def wait(self, kind: str, site: Site | None, wait_ns: int,
             thread: str | None = None) -> None:
        self.recorded += 1
        entry = self.waits.get((kind, site, thread))
        if entry is None:
            entry = self.waits[(kind, site, thread)] = [0, 0]
        entry[0] += 1
        entry[1] += wait_ns
        event = self.events.get(f"HostWait:{kind}")
        if event is None:
            event = self.events[f"HostWait:{kind}"] = EventAgg()
        event.add(wait_ns, 0)

    # ----- results -----
    def finish(self) -> None:
        """Copies never read by an op before the end get a null consumer; every op's calls
        are in its counters."""
        for agg in self.ops.values():
            agg.fold()
        for _, pending in list(self.pending.values()):
            if pending.agg is None:
                self._finish(pending, None)
        self.pending.clear()
        self.producers.clear()

    def event_rows(self) -> list[EventRow]:
        for e in self.op_events.values():  # fold the ops into their rows afresh
            e.calls = e.cpu_ns = e.gpu_ns = e.max_ns = 0
            e.min_ns = -1
        for a in self.ops.values():
            if a.calls:
                e = a.event
                e.calls += a.calls
                e.cpu_ns += a.host_ns
                e.gpu_ns += a.device_ns
                e.span(a.min_ns)
                e.span(a.max_ns)
        return [EventRow(name, e.calls, e.cpu_ns, e.gpu_ns, max(e.min_ns, 0), e.max_ns)
                for name, e in self.events.items() if e.calls]

    def op_records(self) -> list[OpRecord]:
        return [OpRecord(a.ref.op, a.ref.device, a.ref.site, a.calls, a.host_ns, a.device_ns,
                         a.run_ns, a.flops, a.bytes, a.thread)
                for a in self.ops.values() if a.calls]

    def flow_records(self) -> list[FlowRecord]:
        return [FlowRecord(p.ref, c.ref, reads, nbytes)
                for c in self.ops.values() for p, (reads, nbytes) in c.flows_in.items()]

    def copy_records(self) -> list[CopyRecord]:
        paths: dict[tuple, CopyAgg] = {}  # equal paths filed apart (equal, distinct objects)
        for a in self.copies.values():
            value = _by_value(a)
            into = paths.setdefault(value, a)
            if into is not a:
                into = paths[value] = into.merged(a)
        out = []
        for a in paths.values():
            (direction, sync, pinned, trigger, site, producer, thread, non_blocking,
             consumer) = a.path
            out.append(CopyRecord(direction, sync, pinned, trigger, a.calls, a.bytes,
                                  a.host_ns, a.device_ns, site, a.stack, producer, consumer,
                                  a.shape, a.dtype, thread, a.first_ns, a.last_ns,
                                  a.end_col, non_blocking))
        return out

    def wait_records(self) -> list[WaitRecord]:
        return [WaitRecord(kind, calls, ns, site, thread)
                for (kind, site, thread), (calls, ns) in self.waits.items()]

    def record_index(self, kind: str, handle: object) -> int | None:
        """Where an event's aggregate (`handle`, tracer/events.py) is in the records made
        after `finish`: op_records, copy_records, wait_records, by `kind`."""
        if self._index is None:
            ops = [a for a in self.ops.values() if a.calls]
            paths = dict.fromkeys(_by_value(a) for a in self.copies.values())
            self._index = ({id(a): i for i, a in enumerate(ops)},
                           {path: i for i, path in enumerate(paths)},
                           {key: i for i, key in enumerate(self.waits)})
        ops, copies, waits = self._index
        if kind == "op":  # (an op's event names its OpAgg by id)
            return ops.get(handle)
        if kind == "copy":
            return copies.get(_by_value(handle.agg)) if handle.agg is not None else None
        return waits.get(handle)


def _by_value(agg: CopyAgg) -> tuple:
    """What a copy path is by value, to merge equal paths filed apart (equal, distinct
    objects): its path, and its stack (a library copy's caller makes a path of its own)."""
    return agg.path, tuple(agg.stack)
