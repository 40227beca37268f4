"""The table of live tensors' producers, both versions (compiled and Python): exact edges and
bytes, no tensor kept alive, no stale answer for a reused id, bounded size; and traces equal
whichever version the tracer used."""

from __future__ import annotations

import gc
import pathlib
import shutil
import sysconfig
import weakref

import pytest
import torch

import memcpy_doctor
from memcpy_doctor.tracer import collector, producers
from memcpy_doctor.tracer.producers import PyProducerTable

TABLES = [pytest.param(PyProducerTable, id="python"),
          pytest.param(producers.ProducerTable, id="compiled",
                       marks=pytest.mark.skipif(not producers.COMPILED,
                                                reason="the C extension is not built"))]


@pytest.fixture(params=TABLES)
def table_type(request):
    return request.param


class Op:
    """A stand-in producer (the tracer's are OpAggs): hashed by identity."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_write_then_get_names_the_producer(table_type):
    table, mm = table_type(), Op("mm")
    a, b = torch.zeros(4), torch.zeros(2)
    assert table.write((a,), mm, False) == 0
    assert table.get(a) is mm
    assert table.get(b) is None
    relu = Op("relu")
    table.write([a], relu, False)  # rewritten in place: one entry
    assert table.get(a) is relu
    assert len(table) == 1


def test_a_kernel_writes_and_reads_its_tensors_bytes(table_type):
    table, flows = table_type(), {}
    mm, view = Op("mm"), Op("view")
    a = torch.zeros(4)  # 16 bytes
    b = torch.zeros(2, 2, dtype=torch.float64)  # 32 bytes
    c = torch.zeros(8, dtype=torch.int8)  # 8 bytes, made by no traced op
    assert table.write((a,), mm, True) == 16
    assert table.write((b,), view, False) == 0  # its size is read when it is read
    assert table.read((a, b, c), flows, True) == 16 + 32 + 8
    assert flows == {mm: [1, 16], view: [1, 32]}
    assert table.read([a, c, a], flows, False) == 32  # c unknown: no bytes without a kernel
    assert flows == {mm: [3, 48], view: [1, 32]}


def test_the_table_keeps_no_tensor_alive(table_type):
    table, flows = table_type(), {}
    t = torch.zeros(3)
    table.write((t,), Op("mm"), True)
    table.read((t,), flows, True)
    ref = weakref.ref(t)
    del t
    assert ref() is None


def test_a_reused_id_is_not_taken_for_the_freed_tensor(table_type):
    table, mm = table_type(), Op("mm")
    seen, reused = set(), None
    for _ in range(10_000):
        t = torch.empty(1)
        if id(t) in seen:
            reused = t  # a new tensor at the address of one the table was told about
            break
        table.write((t,), mm, False)
        seen.add(id(t))
        del t
    if reused is None:
        pytest.skip("no id was reused")
    flows = {}
    assert table.get(reused) is None
    assert table.read((reused,), flows, False) == 0 and flows == {}
    table.write((reused,), Op("relu"), False)
    assert table.get(reused).name == "relu"


def test_many_tensors_are_each_found(table_type):
    table, ops = table_type(), [Op(str(i)) for i in range(3000)]
    tensors = [torch.empty(1) for _ in ops]
    for t, op in zip(tensors, ops):
        table.write((t,), op, False)
    assert all(table.get(t) is op for t, op in zip(tensors, ops))
    assert len(table) == 3000


def test_dead_entries_are_swept_so_the_table_stays_small(table_type):
    table = table_type(64) if table_type is PyProducerTable else table_type()
    live, others = [], []
    for i in range(20_000):
        t = torch.empty(1)
        table.write((t,), i, False)
        live.append(t)
        if len(live) > 10:
            live.pop(0)
            others.append(torch.empty(1))  # most likely where the freed one was: not reused
    assert all(table.get(t) == 19_990 + i for i, t in enumerate(live))
    assert all(table.get(t) is None for t in others)
    assert len(table) <= 130  # within a few times the 10 live tensors, not 20,000


def test_a_forgotten_tensor_has_no_producer_until_written_again(table_type):
    table, flows = table_type(), {}
    a, b = torch.zeros(4), torch.zeros(2)
    table.write((a,), Op("mm"), True)
    table.write((b,), Op("relu"), True)
    table.forget(a)
    table.forget(torch.zeros(1))  # never written: nothing to forget
    assert table.get(a) is None and table.get(b).name == "relu"
    assert table.read((a, b), flows, True) == 16 + 8  # a's bytes still count for a kernel
    assert [(op.name, edge) for op, edge in flows.items()] == [("relu", [1, 8])]
    table.write((a,), Op("add"), False)
    assert table.get(a).name == "add"


def test_a_tensor_rebound_to_untraced_data_loses_its_old_producer():
    """`p.data = t` where no traced op made t: p's data is no longer what its last op made."""
    col = collector.Collector()
    p, made, untraced = torch.zeros(2), torch.ones(2), torch.full((2,), 3.0)
    mm = Op("mm")
    col.set_producer(p, mm)
    col.set_producer(made, Op("relu"))
    col.rebind(made, p)
    assert col.producer_agg(p).name == "relu"
    col.rebind(untraced, p)
    assert col.producer_agg(p) is None


