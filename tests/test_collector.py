"""The collector's aggregates: what the per-op path keeps per op, and what a trace gets from it."""

from __future__ import annotations

import inspect

import torch

import memcpy_doctor
from memcpy_doctor.core.trace import OpRef
from memcpy_doctor.tracer.collector import NO_CALL_YET, EventAgg, OpAgg


def _agg() -> OpAgg:
    return OpAgg(OpRef("aten::relu", "cpu", None), EventAgg())


def test_fold_adds_the_kept_times_to_the_counters():
    agg = _agg()
    agg.times.extend([300, 100, 200])
    agg.fold()
    assert (agg.calls, agg.host_ns, agg.run_ns, agg.device_ns) == (3, 600, 600, 0)
    assert (agg.min_ns, agg.max_ns) == (100, 300)
    assert agg.times == []


def test_fold_keeps_what_the_counters_held():
    agg = _agg()
    agg.calls, agg.host_ns, agg.run_ns, agg.min_ns, agg.max_ns = 2, 1000, 1000, 400, 600
    agg.times.extend([500, 700])
    agg.fold()
    assert (agg.calls, agg.host_ns, agg.run_ns) == (4, 2200, 2200)
    assert (agg.min_ns, agg.max_ns) == (400, 700)
    agg.times.append(50)
    agg.fold()
    assert (agg.calls, agg.host_ns, agg.min_ns, agg.max_ns) == (5, 2250, 50, 700)


def test_fold_of_nothing_changes_nothing():
    agg = _agg()
    agg.fold()
    assert (agg.calls, agg.host_ns, agg.run_ns, agg.min_ns, agg.max_ns) == (0, 0, 0, NO_CALL_YET, 0)


def test_a_host_op_called_past_the_fold_length_counts_every_call():
    calls = 3 * OpAgg.FOLD_AT + 5  # folded three times on the way, the rest at the end
    x = torch.ones(8)
    with memcpy_doctor.profiler(device="sim") as prof:
        for _ in range(calls):
            x.relu()
    (op,) = [o for o in prof.trace.ops if o.op == "aten::relu"]
    (row,) = [e for e in prof.trace.events if e.name == "aten::relu"]
    assert (op.calls, op.device, op.device_ns) == (calls, "cpu", 0)
    assert op.run_ns == op.host_ns == row.cpu_ns
    assert row.calls == calls
    assert 0 < row.min_ns <= op.host_ns / calls <= row.max_ns <= op.host_ns


def _line_of(marker: str, fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def _rebound():
    x = torch.randn(4, 4)
    a = torch.mm(x, x)  # 64 bytes
    a.data = torch.zeros(16, 16)  # rebind: 1024 bytes
    a.relu()  # reads-rebound
    c = torch.mm(x, x)
    c.resize_(8, 8)  # 256 bytes, in place
    c.relu()  # reads-resized


def test_bytes_read_follow_a_tensor_rebound_or_resized_after_its_kernel():
    """The per-op path keeps the size of a kernel's output; a rebind (`.data =`) or an
    in-place resize makes the size it reads the tensor's new one."""
    with memcpy_doctor.profiler(device="sim") as prof:
        _rebound()
    lines = {line: _line_of(f"reads-{line}", _rebound) for line in ("rebound", "resized")}
    relu = {o.site.line: o.bytes for o in prof.trace.ops if o.op == "aten::relu"}
    assert relu == {lines["rebound"]: 2 * 1024, lines["resized"]: 2 * 256}
    into = {(f.producer.op, f.bytes) for f in prof.trace.flows
            if f.consumer.op == "aten::relu"}
    assert into == {("aten::zeros", 1024), ("aten::resize_", 256)}


def test_tensors_inside_list_arguments_are_inputs_and_int_lists_are_not():
    """cat reads a Tensor[]; index a Tensor?[] whose first entry is None; a view's sizes are
    an int[]: each op's edges come from the ops that made the tensors it read."""
    with memcpy_doctor.profiler(device="sim") as prof:
        x = torch.ones(4, 4, device="cuda")  # 64 bytes
        a, b = torch.mm(x, x), torch.mm(x, x)
        torch.cat([a, b])
        rows = torch.arange(2, device="cuda")  # 16 bytes
        # (a[:, rows] as aten makes it; the indexing itself slices first on torch 2.6)
        torch.ops.aten.index.Tensor(a, [None, rows])
        a.view([16])
    into = {(f.producer.op, f.consumer.op): (f.calls, f.bytes) for f in prof.trace.flows
            if f.consumer.op in ("aten::cat", "aten::index", "aten::view")}
    assert into == {("aten::mm", "aten::cat"): (2, 128), ("aten::mm", "aten::index"): (1, 64),
                    ("aten::arange", "aten::index"): (1, 16), ("aten::mm", "aten::view"): (1, 64)}


def test_copies_of_one_path_are_one_record_though_filed_by_identity():
    """The collector files a copy path under the ids of its Site and OpRef objects (their
    hashes run Python code); equal paths made of distinct objects are one record at the end,
    with the counts of both and the first call's stack and place on the line."""
    from memcpy_doctor.core.trace import Site
    from memcpy_doctor.tracer.collector import Collector

    col = Collector()

    def copy(site_obj: Site, producer: OpRef, at_ns: int, end_col: int) -> None:
        col.copy(direction="DtoH", sync=True, pinned=False, trigger="item", nbytes=4,
                 host_ns=100, device_ns=10, site=site_obj, stack=[site_obj],
                 producer=producer, dst=None, shape=[], dtype="float32", at_ns=at_ns,
                 end_col=end_col)

    site = Site("/w/train.py", 9, "main")
    sum_at_7 = OpRef("aten::sum", "cuda:0", Site("/w/train.py", 7, "main"))
    copy(Site("/w/train.py", 9, "main"), sum_at_7, 2000, 30)
    copy(site, OpRef("aten::sum", "cuda:0", Site("/w/train.py", 7, "main")), 1000, 20)
    copy(site, OpRef("aten::sum", "cuda:0", Site("/w/train.py", 7, "main")), 3000, 20)
    copy(site, OpRef("aten::mean", "cuda:0", site), 4000, 20)  # another producer
    assert len(col.copies) == 4  # filed apart: each OpRef here is a distinct object
    records = sorted(col.copy_records(), key=lambda c: c.producer.op, reverse=True)
    assert [(c.producer.op, c.calls, c.bytes, c.host_ns, c.device_ns, c.first_ns, c.last_ns,
             c.end_col) for c in records] == [("aten::sum", 3, 12, 300, 30, 1000, 3000, 20),
                                              ("aten::mean", 1, 4, 100, 10, 4000, 4000, 20)]
