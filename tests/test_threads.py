"""Threads started while tracing are traced under their own modes, and their ops, copies and
waits are attributed to them; threads the tracer leaves behind keep working."""

from __future__ import annotations

import inspect
import queue
import threading

import torch

import memcpy_doctor
from memcpy_doctor.render.text import render_text
from memcpy_doctor.core.trace import Trace


def _line_of(marker: str, fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def _prefetching_program() -> float:
    q: queue.Queue = queue.Queue()

    def prefetch() -> None:
        g = torch.Generator().manual_seed(0)
        for _ in range(3):
            batch = torch.randn(8, 8, generator=g)
            q.put(batch.to("cuda"))  # prefetch-copy
        torch.cuda.synchronize()  # prefetch-wait

    worker = threading.Thread(target=prefetch, name="prefetcher")
    worker.start()
    total = 0.0
    for _ in range(3):
        total += (q.get() * 2).sum().item()  # main-read
    worker.join()
    return total


def test_a_prefetch_thread_is_traced_and_named():
    with memcpy_doctor.profiler(device="sim") as prof:
        got = _prefetching_program()
    g = torch.Generator().manual_seed(0)
    expected = sum(float((torch.randn(8, 8, generator=g) * 2).sum()) for _ in range(3))
    assert abs(got - expected) < 1e-4
    trace = prof.trace
    htod = [c for c in trace.copies if c.direction == "HtoD"]
    assert [(c.thread, c.calls, c.bytes, c.site.line) for c in htod] == [
        ("prefetcher", 3, 3 * 8 * 8 * 4, _line_of("prefetch-copy", _prefetching_program))]
    assert htod[0].producer.op == "aten::randn" and htod[0].consumer.op == "aten::mul"
    dtoh = [c for c in trace.copies if c.direction == "DtoH"]
    assert [(c.thread, c.trigger, c.calls) for c in dtoh] == [(None, "item", 3)]
    assert {(o.op, o.thread) for o in trace.ops} >= {("aten::randn", "prefetcher"),
                                                      ("aten::mul", None)}
    assert [(w.kind, w.thread, w.calls) for w in trace.waits] == [
        ("synchronize", "prefetcher", 1)]
    assert trace.meta.untraced == []
    report = render_text(trace)
    assert "Threads traced: the main thread and prefetcher" in report
    assert "[thread prefetcher]" in report
    again = Trace.from_dict(trace.to_dict())
    assert [c.thread for c in again.copies] == [c.thread for c in trace.copies]
    assert {o.thread for o in again.ops} == {None, "prefetcher"}


def test_a_thread_subclass_with_its_own_run_is_traced():
    class Worker(threading.Thread):
        def run(self) -> None:
            self.result = torch.ones(4, device="cuda").sum().item()

    with memcpy_doctor.profiler(device="sim") as prof:
        w = Worker(name="subclassed")
        w.start()
        w.join()
    assert w.result == 4.0
    assert "run" not in vars(w)  # the thread's own method again
    assert [(c.trigger, c.thread) for c in prof.trace.copies] == [("item", "subclassed")]


def test_a_thread_outliving_the_tracer_keeps_working_and_adds_nothing():
    go, done = threading.Event(), threading.Event()
    out = []

    def late() -> None:
        go.wait(10)
        out.append(float(torch.ones(3).sum()))  # after the tracer stopped
        done.set()

    with memcpy_doctor.profiler(device="sim") as prof:
        t = threading.Thread(target=late, name="late")
        t.start()
    ops_at_stop = len(prof.trace.ops)
    go.set()
    assert done.wait(10)
    t.join()
    assert out == [3.0]
    assert len(prof.trace.ops) == ops_at_stop
    assert all(o.thread is None for o in prof.trace.ops)


def test_a_thread_that_raises_leaves_no_tracer_behind():
    errors = []

    def bad() -> None:
        torch.ones(2, device="cuda")
        raise ValueError("boom")

    hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    try:
        with memcpy_doctor.profiler(device="sim") as prof:
            t = threading.Thread(target=bad, name="bad")
            t.start()
            t.join()
    finally:
        threading.excepthook = hook
    assert [str(e) for e in errors] == ["boom"]
    assert [(o.op, o.device, o.thread) for o in prof.trace.ops] == [
        ("aten::ones", "cuda:0", "bad")]