def test_clear_forgets_everything(table_type):
    table, t = table_type(), torch.zeros(1)
    table.write((t,), Op("mm"), False)
    table.clear()
    assert len(table) == 0 and table.get(t) is None
    table.write((t,), Op("add"), False)
    assert table.get(t).name == "add"


def test_a_cycle_through_the_table_is_collected(table_type):
    table, t = table_type(), torch.zeros(1)
    op = Op("mm")
    op.table = table  # the table holds op, op holds the table
    table.write((t,), op, False)
    ref = weakref.ref(op)
    del op, table
    gc.collect()
    assert ref() is None


def test_errors_reach_the_caller(table_type):
    table = table_type()

    class NoSize(torch.Tensor):
        @property
        def nbytes(self):
            raise RuntimeError("no size")

    odd = torch.zeros(2).as_subclass(NoSize)
    with pytest.raises(RuntimeError, match="no size"):
        table.write((odd,), Op("mm"), True)
    with pytest.raises(RuntimeError, match="no size"):
        table.read((odd,), {}, True)
    with pytest.raises(TypeError):
        table.write((3,), Op("mm"), False)  # not weakly referenceable


def test_a_sparse_tensor_counts_no_bytes(table_type):
    """A sparse tensor has no nbytes (it raises): the op is recorded with 0 bytes for it,
    rather than the program stopping."""
    table = table_type()
    sparse = torch.eye(3).to_sparse()
    assert table.write((sparse,), Op("to_sparse"), True) == 0
    assert table.read((sparse,), {}, True) == 0


def _can_compile() -> bool:
    """A C compiler and Python's headers: what building the extension needs."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = pathlib.Path(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which(compiler) is not None and headers.exists()


@pytest.mark.skipif(not _can_compile(),
                    reason="no C compiler or Python headers here: the Python table is used")
def test_the_compiled_table_is_built_where_a_compiler_is():
    assert producers.COMPILED, ("memcpy_doctor/tracer/_producers.c is not built: "
                                "`pip install -e .` builds it")
    assert collector.ProducerTable is producers.ProducerTable


def _workload() -> None:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                             batch_first=True, dropout=0.0)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    x = torch.randn(2, 4, 16, device="cuda")
    layer.to("cuda")
    for _ in range(3):
        loss = layer(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items()
                if not k.endswith(("_ns", "_ms")) and k not in ("summary", "command")}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


@pytest.mark.skipif(not producers.COMPILED, reason="the C extension is not built")
def test_both_tables_give_the_same_trace(monkeypatch):
    traces = []
    for table_type in (producers.ProducerTable, PyProducerTable):
        monkeypatch.setattr(collector, "ProducerTable", table_type)
        with memcpy_doctor.profiler(device="sim") as prof:
            _workload()
        traces.append(_without_times(prof.trace.to_dict()))
    compiled, python = traces
    assert compiled["flows"] and compiled["ops"] and compiled["copies"]
    for table in ("ops", "flows", "copies", "events"):
        assert compiled[table] == python[table], table
