"""torch.profiler (Kineto) traces read as memcpy-doctor traces: the copies a real GPU made,
measured, from the Chrome-trace JSON (`.json` or `.json.gz`) torch.profiler writes.

What maps, and from where (docs/kineto.md has the table):
- a copy: each `gpu_memcpy` event ("Memcpy HtoD (Pageable -> Device)", ...): direction,
  pinned or pageable, bytes (`args.bytes`), device time; the `cuda_runtime` call with the same
  `correlation` gives the host thread and host time;
- sync or async: the host waited when the call is a blocking `cudaMemcpy`, or when a
  `cudaStreamSynchronize` follows the launch inside the same enclosing op (PyTorch's
  memcpy_and_sync); the wait's time is the copy's host time too;
- the trigger: the ops enclosing the call (`aten::item` -> item, `aten::to` -> to,
  `aten::copy_` -> copy_, else the innermost op's name);
- waits: `cudaStreamSynchronize`, `cudaDeviceSynchronize`, `cudaEventSynchronize` that are
  not a copy's;
- the Event Summary: each `cpu_op` name, its host time, and the device time of the kernels
  and copies launched inside it (by correlation);
- the total: the span of the trace's events;
- sites (stacks.py): the Python frames around the call, when the profile was recorded
  with `with_stack=True`; a frame names its function's first line, not the line in it;
- producer and consumer, inferred: the op whose kernel ran last on the copy's stream before
  it (device data), and the op around the trigger (`aten::index` around `aten::nonzero`) or,
  for an upload, the op whose kernel ran next on the stream;
- producer and consumer, exact (et.py): given an execution trace of the same run, the
  op that wrote the copied tensor and the op that read the copy, by tensor ids; the copies
  it does not cover keep the inferred ones.
Not mapped: one trace per rank of a file holding several ranks (torch.profiler writes one
file per rank).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .et import EtJoin, EtNodes, ExecutionTrace, parse_execution_trace
from .idle import DeviceIdle
from .events import KERNEL, OP, RUNTIME, Event, Events, as_events, one_line
from .stacks import enclosing
from .stream import read_array, read_json, read_whole
from ..core.defaults import LAUNCHES_NOTE, NO_STACK_NOTE, UNKNOWN_DIRECTION, UNRECORDED_DEVICE
from ..core.summary import summarize
from ..core.trace import (CopyRecord, EventRow, Meta, OpRef, Site, Trace, TraceError, WaitRecord,
                    copy_event_name)

#: "Memcpy HtoD (Pageable -> Device)": direction, and whether the host side is pinned.
_KINDS = {"HtoD": "HtoD", "DtoH": "DtoH", "DtoD": "DtoD"}
_WAITS = {"cudaStreamSynchronize": "stream_synchronize", "cudaDeviceSynchronize": "synchronize",
          "cudaEventSynchronize": "event_synchronize"}
_SCALAR_READ = "aten::_local_scalar_dense"
#: What an imported trace cannot tell, as the report's "Not traced" line says it.
INFERRED_NOTE = ("producers and consumers are inferred, not read from tensor ids: a copy's "
                 "producer is the op whose kernel ran last before it on its stream, its "
                 "consumer the op around its trigger; an upload's consumer is not guessed "
                 "(the next kernel on its stream need not read it)")
#: The direction of a copy whose trigger tells it, where only its launch is recorded.
_LAUNCH_DIRECTIONS = {"item": "DtoH", "tolist": "DtoH", "nonzero": "DtoH"}
SITES_NOTE = ("call sites name the function that made each copy, at its first line "
              "(torch.profiler records Python functions, not lines)")
#: Enclosing ops that name a copy's trigger, outermost meaning first.
_TRIGGERS = (("aten::item", "item"), ("aten::tolist", "tolist"), ("aten::nonzero", "nonzero"),
             ("aten::to", "to"), ("aten::_to_copy", "to"), ("aten::copy_", "copy_"))


def is_kineto(data: Any) -> bool:
    """Whether parsed JSON is a torch.profiler trace (by its content, not its file name)."""
    return (isinstance(data, dict) and isinstance(data.get("traceEvents"), (list, Events))
            and "schema_version" not in data)


def read_execution_trace(path: str) -> ExecutionTrace:
    """The execution trace (ExecutionTraceObserver's `.json` or `.json.gz`) at `path`, its
    nodes read as they are parsed where the stream can (kineto/stream.py), else parsed whole;
    TraceError, one line, when it cannot be read, is not one, or holds no tensor ids."""
    nodes = EtNodes()
    members = read_array(path, "nodes", nodes)
    if members is None:
        return parse_execution_trace(read_whole(path, "an execution trace"), path)
    return nodes.trace(members, path)


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def _trigger(ops: list[Event]) -> tuple[str, int]:
    """The copy's trigger, and the index in `ops` of the op that names it (-1: none)."""
    names = [o.name or "" for o in ops]
    for op, trigger in _TRIGGERS:
        if op in names:
            return trigger, names.index(op)
    return (names[-1].replace("aten::", ""), len(names) - 1) if names else ("memcpy", -1)


def _direction(name: str) -> str | None:
    if "PtoP" in name:  # a peer copy between two GPUs: our DtoD
        return "DtoD"
    return next((d for k, d in _KINDS.items() if k in name), None)


def kineto_pid(data: dict) -> int | None:
    """The process a torch.profiler trace recorded: the pid most of its cpu_ops have."""
    events = as_events(data.get("traceEvents", []))
    pids: Counter[Any] = Counter()
    for th, n in events.query(f"SELECT th, count(*) FROM ev WHERE k = {OP} GROUP BY th "
                              "ORDER BY min(id)"):
        pids[events.threads[th][0]] += n
    pid = pids.most_common(1)[0][0] if pids else None
    return pid if type(pid) is int else None


def from_kineto(data: dict, source: str, et: ExecutionTrace | None = None) -> Trace:
    """The memcpy-doctor trace of a parsed torch.profiler trace (see the module docstring);
    with `et`, an execution trace of the same run, producers and consumers by data flow."""
    events = as_events(data["traceEvents"])
    cats = events.cats
    if not cats & {"cuda_runtime", "gpu_memcpy", "kernel"}:
        raise TraceError(f"{source}: a Chrome or torch.profiler trace with no CUDA activity "
                         "(CPU only, or another accelerator): no copies to read")
    launches_only = not cats & {"gpu_memcpy", "kernel", "gpu_memset"}
    events.check()
    found = enclosing(events)
    flow = EtJoin(et, events, found, source) if et is not None else None
    waits = _Waits(events)
    device_in_op = _DeviceInOp(events)
    copies = _Copies(events.start)
    idle = DeviceIdle(events)
    unpaired = 0  # scalar reads with no stream sync: PyTorch makes one, the trace lost it
    for around in (found.launches if launches_only else found.copies)(waits.stream_sync):
        e, call, ops = around.copy, around.call, around.ops
        if e is None:  # a launch alone: the op may tell the direction, nothing the rest
            direction, pinned = _LAUNCH_DIRECTIONS.get(_trigger(ops)[0], UNKNOWN_DIRECTION), None
        else:
            direction = _direction(e.name or "")
            if direction is None:
                copies.unread(e.name or "")
                continue
            pinned = None if direction == "DtoD" else "Pinned" in e.name
        host_ns, sync = 0, False
        if call is not None:
            host_ns, sync = _ns(call.dur), call.name == "cudaMemcpy"
        if call is not None and not sync:  # memcpy_and_sync: a stream sync in the same op
            if around.wait is not None:
                sync, host_ns = True, host_ns + around.wait_ns
                waits.use(around.wait)
            elif not waits.recorded and ops and ops[-1].name == _SCALAR_READ:
                sync, unpaired = True, unpaired + 1
        if call is not None and pinned is False:  # pageable memory: CUDA returns from
            sync = True  # cudaMemcpyAsync once a copy into it is done, or one from it is
            # staged, the host blocked all the while (docs/cuda-semantics.md)
        trigger, at = _trigger(ops)
        sites = around.sites
        site = sites[0] if sites else None
        producer = found.inferred(around.before) if direction != "HtoD" else None
        consumer = _consumer(ops, at, site, device_in_op) if at > 0 else None
        exact = flow.ends(ops, at, direction) if flow is not None else None
        if exact is not None:  # by data flow, where the execution trace shows it
            producer, consumer = exact[0] or producer, exact[1] or consumer
        key = (direction, sync, pinned, trigger, site, tuple(sites), producer, consumer)
        copies.add(key, e, call, host_ns)
        if sync:
            if e is not None and call is not None:  # blocked from its launch to its return
                returned = (call.ts + call.dur if around.wait is None
                            else events.end_of(around.wait))
                idle.claim(call.ts, returned, ("copy", key), e.id)
    waits.claim_idle(idle)
    idle_ns = idle.totals() if not launches_only else None  # (none measured without them)
    records = copies.records(idle_ns)
    wait_records = waits.records(idle_ns)
    rows = _event_rows(events, device_in_op, records, copies.per_call, wait_records,
                       waits.extremes)
    meta = _meta(data, source, found.has_python, unpaired, events.start)
    if flow is not None:
        meta.untraced[0] = et_note(flow.joined, flow.linked, sum(c.calls for c in records),
                                   et.source)
    if launches_only:
        meta.untraced.insert(0, LAUNCHES_NOTE)
    if copies.unread_count:
        meta.untraced.append(f"{copies.unread_count} gpu_memcpy events of a kind this version "
                             f"does not read (such as {copies.unread_name!r}; HtoH, or another "
                             "vendor's)")
    start, end = events.start, events.end
    return Trace(meta, summarize(_ns(end - start), rows, records), rows, [], records,
                 wait_records)


class _Copies:
    """The copies read so far, summed per key (direction, sync, pinned, trigger, site, stack,
    producer, consumer): calls, bytes, host and device time, first and last start; per
    (direction, sync), the shortest and longest call (`per_call`); and the gpu_memcpy events
    of a kind this version does not read (a count and the first name)."""

    def __init__(self, start: float) -> None:
        self._start = start
        self._by_key: dict[tuple, list] = {}
        self.per_call: dict[tuple, list[int]] = {}  # (direction, sync) -> [min, max]
        self.unread_count, self.unread_name = 0, ""

    def unread(self, name: str) -> None:
        if not self.unread_count:
            self.unread_name = name
        self.unread_count += 1

    def add(self, key: tuple, e: Event | None, call: Event | None, host_ns: int) -> None:
        entry = self._by_key.setdefault(key, [0, 0, 0, 0, None, None])
        device_ns = _ns(e.dur) if e is not None else 0
        entry[0] += 1
        entry[1] += int(e.nbytes if e is not None and e.nbytes is not None else 0)
        entry[2] += host_ns
        entry[3] += device_ns
        when = _ns((call or e).ts - self._start)
        entry[4] = when if entry[4] is None else min(entry[4], when)
        entry[5] = when if entry[5] is None else max(entry[5], when)
        took = host_ns + device_ns
        span = self.per_call.setdefault(key[:2], [took, took])
        span[0], span[1] = min(span[0], took), max(span[1], took)

    def records(self, idle: dict | None) -> list[CopyRecord]:
        """The records; a sync one with the device's idle time after it (`idle`, per
        ("copy", key): kineto/idle.py; None: not measured)."""
        return [CopyRecord(*key[:4], calls, nbytes, host, dev, key[4], list(key[5]), *key[6:],
                           first_ns=first, last_ns=last,
                           idle_ns=idle.get(("copy", key), 0) if key[1] and idle is not None
                           else None)
                for key, (calls, nbytes, host, dev, first, last) in self._by_key.items()]


class _Waits:
    """The host's waits (`cudaStreamSynchronize`, `cudaDeviceSynchronize`,
    `cudaEventSynchronize` calls): those that follow a copy's call inside its op are the
    copy's (`use`), the rest are counted per kind. `recorded`: whether the trace holds any
    stream sync (a sampled trace may hold none)."""

    def __init__(self, events: Events) -> None:
        self._events = events
        self.stream_sync = events.name_id("cudaStreamSynchronize")
        self._kinds = {events.name_id(n): kind for n, kind in _WAITS.items()}
        self._used: list[tuple[int]] = []  # waits found to be copies', not yet written
        #: kind -> the shortest and longest of its waits (the Event Summary's Min. and Max.)
        self.extremes: dict[str, tuple[int, int]] = {}
        events.query("CREATE TEMP TABLE IF NOT EXISTS used (id INTEGER PRIMARY KEY)")
        self.recorded = events.query(
            f"SELECT 1 FROM ev WHERE k = {RUNTIME} AND name = ? LIMIT 1",
            (self.stream_sync,)).fetchone() is not None

    def use(self, wait: int) -> None:
        """Mark the wait numbered `wait` as a copy's (stacks.Around.wait)."""
        self._used.append((wait,))
        if len(self._used) >= 4096:
            self._flush()

    def _flush(self) -> None:
        self._events.db.executemany("INSERT OR IGNORE INTO used VALUES (?)", self._used)
        self._used.clear()

    def _unused(self, columns: str, tail: str) -> Any:
        """`columns` of the waits that are not a copy's, `tail` (GROUP BY, ORDER BY) after."""
        self._flush()
        marks = ",".join("?" * len(self._kinds))
        return self._events.query(
            f"SELECT {columns} FROM ev WHERE k = {RUNTIME} AND name IN ({marks}) "
            f"AND id NOT IN (SELECT id FROM used) {tail}", list(self._kinds))

    def claim_idle(self, idle: DeviceIdle) -> None:
        """Each wait that is not a copy's claims the device's idle time after it (every
        stream), named ("wait", its kind)."""
        for name, began, end in self._unused("name, ts, ts + dur", "ORDER BY ts"):
            idle.claim(began, end, ("wait", self._kinds[name]))

    def records(self, idle: dict | None) -> list[WaitRecord]:
        """The waits that are not a copy's, per kind (in the order each kind first comes),
        each with the device's idle time after them (`idle`, per ("wait", kind))."""
        out = []
        for name, calls, ns, lo, hi in self._unused(
                "name, count(*), sum(ns), min(ns), max(ns)", "GROUP BY name ORDER BY min(id)"):
            kind = self._kinds[name]
            out.append(WaitRecord(kind, calls, ns, None, idle_ns=None if idle is None
                                  else idle.get(("wait", kind), 0)))
            self.extremes[kind] = (lo, hi)
        return out


class _DeviceInOp:
    """The device time (ns) of the kernels, copies and memsets each cpu_op launched (through
    its runtime calls' correlation ids, to the innermost op around the call), summed once in
    the database (table `opdev`)."""

    def __init__(self, events: Events) -> None:
        self._events = events
        events.query("CREATE TABLE IF NOT EXISTS opdev (op INTEGER PRIMARY KEY, ns INT)")
        events.query(
            "INSERT OR REPLACE INTO opdev SELECT link.op, sum(d.ns) FROM ev AS d JOIN callof "
            f"ON callof.corr = d.corr JOIN link ON link.id = callof.call WHERE d.k >= {KERNEL} "
            "AND link.op IS NOT NULL GROUP BY link.op")

    def get(self, op: Event) -> int:
        row = self._events.query("SELECT ns FROM opdev WHERE op = ?", (op.id,)).fetchone()
        return row[0] if row is not None else 0


def et_note(joined: int, linked: int, copies: int, et_source: str) -> str:
    """The report's note on where producers came from, given an execution trace: `joined`
    copies have theirs from it, `linked` are in it (their op and the tensor they copied)."""
    unwritten, outside = linked - joined, copies - linked
    return (f"producers of {joined} of {copies} copies read from the execution trace "
            f"{et_source} by tensor ids"
            + (f"; {unwritten} more are in it, but not the op that wrote their data (data "
               "from Python, or made before it started)" if unwritten else "")
            + (f"; {outside} are not in it" if outside else "")
            + ("; those keep inferred producers (the kernel that ran before the copy on its "
               "stream; none for an upload)" if unwritten or outside else "")
            + "; consumers read from it where it shows an op reading the copy, else inferred "
            "(the op around the trigger; none for an upload)")


def _consumer(ops: list[Event], at: int, site: Site | None,
              device_in_op: _DeviceInOp) -> OpRef:
    """The op around the trigger's op (`aten::index` around `aten::nonzero`), inferred."""
    op = ops[at - 1]
    device = "cuda" if device_in_op.get(op) else "cpu"
    return OpRef(f"{op.name or ''} (inferred)", device, site)


def _meta(data: dict, source: str, has_python: bool, unpaired: int,
          first_us: float | None) -> Meta:
    props = data.get("deviceProperties") or [{}]
    name = props[0].get("name") if isinstance(props[0], dict) else None
    untraced = [INFERRED_NOTE, SITES_NOTE if has_python else NO_STACK_NOTE]
    if unpaired:  # a trace without syncs is complete unless one is missing where PyTorch
        # always makes one (memcpy_and_sync in _local_scalar_dense)
        untraced.append(f"the trace holds no stream syncs, though PyTorch makes one after each "
                        f"of its {unpaired} scalar reads (aten::_local_scalar_dense): its "
                        "runtime calls were filtered or sampled; those reads count as waited "
                        "for, their wait untimed, and other waits are not seen")
    dist = data.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    rank, size = dist.get("rank"), dist.get("world_size")
    ranked = type(rank) is int and type(size) is int and size > 1
    shared = {k: dist[k] for k in _RUN_WIDE if isinstance(dist.get(k), (str, int))}
    return Meta(device="cuda", simulated=False, device_name=name or UNRECORDED_DEVICE,
                device_profile=None, torch_version="", command=[], untraced=untraced,
                rank=rank if ranked else None, world_size=size if ranked else None,
                imported_from=source, started_ns=_started_ns(data, first_us),
                distributed=shared or None)


#: distributedInfo fields that every rank of one run has alike (pg_config, the process
#: groups a rank is in, may differ between ranks)
_RUN_WIDE = ("backend", "world_size", "nccl_version")
#: timestamps past this many microseconds are since the Unix epoch (2001 on), not relative
_EPOCH_US = 1e15


def _started_ns(data: dict, first_us: float | None) -> int | None:
    """When the trace's first event began, in ns since the Unix epoch: Kineto writes its
    timestamps relative to `baseTimeNanoseconds` where it writes that field, absolute (us
    since the epoch) before; None when neither holds."""
    if first_us is None:
        return None
    base = data.get("baseTimeNanoseconds")
    if type(base) is int and base > 0:
        return base + round(first_us * 1000)
    return round(first_us * 1000) if first_us >= _EPOCH_US else None


def _event_rows(events: Events, device_in_op: _DeviceInOp, copies: list[CopyRecord],
                per_call: dict[tuple, list[int]], waits: list[WaitRecord],
                extremes: dict[str, tuple[int, int]]) -> list[EventRow]:
    """The Event Summary: per cpu_op name (in the order each first comes), its calls, host
    and device time and the shortest and longest call; then the copies and waits."""
    if events.query(f"SELECT 1 FROM ev WHERE k = {OP} AND name = ? LIMIT 1",
                    (events.name_id(None),)).fetchone() is not None:
        raise KeyError("name")  # as reading the event's name raised
    names = events.names
    out = [EventRow(names[n], c, cpu, gpu, lo, hi) for n, c, cpu, gpu, lo, hi in events.query(
        "SELECT ev.name, count(*), sum(ev.ns), sum(ifnull(opdev.ns, 0)), min(ev.ns + "
        "ifnull(opdev.ns, 0)), max(ev.ns + ifnull(opdev.ns, 0)) FROM ev LEFT JOIN opdev ON "
        f"opdev.op = ev.id WHERE ev.k = {OP} GROUP BY ev.name ORDER BY min(ev.id)")]
    for (direction, sync), (lo, hi) in per_call.items():
        same = [c for c in copies if (c.direction, c.sync) == (direction, sync)]
        out.append(EventRow(copy_event_name(direction, sync), sum(c.calls for c in same),
                            sum(c.host_ns for c in same), sum(c.device_ns for c in same),
                            lo, hi))
    out += [EventRow(f"HostWait:{w.kind}", w.calls, w.wait_ns, 0, *extremes.get(w.kind, (0, 0)))
            for w in waits]
    return out


def load_any(path: str, et: ExecutionTrace | None = None) -> Trace:
    """A memcpy-doctor trace, or a torch.profiler trace read as one (with `et`, an execution
    trace of its run, joined to it); TraceError otherwise."""
    data = read_json(path)
    if is_kineto(data):
        return kineto_trace(data, path, et)
    if et is not None:
        raise TraceError(f"{path}: a memcpy-doctor trace: an execution trace goes with a "
                         "torch.profiler trace")
    try:
        return Trace.from_dict(data)
    except TraceError as e:
        raise TraceError(f"{path}: {e}") from None


def kineto_trace(data: dict, path: str, et: ExecutionTrace | None = None) -> Trace:
    """from_kineto, with what a malformed event raises turned into one TraceError line."""
    with one_line(path):
        return from_kineto(data, path, et)
