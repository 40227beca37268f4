"""The simulated GPU's storage marks: the compiled core (_marks.c) and its Python version give
the same answers: marked storages by identity, forgotten when torch frees them, and their bytes
(memory_allocated and its peak) exact."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import memcpy_doctor
from memcpy_doctor.tracer.sim import device as sim_device
from memcpy_doctor.tracer.sim import marks


class PyStorageMarks(marks._PyMarksCore):
    """StorageMarks over the Python core, as an install without a C compiler has it."""

    __slots__ = ()
    has, add, discard = marks.StorageMarks.has, marks.StorageMarks.add, marks.StorageMarks.discard


def _compiled() -> type:
    try:
        from memcpy_doctor.tracer.sim._marks import MarksCore
    except ImportError:
        pytest.skip("the compiled marks were not built (no C compiler at install)")
    assert issubclass(marks.StorageMarks, MarksCore)
    return marks.StorageMarks


@pytest.fixture(params=["compiled", "python"])
def marks_type(request) -> type:
    return _compiled() if request.param == "compiled" else PyStorageMarks


def test_bytes_of_marked_storages_and_their_peak(marks_type):
    table = marks_type()
    a, b = torch.zeros(100), torch.zeros(25)  # 400 and 100 bytes
    table.add(a.untyped_storage())
    table.add(b.untyped_storage())
    table.add(a.untyped_storage())  # already marked: counted once
    assert (table.allocated, table.peak, len(table.refs)) == (500, 500, 2)
    assert table.has(a.untyped_storage()) and not table.has(torch.zeros(1).untyped_storage())
    del a
    gc.collect()
    assert (table.allocated, table.peak, len(table.refs)) == (100, 500, 1)
    table.discard(b.untyped_storage())
    assert (table.allocated, table.peak, len(table.refs)) == (0, 500, 0)
    table.peak = table.allocated  # what reset_peak_memory_stats() does
    c = torch.zeros(50)
    table.add_new(c.untyped_storage(), id(c.untyped_storage()))
    assert (table.allocated, table.peak) == (200, 200)
    assert not table.has(None)


def test_a_view_shares_its_storage_mark(marks_type):
    table = marks_type()
    a = torch.zeros(10)
    table.add(a.untyped_storage())
    view = a[2:5]
    del a
    gc.collect()
    assert table.has(view.untyped_storage()) and table.allocated == 40
    del view
    gc.collect()
    assert table.allocated == 0 and not table.refs


def _instances(cls: type) -> int:
    gc.collect()
    return sum(type(o) is cls for o in gc.get_objects())


def test_no_storage_is_kept_alive_and_the_table_is_collected(marks_type):
    before = _instances(marks_type)
    table = marks_type()
    a = torch.zeros(4)
    storage = a.untyped_storage()
    table.add(storage)
    alive = weakref.ref(storage)
    del a, storage
    gc.collect()
    assert alive() is None and table.allocated == 0
    b = torch.zeros(4)
    table.add(b.untyped_storage())
    assert _instances(marks_type) == before + 1
    del table  # a storage that outlives its table frees without a callback into it
    assert _instances(marks_type) == before
    del b
    gc.collect()


def test_an_address_reused_by_a_new_storage_is_not_marked(marks_type):
    table = marks_type()
    for _ in range(200):  # the allocator hands freed addresses out again
        t = torch.zeros(8)
        storage = t.untyped_storage()
        assert not table.has(storage)
        table.add(storage)
        del t, storage
    gc.collect()
    assert table.allocated == 0 and not table.refs


def test_the_drop_callback_refuses_other_references():
    table = _compiled()()
    with pytest.raises(TypeError):
        table._drop(weakref.ref(torch.zeros(1).untyped_storage()))
    with pytest.raises(TypeError):
        table.add_new(torch.zeros(1).untyped_storage())


@pytest.mark.parametrize("core", ["compiled", "python"])
def test_memory_allocated_on_the_simulated_gpu(core, monkeypatch):
    if core == "compiled":
        _compiled()
    else:
        monkeypatch.setattr(sim_device, "StorageMarks", PyStorageMarks)
    with memcpy_doctor.profiler(device="sim"):
        x = torch.zeros(1000, device="cuda")  # 4,000 bytes
        y = x * 2
        z = y[:10]  # a view: no new bytes
        assert (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()) == (8000, 8000)
        del y
        assert torch.cuda.memory_allocated() == 8000  # the view keeps y's storage
        del z
        gc.collect()
        assert (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()) == (4000, 8000)
        torch.cuda.reset_peak_memory_stats()
        w = x.sum()  # 4 bytes
        assert torch.cuda.max_memory_allocated() == 4004
        assert w.is_cuda and not torch.zeros(3).is_cuda


def test_inputs_and_mark_outputs_as_the_per_op_path_asks(marks_type):
    table = marks_type()
    a, b = torch.zeros(4), torch.zeros(2)
    sparse = torch.zeros(3).to_sparse()  # no storage: never marked
    table.mark_outputs([a, a[1:], sparse])  # a view of a marked storage adds nothing
    assert (table.allocated, len(table.refs)) == (16, 1)
    assert table.inputs((a, b, sparse, a[:2])) == [True, False, False, True]
    assert table.inputs([]) == []
    table.mark_outputs((b,))
    assert table.inputs([b]) == [True] and table.allocated == table.peak == 24
    with pytest.raises(TypeError):
        table.inputs(5)
