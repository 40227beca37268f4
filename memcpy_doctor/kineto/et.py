"""Exact producers and consumers for the copies of a torch.profiler (Kineto) trace, from an
execution trace of the same run (`torch.profiler.ExecutionTraceObserver`'s JSON, "ET").

A Kineto trace says which kernel ran before a copy on its stream, not which tensor the copy
read, so kineto/reader.py can only guess a copy's producer. The ET records every op's input and
output tensors by id; joined to the Kineto trace, it says which op made the copied data:

- the join: each ET node's `rf_id` attribute is the RecordFunction handle, which the Kineto
  trace writes on its `cpu_op` events as `args["Record function id"]` (PyTorch's
  execution_trace_observer.cpp writes `fn.handle()`; HTA's `correlate_execution_trace` and
  Chakra's trace linker join on the same ids). A Kineto trace recorded without an ET has 0
  there, older ones nothing;
- a tensor in the ET is `[tensor_id, storage_id, offset, numel, itemsize, device]`, in a node's
  `inputs`/`outputs` (`values` beside `types` from schema 1.0.2-chakra.0.0.4 on; `inputs`
  beside `input_types` in 1.0.1), also inside `GenericList[...]` and `Tuple[...]` values.
  Ids are given per object address, so a freed storage's id comes back for the next storage
  at that address; node ids are given as ops start, so they order the accesses;
- the copied tensor: an input of the op that made the copy (the innermost op around it that
  has one on the copy's source side; `aten::copy_`'s `src`), read through its storage id, so a
  view (`y[0].item()`) meets the op that wrote its base;
- the producer: the op that last wrote that storage before the copy's op started: an output
  whose storage no input has (a new result), or one an op changes in place (`(a!)` in its
  schema, else a name ending in `_`); a view's output is not a write. It is named as the
  outermost op around the writer the user called (`aten::matmul`, not its `aten::mm`), short
  of the ops around the copy itself (inside `aten::allclose`, its `aten::all`);
- the consumer: the op that first read the copy's output (the trigger op's output on the
  destination side; none for `item()`, whose output is a Python number) after the copy's op,
  named the same way (up to the outermost op), or none when the storage was next allocated
  anew.

The ET's nodes are kept as rows of a temporary SQLite database (EtNodes, as the events are
in kineto/events.py): the node, its tensors, the storages it writes and touches, so that memory
does not grow with the ET. Parsed JSON in (or its nodes as a stream parses them), OpRefs out;
errors a user can cause are TraceError with one line.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

from .events import CACHE_KIB, OP, Event, as_events, require_store, sqlite3, to_records
from .frames import user_frame
from .stacks import Enclosing
from ..core.trace import OpRef, TraceError

#: A tensor in an ET: (tensor id, storage id, on the host).
Tensor = tuple[int, int, bool]
_SIDE_HOST = {"HtoD": True, "DtoH": False, "DtoD": False}  # where a copy's source is


class EtNode:
    """One op (or label: a record_function range, a thread) of an execution trace; equal to
    another record of the same node (its id)."""

    __slots__ = ("id", "name", "parent", "rf", "is_op", "ins", "outs")

    def __init__(self, id: int, name: str, parent: int, rf: int, is_op: bool,
                 ins: list[Tensor], outs: list[Tensor]) -> None:
        self.id, self.name, self.parent, self.rf, self.is_op = id, name, parent, rf, is_op
        self.ins, self.outs = ins, outs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EtNode) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


class ExecutionTrace:
    """An execution trace read for joining: its nodes by id (`nodes`) and by rf_id
    (`by_rf`), and each storage's accesses in the order the ops started (writes; and reads
    or writes, for consumers). The nodes are rows of a temporary SQLite database (EtNodes
    writes them, as the events' store is: kineto/events.py), each made an EtNode when
    asked for, so that memory does not grow with the ET."""

    def __init__(self, source: str, schema: str, pid: int | None, db: Any,
                 names: list[str]) -> None:
        self.source, self.schema, self.pid = source, schema, pid
        self._db, self._names = db, names
        self._count = db.execute("SELECT count(*) FROM node").fetchone()[0]
        self.nodes = _Nodes(self)
        self.by_rf = _ByRf(self)

    def node(self, row: tuple | None) -> EtNode | None:
        """The EtNode of a row of table `node` (id, seq, name, parent, rf, is_op)."""
        if row is None:
            return None
        id_, seq, name, parent, rf, is_op = row
        ins: list[Tensor] = []
        outs: list[Tensor] = []
        for out, tid, storage, host in self._db.execute(
                "SELECT out, tid, storage, host FROM tensor WHERE seq = ? ORDER BY rowid",
                (seq,)):
            (outs if out else ins).append((tid, storage, bool(host)))
        return EtNode(id_, self._names[name], parent, rf, bool(is_op), ins, outs)

    def rf_names(self) -> Iterator[tuple[int, str]]:
        """(rf_id, name) of each node by_rf has, in rf_id order, one at a time."""
        last = None
        for rf, name in self._db.execute("SELECT rf, name FROM node WHERE rf > 0 "
                                         "ORDER BY rf, id DESC, seq DESC"):
            if rf != last:
                last = rf
                yield rf, self._names[name]

    def ancestors(self, node: EtNode) -> list[EtNode]:
        """The nodes around `node`, innermost first, up to (not including) the root."""
        out: list[EtNode] = []
        cur = node
        while len(out) <= self._count:  # a malformed ET's cycle ends here
            parent = self.nodes.get(cur.parent)
            if parent is None or parent.id == cur.id:
                break
            out.append(parent)
            cur = parent
        return out

    def outermost_op(self, node: EtNode, stop: set[int] = frozenset()) -> EtNode:
        """The outermost op around `node` reached through ops only (a record_function
        label or a thread ends the walk), not entering the nodes in `stop`."""
        top = node
        for parent in self.ancestors(node):
            if not parent.is_op or parent.id in stop:
                break
            top = parent
        return top

    def producer(self, reader: EtNode, storage: int) -> EtNode | None:
        """The op that last wrote `storage` before `reader` started, as the outermost op
        around it that is not around `reader` too; None when the ET shows no such write."""
        around: set[int] | None = None
        for (nid,) in self._db.execute("SELECT node FROM write WHERE storage = ? AND node < ? "
                                       "ORDER BY node DESC, rowid DESC", (storage, reader.id)):
            if around is None:
                around = {a.id for a in self.ancestors(reader)}
            if nid not in around:
                return self.outermost_op(self.nodes[nid], around)
        return None

    def consumer(self, op: EtNode, storage: int) -> EtNode | None:
        """The outermost op around the first op outside `op` to read `storage` after `op`
        started; None when no op read it before it was allocated anew (or at all)."""
        for nid, read in self._db.execute("SELECT node, read FROM touch WHERE storage = ? AND "
                                          "node > ? ORDER BY node, rowid", (storage, op.id)):
            node = self.nodes[nid]
            if op in self.ancestors(node):
                continue  # the copy's own op and those inside it
            return self.outermost_op(node) if read else None
        return None


class _Lookup:
    """ET nodes by a key (id, or rf_id), read from the ET's database as asked for: `_SQL`
    selects the node of a key, None where a key cannot be one (`_valid`)."""

    _SQL = ""

    def __init__(self, et: ExecutionTrace) -> None:
        self._et = et

    def _valid(self, key: Any) -> bool:
        return type(key) is int

    def get(self, key: Any, default: Any = None) -> EtNode | None:
        if not self._valid(key):
            return default
        node = self._et.node(self._et._db.execute(self._SQL, (key,)).fetchone())
        return default if node is None else node

    def __getitem__(self, key: Any) -> EtNode:
        node = self.get(key)
        if node is None:
            raise KeyError(key)
        return node

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None


class _Nodes(_Lookup):
    """An ET's nodes by id (ExecutionTrace.nodes)."""

    _SQL = "SELECT id, seq, name, parent, rf, is_op FROM node WHERE id = ?"

    def __len__(self) -> int:
        return self._et._count

    def values(self) -> Iterator[EtNode]:
        """Every node, by id (one at a time)."""
        for row in self._et._db.execute(f"SELECT {_NODE} FROM node ORDER BY id"):
            yield self._et.node(row)


class _ByRf(_Lookup):
    """An ET's nodes by RecordFunction handle (rf_id > 0; the last node with one, by id)."""

    _SQL = ("SELECT id, seq, name, parent, rf, is_op FROM node WHERE rf = ? "
            "ORDER BY id DESC, seq DESC LIMIT 1")

    def _valid(self, key: Any) -> bool:
        return type(key) is int and key > 0


_NODE = "id, seq, name, parent, rf, is_op"
_ET_TABLES = (
    "CREATE TABLE node (id INTEGER PRIMARY KEY, seq INT, name INT, parent INT, rf INT, "
    "is_op INT)",
    "CREATE TABLE tensor (seq INT, out INT, tid INT, storage INT, host INT)",
    "CREATE TABLE write (storage INT, node INT)",
    "CREATE TABLE touch (storage INT, node INT, read INT)",
)
_ET_INDEXES = ("CREATE INDEX node_rf ON node(rf)", "CREATE INDEX tensor_seq ON tensor(seq)",
               "CREATE INDEX write_at ON write(storage, node)",
               "CREATE INDEX touch_at ON touch(storage, node)")


def parse_execution_trace(data: Any, source: str) -> ExecutionTrace:
    """An ExecutionTrace from the parsed JSON of an ExecutionTraceObserver file; TraceError,
    one line, when it is not an ET, or holds no tensor ids (kineto.read_execution_trace
    reads the file, as a stream into EtNodes where it can)."""
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise TraceError(f"{source}: not an execution trace (no `nodes` list; record one with "
                         "torch.profiler.ExecutionTraceObserver)")
    nodes = EtNodes()
    nodes.read(data["nodes"])
    return nodes.trace(data, source)


class EtNodes:
    """An ET's nodes read one at a time (as the stream parses them, kineto/stream.py
    read_array), each written at once as rows of a temporary SQLite database: the node, its
    tensors, and the storages it writes and touches (reads, or writes anew); `trace` makes
    the ExecutionTrace once the other members (schema, pid) are known."""

    def __init__(self) -> None:
        require_store("an execution trace")
        self.seen = 0
        self._db = sqlite3.connect("", isolation_level=None)
        self._db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        self._db.execute("PRAGMA journal_mode = OFF")
        for table in _ET_TABLES:
            self._db.execute(table)
        self._found: Counter = Counter()  # "ids": tensors with ids, "bare": tensors without
        self._names: list[str] = []  # name number -> the op's name
        self._name_ids: dict[str, int] = {}
        self._error: Exception | None = None

    def read(self, elements: Any) -> None:
        """Keep each node of `elements`; the first one that cannot be read is kept as an
        error, raised by `trace` (which knows the schema its message names)."""
        rows: dict[str, list[tuple]] = {"node": [], "tensor": [], "write": [], "touch": []}
        db = self._db
        db.execute("BEGIN")
        try:
            for x in elements:
                self.seen += 1
                if self._error is not None:
                    continue
                try:
                    node, mutates = _node(x, self._found)
                except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                    self._error = e
                    continue
                self._rows(node, mutates, rows)
                if len(rows["tensor"]) >= 4096 or len(rows["node"]) >= 4096:
                    self._write(rows)
            self._write(rows)
        finally:
            db.execute("COMMIT")

    def _rows(self, n: EtNode, mutates: bool, rows: dict[str, list[tuple]]) -> None:
        """The rows of one node: a new result is written (and touched) in a storage no input
        has; an input changed in place (copy_, add_, out=) is written; every input's storage
        is touched by a read."""
        name = self._name_ids.get(n.name)
        if name is None:
            name = self._name_ids[n.name] = len(self._names)
            self._names.append(n.name)
        rows["node"].append((n.id, self.seen, name, n.parent, n.rf, n.is_op))
        rows["tensor"] += [(self.seen, 0, t, s, h) for t, s, h in n.ins]
        rows["tensor"] += [(self.seen, 1, t, s, h) for t, s, h in n.outs]
        read = {s for _, s, _ in n.ins}
        rows["touch"] += [(s, n.id, 1) for s in sorted(read)]
        mine = {t for t, _, _ in n.ins}
        for t, s, _ in n.outs:
            if s not in read:  # a new result, in a storage no input has
                rows["write"].append((s, n.id))
                rows["touch"].append((s, n.id, 0))
            elif t in mine and mutates:  # changed in place (copy_, add_, out=)
                rows["write"].append((s, n.id))

    def _write(self, rows: dict[str, list[tuple]]) -> None:
        db = self._db
        db.executemany("INSERT OR REPLACE INTO node VALUES (?, ?, ?, ?, ?, ?)", rows["node"])
        db.executemany("INSERT INTO tensor VALUES (?, ?, ?, ?, ?)", rows["tensor"])
        db.executemany("INSERT INTO write VALUES (?, ?)", rows["write"])
        db.executemany("INSERT INTO touch VALUES (?, ?, ?)", rows["touch"])
        for kept in rows.values():
            kept.clear()

    def trace(self, members: dict, source: str) -> ExecutionTrace:
        """The ExecutionTrace of the nodes read, given the file's other top-level members;
        TraceError, one line, when a node could not be read or no tensor has an id."""
        schema = str(members.get("schema", "?"))
        pid = members.get("pid") if type(members.get("pid")) is int else None
        if self._error is not None:
            e = self._error
            raise TraceError(f"{source}: an execution trace (schema {schema}) this version "
                             f"cannot read ({type(e).__name__}: {e})") from None
        if not self._found["ids"]:
            why = ("its tensors are not [tensor_id, storage_id, offset, numel, itemsize, "
                   "device]" if self._found["bare"] else "no op in it has a tensor")
            raise TraceError(f"{source}: an execution trace (schema {schema}) without tensor "
                             f"ids ({why}): no producers can be read from it")
        for index in _ET_INDEXES:
            self._db.execute(index)
        return ExecutionTrace(source, schema, pid, self._db, self._names)


def _node(x: dict, found: Counter) -> tuple[EtNode, bool]:
    """One node, of either layout: schema 1.0.2-chakra.0.0.4 and later (`ctrl_deps`, `inputs`
    as {values, shapes, types}, `attrs`), or 1.0.1 (`parent`, flat fields); and whether it
    changes an input in place (`(a!)` in its schema; without one, a name such as add_)."""
    if isinstance(x.get("inputs"), dict):
        attrs = {a["name"]: a.get("value") for a in x.get("attrs", [])}
        parent, ins, outs = x["ctrl_deps"], x["inputs"], x["outputs"]
        ins = _tensors(ins["values"], ins["types"], found)
        outs = _tensors(outs["values"], outs["types"], found)
    else:
        attrs, parent = x, x["parent"]
        ins = _tensors(x.get("inputs", []), x.get("input_types", []), found)
        outs = _tensors(x.get("outputs", []), x.get("output_types", []), found)
    name, schema, rf = str(x["name"]), attrs.get("op_schema"), attrs.get("rf_id")
    has_schema = isinstance(schema, str) and bool(schema)
    node = EtNode(int(x["id"]), name, int(parent), rf if type(rf) is int else 0,
                  has_schema if isinstance(schema, str) else "::" in name, ins, outs)
    mutates = "!" in schema if has_schema else name.endswith("_") and not name.endswith("__")
    return node, mutates


def _tensors(values: Any, types: Any, found: Counter) -> list[Tensor]:
    """The tensors among a node's values, with their types beside them."""
    out: list[Tensor] = []
    for value, kind in zip(values, types):
        _collect(value, kind, out, found)
    return out


def _collect(value: Any, kind: Any, out: list[Tensor], found: Counter) -> None:
    if not isinstance(kind, str):
        return
    if kind.startswith("Tensor"):
        if (isinstance(value, list) and len(value) == 6 and isinstance(value[5], str)
                and all(type(v) is int for v in value[:5])):
            found["ids"] += 1
            if value[1]:  # storage 0: a tensor without storage
                out.append((value[0], value[1], value[5].startswith("cpu")))
        else:
            found["bare"] += 1
    elif kind.startswith(("GenericList[", "Tuple[")) and isinstance(value, list):
        for v, k in zip(value, _split(kind[kind.index("[") + 1:-1])):
            _collect(v, k, out, found)


def _split(inner: str) -> list[str]:
    """"Tensor(float),GenericList[Int,Int]" -> its element types, split at the top level."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    return parts + [inner[start:]]


class EtJoin:
    """An ET joined to one Kineto trace: per copy, its producer and consumer by data flow.

    TraceError when the two are not of the same run: the Kineto trace has no record function
    ids (recorded without an ExecutionTraceObserver), or they name different ops."""

    def __init__(self, et: ExecutionTrace, events: Any, found: Enclosing,
                 source: str) -> None:
        self.et, self.found = et, found
        events = self._events = as_events(events)
        # the Kineto cpu_ops the ET has (rf_id -> the op's id): the two sides read in rf order
        # and merged, kept in the events' database (table etop), the last op of each rf's
        db = events.db
        db.execute("DROP TABLE IF EXISTS temp.etop")  # (another ET joined to these events)
        db.execute("CREATE TEMP TABLE etop (rf INTEGER PRIMARY KEY, op INT)")
        ids = same = differ = 0
        names, matched = events.names, []
        in_et = et.rf_names()
        at = next(in_et, None)
        for id_, rf, name in db.execute(f"SELECT id, rf, name FROM ev WHERE k = {OP} AND "
                                        "typeof(rf) = 'integer' AND rf > 0 ORDER BY rf, id"):
            ids += 1
            while at is not None and at[0] < rf:
                at = next(in_et, None)
            if at is not None and at[0] == rf:
                if at[1] == names[name]:
                    same += 1
                    matched.append((rf, id_))
                else:
                    differ += 1
            if len(matched) >= 4096:
                db.executemany("INSERT OR REPLACE INTO etop VALUES (?, ?)", matched)
                matched.clear()
        db.executemany("INSERT OR REPLACE INTO etop VALUES (?, ?)", matched)
        if not ids:  # PyTorch numbers RecordFunctions only while an ET observer is on
            raise TraceError(f"{source}: its ops carry no record function ids, so it cannot be "
                             f"joined to {et.source} (it was recorded without an "
                             "ExecutionTraceObserver: pass one to torch.profiler.profile)")
        if not same or differ > same:
            raise TraceError(f"{et.source}: not of the same run as {source} (of the {ids} "
                             f"record function ids on {source}'s ops, {same} are the same op "
                             f"in {et.source}, {differ} another op, {ids - same - differ} "
                             "not there)")
        self.linked = 0  # copies whose op the ET has, with the tensor they copied
        self.joined = 0  # ... and whose producer came from the ET

    def ends(self, ops: list[Any], at: int, direction: str) -> tuple[OpRef | None,
                                                                    OpRef | None] | None:
        """(producer, consumer) of a copy made inside `ops` (the cpu_ops around its runtime
        call, outermost first, as records or parsed dicts; `at`: its trigger's index), by
        data flow; either is None where the ET does not show it. None when the copy's ops
        are not in the ET."""
        if at < 0:
            return None
        ops = to_records(ops)
        src = None
        for op in reversed(ops[at:]):  # the innermost op that has the source as an input
            node = self._node(op)
            if node is not None:
                src = _source(node, _SIDE_HOST[direction])
                if src is not None:
                    break
        if src is None:
            return None
        self.linked += 1
        made = self.et.producer(node, src[1])
        producer = self._ref(made, src[2]) if made is not None else None
        self.joined += producer is not None
        consumer = None
        trigger = self._node(ops[at])
        dst = next((t for t in trigger.outs if t[2] == (direction == "DtoH")),
                   None) if trigger is not None else None
        if dst is not None:
            read = self.et.consumer(trigger, dst[1])
            consumer = self._ref(read, dst[2]) if read is not None else None
        return producer, consumer

    def _op_id(self, rf: Any) -> int | None:
        """The id of the Kineto cpu_op with record function id `rf` the ET has; None."""
        if type(rf) is not int:
            return None
        row = self._events.db.execute("SELECT op FROM etop WHERE rf = ?", (rf,)).fetchone()
        return row[0] if row is not None else None

    def _node(self, op: Event) -> EtNode | None:
        rf = op.rf
        return self.et.by_rf.get(rf) if self._op_id(rf) is not None else None

    def _ref(self, node: EtNode, host: bool) -> OpRef:
        op = self._events.get(self._op_id(node.rf))
        site = user_frame(self.found.op_sites(op)) if op is not None else None
        return OpRef(node.name, "cpu" if host else "cuda", site)


def _source(node: EtNode, host: bool) -> Tensor | None:
    """The tensor a copy made in `node` read: `src` of a copy_, else the first input on the
    copy's source side (the host for an upload, the device otherwise)."""
    if node.name.endswith("::copy_"):
        return node.ins[1] if len(node.ins) > 1 else None
    return next((t for t in node.ins if t[2] == host), None)
